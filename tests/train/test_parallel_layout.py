"""What `parallelize` does to each parameter under FSDP2 (one gloo process): trainable weights become
sharded DTensors; with parallel.replicate_frozen the frozen ones stay plain tensors in param_dtype."""

import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.train.parallel import ParallelDims, build_mesh, parallelize


@pytest.fixture
def one_process_group(tmp_path):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield build_mesh(ParallelDims(1, 1), torch.device("cpu"))
    dist.destroy_process_group()


@pytest.mark.parametrize("replicate_frozen", [False, True])
def test_frozen_weights_are_sharded_or_replicated(one_process_group, replicate_frozen):
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=2)
    set_trainable(model, train_text_pathway=False)
    knobs = SimpleNamespace(activation_checkpointing="none", compile=False, param_dtype="bfloat16", reduce_dtype="float32",
                            reshard_after_forward=True, replicate_frozen=replicate_frozen, prefetch_layers=1)
    parallelize(model, one_process_group, SimpleNamespace(parallel=knobs))
    frozen = [p for p in model.parameters() if not p.requires_grad]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert frozen and trainable
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in trainable)  # fp32 master shards
    if replicate_frozen:
        assert not any(isinstance(p, DTensor) for p in frozen) and all(p.dtype == torch.bfloat16 for p in frozen)
    else:
        assert all(isinstance(p, DTensor) for p in frozen)
