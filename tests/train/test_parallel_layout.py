"""What `parallelize` does to each parameter under FSDP2: trainable weights become fp32 master shards
(DTensors); frozen ones are stored once in param_dtype, whole on one rank and with
parallel.replicate_frozen, sharded otherwise (checked on two gloo processes)."""

import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.train.parallel import ParallelDims, build_mesh, parallelize


def _parallelized(mesh, replicate_frozen: bool):
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=2)
    set_trainable(model, train_text_pathway=False)
    knobs = SimpleNamespace(activation_checkpointing="none", compile=False, param_dtype="bfloat16", reduce_dtype="float32",
                            reshard_after_forward=True, replicate_frozen=replicate_frozen, prefetch_layers=1)
    parallelize(model, mesh, SimpleNamespace(parallel=knobs))
    frozen = [p for p in model.parameters() if not p.requires_grad]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert frozen and trainable
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in trainable)  # fp32 master shards
    assert all(p.dtype == torch.bfloat16 for p in frozen)  # stored once, in the compute dtype
    return frozen


@pytest.mark.parametrize("replicate_frozen", [False, True])
def test_one_rank_leaves_frozen_weights_whole_in_bf16(one_process_group, replicate_frozen):
    frozen = _parallelized(one_process_group, replicate_frozen)
    assert not any(isinstance(p, DTensor) for p in frozen)  # nothing to shard over: never gathered, never copied


def _two_rank_worker(rank: int, store_dir: str, replicate_frozen: bool) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=2)
    try:
        frozen = _parallelized(build_mesh(ParallelDims(1, 2), torch.device("cpu")), replicate_frozen)
        sharded = [isinstance(p, DTensor) for p in frozen]
        assert all(sharded) if not replicate_frozen else not any(sharded)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("replicate_frozen", [False, True])
def test_two_ranks_shard_frozen_weights_unless_replicated(tmp_path, replicate_frozen):
    mp.spawn(_two_rank_worker, args=(str(tmp_path), replicate_frozen), nprocs=2, join=True)


