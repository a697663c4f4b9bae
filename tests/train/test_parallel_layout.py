"""What `parallelize` does to each parameter under FSDP2 (one gloo process): trainable weights become
sharded DTensors; with parallel.replicate_frozen the frozen ones stay plain tensors in param_dtype."""

from types import SimpleNamespace

import pytest
import torch
from torch.distributed.tensor import DTensor

from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.train.parallel import parallelize


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
