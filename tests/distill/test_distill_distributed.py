"""Distillation under torchrun: 2 gloo processes (FSDP2 on CPU) with 2 samples each give the losses of
one process with 4, for TF-dCM (stage 2) and SF-DMD (stage 3: critic and student turns, multi-chunk
rollouts with a random exit step); the sharded checkpoint resumes in one process."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.bimanual.tiny import recipe, tiny_overrides
from tests.helpers import REPO
from wamkit.distill import DistillTrainer, load_distill_recipe
from wamkit.train.metrics import read_metrics


def _overrides(chain, stage, name, iters, per_rank, extra, dtype="float32"):
    bundle, runs, _, stage1 = chain  # stage 3's student may start from any completed iteration dir
    pairs = tiny_overrides(bundle, runs, name, iters, stage1, extra={"trainer.samples_per_step": per_rank, "parallel.param_dtype": f'"{dtype}"', **extra})
    return [a for kv in pairs for a in ("--set", kv)]


def _distill(args, nproc):
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    cmd = [sys.executable, *launcher, "-m", "wamkit.cli", "distill", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _losses(run_dir):
    return [(r["role"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl")]


# bf16 (the recipes' dtype): the forwards are the same, but each rank's partial gradient is rounded to
# bf16 before the fp32 reduce, and Adam turns those roundings into weight differences of a few % of one
# update (lr 1e-4 x 2 steps: measured 2e-5 at most); a different batch or noise moves them by ~1e-4.
@pytest.mark.parametrize("stage,iters,dtype,weight_atol", [(2, 2, "float32", 1e-6), (3, 6, "float32", 1e-6), (2, 2, "bfloat16", 5e-5)])
def test_two_processes_distill_like_one(chain, stage, iters, dtype, weight_atol):
    bundle, runs, stage0, stage1 = chain
    name = f"{stage}-{dtype}"
    extra = ({"distill.teacher_path": f'"{stage1}"'} if stage == 2
             else {"distill.reference_path": f'"{stage0}"', "distill.critic_path": f'"{stage0}"'})
    two = _distill([str(recipe(stage)), *_overrides(chain, stage, f"two-{name}", iters, 2, extra, dtype)], nproc=2)
    assert "world size 2, global batch 4" in two.stdout
    _distill([str(recipe(stage)), *_overrides(chain, stage, f"one-{name}", iters, 4, extra, dtype)], nproc=1)
    got, want = _losses(runs / f"two-{name}"), _losses(runs / f"one-{name}")
    assert [r for r, _ in got] == [r for r, _ in want] and len(got) == iters
    if stage == 3:
        assert {r for r, _ in got} == {"critic", "student"}
    torch.testing.assert_close(torch.tensor([l for _, l in got]), torch.tensor([l for _, l in want]), rtol=1e-5 if dtype == "bfloat16" else 1e-4, atol=1e-6)

    # the 2-process checkpoint resumes in one process: student, EMA and (stage 3) critic restored
    cfg, dcfg = load_distill_recipe(recipe(stage), [a for a in _overrides(chain, stage, f"two-{name}", iters + 1, 2, extra, dtype) if a != "--set"])
    resumed = DistillTrainer(cfg, dcfg)
    assert "at step %d" % iters in resumed.resume() and resumed.step == iters
    single = DistillTrainer(*load_distill_recipe(recipe(stage), [a for a in _overrides(chain, stage, f"one-{name}", iters + 1, 4, extra, dtype) if a != "--set"]))
    single.resume()
    for (key, a), (_, b) in zip(resumed.student.state_dict().items(), single.student.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-4 if dtype == "float32" else 0, atol=weight_atol, msg=key)
    for key in single.ema.shadow:
        torch.testing.assert_close(resumed.ema.shadow[key], single.ema.shadow[key], rtol=1e-4 if dtype == "float32" else 0, atol=weight_atol, msg=key)
