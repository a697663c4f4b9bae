"""Exact resume after SIGKILL, and atomic checkpoint saves; the stacks a SIGTERM leaves."""

import faulthandler
import io
import json
import os
import signal
import subprocess
import sys
import time

from tests.helpers import DEMO_RECIPE, REPO, quick_overrides, run_cli
from wamkit.train.checkpoint import latest_checkpoint
from wamkit.train.faults import KILL_AFTER_SAVE, KILL_DURING_SAVE
from wamkit.train.stack_dump import dump_stacks_on_sigterm


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "loss" in line]


def test_sigkill_then_resume_reproduces_the_uninterrupted_loss_sequence(demo_root, tmp_path):
    n = 6
    run_cli(["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "straight", 2 * n, n)])
    args = ["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "killed", 2 * n, n)]
    killed = run_cli(args, env={KILL_AFTER_SAVE: str(n)}, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert latest_checkpoint(tmp_path / "killed" / "checkpoints").name == f"iter_{n:09d}"
    resumed = run_cli(args)
    assert f"resumed" in resumed.stdout and f"at step {n}" in resumed.stdout
    straight, interrupted = _losses(tmp_path / "straight"), _losses(tmp_path / "killed")
    assert len(straight) == len(interrupted) == 2 * n
    assert straight == interrupted  # bit-identical on CPU


def test_sigkill_during_save_leaves_latest_on_the_previous_complete_checkpoint(demo_root, tmp_path):
    args = ["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "crash_in_save", 6, 3)]
    crashed = run_cli(args, env={KILL_DURING_SAVE: "6"}, check=False)
    assert crashed.returncode == -signal.SIGKILL
    checkpoints = tmp_path / "crash_in_save" / "checkpoints"
    assert latest_checkpoint(checkpoints).name == "iter_000000003"
    assert list(checkpoints.glob(".tmp_iter_000000006")), "the killed save left its partial files in a temp dir"
    assert not (checkpoints / "iter_000000006").exists()
    resumed = run_cli(args)
    assert "at step 3" in resumed.stdout
    assert latest_checkpoint(checkpoints).name == "iter_000000006"
    assert not list(checkpoints.glob(".tmp_*"))


def test_resuming_a_run_name_with_another_recipe_is_refused(demo_root, tmp_path):
    args = ["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "same_name", 3, 3)]
    run_cli(args)
    changed = run_cli(args + ["--set", "optimizer.lr=0.5"], check=False)
    assert changed.returncode == 2
    assert "optimizer.lr" in changed.stderr and "job.name" in changed.stderr
    longer = run_cli(args + ["--set", "trainer.max_iter=5"])  # extending a run is allowed
    assert "at step 3" in longer.stdout


def test_an_8bit_adamw_run_resumes_exactly(demo_root, tmp_path):
    """optimizer.kind = "adamw8bit" (torchao's block-wise 8-bit moments) saves its state through DCP
    and a resumed run continues bit for bit; its moments really are 8-bit."""
    n, kind = 3, ["--set", 'optimizer.kind="adamw8bit"']
    run_cli(["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "straight8", 2 * n, n), *kind])
    args = ["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "killed8", 2 * n, n), *kind]
    assert run_cli(args, env={KILL_AFTER_SAVE: str(n)}, check=False).returncode == -signal.SIGKILL
    assert "at step 3" in run_cli(args).stdout
    assert _losses(tmp_path / "straight8") == _losses(tmp_path / "killed8")


def test_adamw8bit_keeps_8bit_moments_for_large_matrices():
    import torch

    from wamkit.config.schema import OptimizerConfig
    from wamkit.train.optim import build_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.LayerNorm(64))
    opt = build_optimizer(model, OptimizerConfig(kind="adamw8bit"))
    model(torch.randn(4, 128)).sum().backward()
    opt.step()
    state = opt.state[model[0].weight]
    assert type(state["exp_avg"]).__name__ == "OptimState8bit" and state["exp_avg"].codes.dtype == torch.uint8


def test_a_training_job_killed_by_sigterm_prints_where_each_thread_was(demo_root, tmp_path):
    """A job stopped from outside (scheduler time limit, `timeout`) leaves its stacks in the log: a hang's
    only trace (a sweep's run went silent in validation on 2026-12-06 and was killed with nothing said)."""
    args = ["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "terminated", 100000, 100000)]
    proc = subprocess.Popen([sys.executable, "-m", "wamkit.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    metrics = tmp_path / "terminated" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # still terminated, as without the dump
    assert "most recent call first" in err and "trainer.py" in err, err[-3000:]


def test_the_stack_dump_falls_back_to_the_original_stderr_when_stderr_has_no_file_descriptor(monkeypatch):
    """`wamkit train` run in-process under a captured stream (as the CLI tests do) must not fail on faulthandler's fileno()."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    try:
        assert dump_stacks_on_sigterm() is (sys.__stderr__ is not None)
        monkeypatch.setattr(sys, "__stderr__", io.StringIO())
        assert dump_stacks_on_sigterm() is False
    finally:
        faulthandler.unregister(signal.SIGTERM)
