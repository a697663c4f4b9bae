"""The optimizer step, clipping and EMA on FSDP2's local shards (wamkit.train.local_shards) compute what torch's
own AdamW, clip_grad_norm_ and a DTensor lerp compute, on one rank and (the norm) over two sharded ranks."""

import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.train.ema import EMA
from wamkit.train.local_shards import LocalShardAdamW, clip_grad_norm_, local
from wamkit.train.parallel import ParallelDims, build_mesh, parallelize


def _sharded_model(mesh):
    torch.manual_seed(0)
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=2)
    set_trainable(model, train_text_pathway=False)
    knobs = SimpleNamespace(activation_checkpointing="none", compile=False, param_dtype="bfloat16", reduce_dtype="float32",
                            reshard_after_forward=True, replicate_frozen=False, prefetch_layers=0)
    return parallelize(model, mesh, SimpleNamespace(parallel=knobs))


def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def _set_grads(model, seed: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in _trainable(model):
        values = torch.randn(p.shape, generator=g) * scale
        p.grad = distribute_tensor(values, p.device_mesh, p.placements) if isinstance(p, DTensor) else values


def _groups(model):
    params = _trainable(model)
    return [{"params": params[::2], "lr": 1e-3, "weight_decay": 0.1}, {"params": params[1::2], "lr": 5e-3, "weight_decay": 0.0}]


def test_adamw_on_local_shards_matches_torchs_adamw_on_the_dtensors(one_process_group):
    ours_model = _sharded_model(one_process_group)
    torch_model = _sharded_model(one_process_group)
    assert isinstance(_trainable(ours_model)[0], DTensor)
    ours = LocalShardAdamW(_groups(ours_model), betas=(0.9, 0.95), eps=1e-8, fused=True)
    theirs = torch.optim.AdamW(_groups(torch_model), betas=(0.9, 0.95), eps=1e-8, fused=True)
    before = [local(p).clone() for p in _trainable(ours_model)]
    for step in range(3):
        for model in (ours_model, torch_model):
            _set_grads(model, seed=step, scale=1e-2)
        ours.step()
        theirs.step()
    for a, b, start in zip(_trainable(ours_model), _trainable(torch_model), before):
        assert torch.equal(local(a), local(b)) and not torch.equal(local(a), start)
    for a, b in zip(_trainable(ours_model), _trainable(torch_model)):
        sa, sb = ours.state[a], theirs.state[b]
        assert isinstance(sa["exp_avg"], DTensor)  # state stays what DCP saves
        assert torch.equal(local(sa["exp_avg_sq"]), local(sb["exp_avg_sq"])) and torch.equal(sa["step"], sb["step"])


@pytest.mark.parametrize("scale", [1e-4, 1.0])  # below the limit (untouched) and far above it (scaled down)
def test_clipping_on_local_shards_matches_torchs_on_the_dtensors(one_process_group, scale):
    ours_model = _sharded_model(one_process_group)
    torch_model = _sharded_model(one_process_group)
    for model in (ours_model, torch_model):
        _set_grads(model, seed=7, scale=scale)
    norm = clip_grad_norm_(_trainable(ours_model), 1.0)
    expected = torch.nn.utils.clip_grad_norm_(_trainable(torch_model), 1.0).full_tensor()
    assert not isinstance(norm, DTensor)
    torch.testing.assert_close(norm, expected, rtol=1e-5, atol=0)
    for a, b in zip(_trainable(ours_model), _trainable(torch_model)):
        torch.testing.assert_close(local(a.grad), local(b.grad), rtol=1e-5, atol=1e-9)


def test_gradients_of_mixed_layouts_are_clipped_by_torchs_own_path(one_process_group):
    from torch.distributed.tensor import Replicate

    mesh = one_process_group["dp_shard_cp"]
    whole = [torch.full((4, 2), 2.0), torch.full((3,), 4.0)]
    params = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [placement])) for w, placement in zip(whole, (Shard(0), Replicate()))]
    for p, w in zip(params, whole):
        p.grad = distribute_tensor(w.clone(), mesh, p.placements)
    norm = clip_grad_norm_(params, 1.0)
    assert not isinstance(norm, DTensor)
    torch.testing.assert_close(norm, torch.sqrt(torch.tensor(8 * 4.0 + 3 * 16.0)))
    torch.testing.assert_close(local(params[1].grad), whole[1] / (norm + 1e-6))


def test_the_ema_on_local_shards_averages_like_a_lerp_of_the_dtensors(one_process_group):
    model = _sharded_model(one_process_group)
    ema = EMA(model, beta=0.9, warmup=0)
    with torch.no_grad():
        for p in _trainable(model):
            p.add_(1.0)
    ema.update(model, step=1000)
    for name, p in model.named_parameters():
        if p.requires_grad:
            shadow = ema.shadow[name]
            assert isinstance(shadow, DTensor)
            torch.testing.assert_close(local(shadow), local(p) - 0.9, rtol=0, atol=1e-6)  # 0.9 * (p - 1) + 0.1 * p


def _two_rank_norm(rank: int, store_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=2)
    try:
        mesh = build_mesh(ParallelDims(1, 2), torch.device("cpu"))["dp_shard_cp"]
        whole = [torch.arange(12.0).reshape(6, 2), torch.full((4,), 3.0)]
        params = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(0)])) for w in whole]
        for p, w in zip(params, whole):
            p.grad = distribute_tensor(w.clone(), mesh, [Shard(0)])
        norm = clip_grad_norm_(params, 1.0)
        expected = torch.sqrt(sum(w.square().sum() for w in whole))
        torch.testing.assert_close(norm, expected)  # both ranks' shards, not this rank's alone
        for p, w in zip(params, whole):
            torch.testing.assert_close(p.grad.full_tensor(), w / (expected + 1e-6))
    finally:
        dist.destroy_process_group()


def test_the_clipping_norm_sums_every_ranks_shard(tmp_path):
    mp.spawn(_two_rank_norm, args=(str(tmp_path),), nprocs=2, join=True)
