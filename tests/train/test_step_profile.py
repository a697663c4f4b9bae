"""WAMKIT_PROFILE_STEPS: warm training steps under torch.profiler, summarised by the function that
issued their ops, with a chrome trace beside metrics.jsonl."""

import json
import re

import pytest

from tests.helpers import train_tiny_run
from wamkit.train import step_profile


def test_profiled_steps_are_summarised_by_issuing_function(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(step_profile.ENV, "2")
    run = train_tiny_run(tmp_path, "profiled")
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "[wamkit] profile of" in line or "per step:" in line]
    assert lines and "profile of steps 2-3 (2 steps)" in lines[0] and "no GPU kernels (CPU run)" in lines[0]
    assert re.search(r"\[wamkit\]   wamkit/\S+\.py:\w+ +\d+ /", out)  # ops attributed to wamkit's own functions
    assert "diffusers/models/transformers/transformer_cosmos3.py:forward" in out
    trace = run / "profile_steps_2-3.json"
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4  # training went on


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(step_profile.ENV, "three")
    with pytest.raises(ValueError, match="WAMKIT_PROFILE_STEPS"):
        step_profile.requested_steps()


def test_a_profile_longer_than_the_run_ends_with_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(step_profile.ENV, "10")
    run = train_tiny_run(tmp_path, "short")  # 4 steps: steps 2-4 profiled
    assert "profile of steps 2-4 (3 steps)" in capsys.readouterr().out
    assert (run / "profile_steps_2-4.json").is_file()


def test_ops_are_attributed_by_time_without_parent_links():
    """Python 3.12's profiler events reach no Python frame through cpu_parent: the innermost frame around
    an op's start, on its own thread, names it; an op outside every frame (another thread) is "(other)"."""
    from types import SimpleNamespace as NS

    def event(name, start, end, thread=1):
        return NS(name=name, thread=thread, cpu_parent=None, time_range=NS(start=start, end=end))

    outer = event("/site-packages/wamkit/train/trainer.py(10): train_step", 0, 100)
    inner = event("/site-packages/wamkit/diffusion/objective.py(20): _uniform_step", 10, 40)
    in_inner, after_inner, elsewhere = event("aten::randn", 12, 13), event("aten::add", 50, 51), event("aten::mm", 12, 13, thread=2)
    torch_own = event("torch/nn/modules/module.py(1): _call_impl", 60, 70)
    in_torch_own = event("aten::mul", 61, 62)
    events = [after_inner, outer, elsewhere, in_inner, inner, torch_own, in_torch_own]
    sites = step_profile.sites_by_time(events, lambda e: e.name.startswith("aten::"))
    assert sites[id(in_inner)] == "wamkit/diffusion/objective.py:_uniform_step"
    assert sites[id(after_inner)] == "wamkit/train/trainer.py:train_step"
    assert sites[id(in_torch_own)] == "wamkit/train/trainer.py:train_step"  # torch's frames are skipped
    assert sites[id(elsewhere)] == "(other)"
