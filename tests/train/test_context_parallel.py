"""Context parallelism on CPU (gloo, 2 processes): the same loss and gradients as one unsplit
sequence for packed samples of uneven lengths, bidirectional and block-causal, dense and per-sample
attention; `wamkit train` at CP=2 composed with FSDP2 equals one process and resumes at CP=1."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.bimanual.tiny import recipe, tiny_overrides
from tests.helpers import DEMO_RECIPE, REPO, quick_overrides, run_cli, train_in_process
from wamkit.config import load_experiment
from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import build_transformer
from wamkit.model.attention import hold_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.packing import SequenceSample, pack_samples
from wamkit.train.context_parallel import enable_context_parallel
from wamkit.train.parallel import parallel_dims

CHANNELS, ACTION_DIM = 8, 6


def _samples(chunk_frames: int) -> list[SequenceSample]:
    """Three samples of different text, video and action lengths (odd totals: the shards get padding)."""
    g = torch.Generator().manual_seed(1)
    shapes = [(5, 3, 4, 4), (9, 2, 4, 6), (2, 4, 2, 4)]  # text tokens, latent t, h, w
    out = []
    for i, (n_text, t, h, w) in enumerate(shapes):
        rows = 4 * (t - 1)
        out.append(SequenceSample(
            text_ids=torch.randint(1, 200, (n_text,), generator=g).tolist(), video=torch.randn(CHANNELS, t, h, w, generator=g),
            actions=torch.randn(rows, ACTION_DIM, generator=g), clean_video_frames=[0], clean_action_rows=list(range(rows)) if i else [],
            sigma=0.3 + 0.2 * i, causal_chunk_frames=chunk_frames))
    return out


def _loss_and_grads(model, processor, batch) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    hold_layout(processor, batch)
    out = model(**batch.forward_kwargs)
    loss = sum((p.float() ** 2).mean() for p in out.sample) + sum((a.float() ** 2).mean() for a in out.action)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _worker(rank: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        for backend in ("sdpa", "per_sample"):
            for chunk_frames in (0, 1):  # stage 0 (bidirectional), stages 1-3 (block-causal)
                torch.manual_seed(0)
                model = build_transformer("tiny", CHANNELS, ACTION_DIM, 4)
                batch = pack_samples(_samples(chunk_frames), model.config)
                ref_loss, ref_grads = _loss_and_grads(model, install_packed_attention(model, backend), batch)
                cp = enable_context_parallel(model, install_packed_attention(model, backend), dist.group.WORLD)
                loss, grads = _loss_and_grads(model, cp, batch)
                model._cp_shard_fn = model._cp_gather_fn = None
                where = f"{backend}, chunk_frames={chunk_frames}"
                torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6, msg=where)
                assert set(grads) == set(ref_grads), where
                for name, grad in grads.items():  # the cp group together holds cp x the gradient (FSDP averages it back)
                    dist.all_reduce(grad)
                    torch.testing.assert_close(grad / 2, ref_grads[name], rtol=1e-4, atol=1e-6, msg=f"{where}: {name}")
    finally:
        dist.destroy_process_group()


def test_cp2_matches_unsplit_loss_and_gradients(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "init"),), nprocs=2, join=True)


def _losses(run_dir):
    return [json.loads(l)["loss"] for l in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]


def test_train_cp2_with_fsdp_equals_one_process_and_resumes_at_cp1(demo_root, tmp_path):
    """`wamkit train` with 2 ranks x CP 2 (one data-parallel group, FSDP2 over both) trains like one
    process with the same global batch, and its sharded checkpoint resumes in one process at CP 1
    exactly as a one-process run resumes its own (same max_iter history: it shapes the schedule)."""
    cp2 = quick_overrides(demo_root, tmp_path, "cp2", 2, 2) + ["--set", "parallel.context_parallel_degree=2"]
    one = quick_overrides(demo_root, tmp_path, "one", 2, 2)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "wamkit.cli",
           "train", str(DEMO_RECIPE), *cp2]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "world size 2 (context parallel 2), global batch 4" in proc.stdout
    train_in_process([str(DEMO_RECIPE), *one])
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "cp2")), torch.tensor(_losses(tmp_path / "one")), rtol=1e-4, atol=1e-5)

    resumed = run_cli(["train", str(DEMO_RECIPE), *cp2, "--set", "parallel.context_parallel_degree=1", "--set", "trainer.max_iter=4"])
    assert "at step 2" in resumed.stdout and "world size 1," in resumed.stdout
    train_in_process([str(DEMO_RECIPE), *one, "--set", "trainer.max_iter=4"])
    expected = _losses(tmp_path / "one")
    assert len(expected) == 4
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "cp2")), torch.tensor(expected), rtol=1e-4, atol=1e-5)


def test_bad_degrees_are_refused(tmp_path):
    cfg = load_experiment(recipe(1), tiny_overrides(tmp_path, tmp_path, "x", 1, extra={"parallel.context_parallel_degree": 4}))
    with pytest.raises(ConfigError, match="context_parallel_degree.*does not divide the world size 2"):
        parallel_dims(cfg, 2)
    dims = parallel_dims(cfg, 8)
    assert (dims.dp_replicate, dims.dp_shard, dims.cp, dims.dp_size, dims.dp_rank(5)) == (1, 2, 4, 2, 1)
    with pytest.raises(ConfigError, match="context_parallel_degree"):
        load_experiment(recipe(1), tiny_overrides(tmp_path, tmp_path, "x", 1, extra={"parallel.context_parallel_degree": 0}))
