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
    from_trace = step_profile.trace_by_function(events)  # what Python 3.12 hosts print: the same sites
    assert from_trace["diffusers/models/transformers/transformer_cosmos3.py:forward"][0] > 0
    assert any(site.startswith("wamkit/") and n > 0 for site, (n, _, _) in from_trace.items())
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


def test_the_trace_attributes_ops_by_time_to_the_innermost_wamkit_frame():
    """Python 3.12's profiler events hold no Python frames; the exported trace does. The innermost wamkit or
    diffusers frame around an op's start, on its own thread, names it; ops nested in ops count once; torch's
    frames inside ours are skipped; outside ours, the autograd node being evaluated names an op, else the innermost
    torch frame, else it is "(other)"."""
    def span(cat, name, ts, dur, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}

    events = [
        span("python_function", "/site-packages/wamkit/train/trainer.py(10): train_step", 0, 100),
        span("python_function", "/site-packages/wamkit/diffusion/objective.py(20): _uniform_step", 10, 30),
        span("cpu_op", "aten::randn", 12, 2), span("cpu_op", "aten::empty", 12.5, 0.5),  # nested: not counted
        span("cuda_runtime", "cudaLaunchKernel", 13, 0.5),
        span("cpu_op", "aten::add", 50, 5),
        span("python_function", "torch/nn/modules/module.py(1): _call_impl", 60, 10), span("cpu_op", "aten::mul", 61, 1),
        span("cpu_op", "autograd::engine::evaluate_function: MulBackward0", 70, 3, tid=2), span("cpu_op", "aten::mm", 70, 3, tid=2),
        span("cuda_runtime", "cudaLaunchKernel", 71, 0.5, tid=2),
        span("python_function", "/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_state.py(80): _pre_forward", 200, 10),
        span("cpu_op", "aten::copy_", 201, 2), span("cpu_op", "aten::zeros", 300, 1),
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0},
    ]
    by_site = step_profile.trace_by_function(events)
    assert by_site["wamkit/diffusion/objective.py:_uniform_step"] == [1, 1, 0.002]
    assert by_site["wamkit/train/trainer.py:train_step"][:2] == [2, 0]  # aten::add and, past torch's frame, aten::mul
    assert by_site["(backward) MulBackward0"][:2] == [1, 1]
    assert by_site["torch/distributed/fsdp/_fully_shard/_fsdp_state.py:_pre_forward"][:2] == [1, 0]
    assert by_site["(other)"][:2] == [1, 0]  # aten::zeros, outside every frame and node
    lines = step_profile.by_function_lines(by_site, steps=1)
    assert "wamkit/train/trainer.py:train_step" in lines[0] and len(lines) == 5


def test_a_rollout_profile_reads_its_table_from_a_trace_where_the_events_hold_no_frames(monkeypatch, capsys):
    """Python 3.12 (the GPU host): the profiler's events carry no Python frames, so the rollout profile exports a
    trace and prints the by-function table from it, naming the wamkit function that issued the ops."""
    import torch

    from wamkit.diffusion.keyed_noise import keyed_normals

    monkeypatch.setenv(step_profile.ROLLOUTS_ENV, "1")
    monkeypatch.setattr(step_profile, "has_frames", lambda events: False)
    profiler = step_profile.RolloutProfile.start(torch.device("cpu"))
    keyed_normals([1, 2], (64,), 0, torch.device("cpu"))
    profiler.finish(1, "a test rollout")
    out = capsys.readouterr().out
    assert "by function, from the trace (ops / launches / host ms in those ops, a predict)" in out
    assert re.search(r"wamkit/diffusion/keyed_noise\.py:\w+ +\d+ /", out)


def test_gpu_busy_time_counts_kernels_not_the_annotation_spans_around_them():
    """On the GPU the profiler also records each `record_function` range (AdamW's step, FSDP2's pre_forward) as a
    device-side span from its first kernel to its last, idle gaps included: busy time counts the kernels alone."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def gpu(name, us, annotation=False):
        return SimpleNamespace(name=name, device_type=DeviceType.CUDA, is_user_annotation=annotation, cpu_parent=None,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [gpu("Optimizer.step#AdamW.step", 29_000, annotation=True), gpu("FSDP::pre_forward", 10_000, annotation=True),
              gpu("multi_tensor_apply_kernel", 400), gpu("flex_attention_backward", 7_600)]
    assert [e.name for e in step_profile.gpu_kernels(events)] == ["multi_tensor_apply_kernel", "flex_attention_backward"]
    first = step_profile.summary_lines(events, steps=1, wall_s=0.1, label="steps 1-1")[0]
    assert "GPU kernels busy 8.0 ms (8%): host-bound" in first
