"""torch.distributed for wamkit: process-group setup under torchrun, the (dp_replicate, dp_shard, cp)
device mesh, and one `parallelize()` that applies activation checkpointing, per-layer compile and
FSDP2 to a plain model. Parallelism never leaks into model code.

Launch: `torchrun --nproc-per-node=N -m wamkit.cli train RECIPE` (multi-node: add torchrun's
`--nnodes`, `--node-rank`, `--rdzv-endpoint`; set parallel.data_parallel_replicate_degree to the
node count for HSDP)."""

from __future__ import annotations

import contextlib
import functools

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from wamkit.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    cp: int = 1  # context parallel: ranks that split one packed sequence's tokens (wamkit.train.context_parallel)

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: the ranks of a cp group share their samples."""
        return self.dp_replicate * self.dp_shard

    def dp_rank(self, rank: int) -> int:
        """The data-parallel rank of a global rank (mesh order: cp is the innermost dimension)."""
        return rank // self.cp


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | torch.device = "auto") -> DistContext:
    """Join the torchrun process group when there is one; a plain run is world size 1. `device` goes
    through wamkit.device.resolve_device (auto: the rank's LOCAL_RANK GPU when there is one)."""
    from wamkit.device import resolve_device

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device)
    if dev.type == "cuda":
        if world > 1:  # one GPU per rank, whatever index was asked for
            dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None)
    return DistContext(rank, world, local_rank, dev)


def parallel_dims(cfg, world_size: int) -> ParallelDims:
    replicate = cfg.parallel.data_parallel_replicate_degree
    cp = int(getattr(cfg.parallel, "context_parallel_degree", 1))
    if cp < 1 or world_size % cp:
        raise ConfigError("parallel.context_parallel_degree", f"{cp} does not divide the world size {world_size}",
                          "use a divisor of the GPU count (e.g. 4 of 8: two data-parallel groups of 4), or 1")
    if replicate < 1 or (world_size // cp) % replicate:
        raise ConfigError(
            "parallel.data_parallel_replicate_degree", f"{replicate} does not divide the data-parallel size "
            f"{world_size // cp} (world {world_size} / context parallel {cp})",
            "use the number of nodes (HSDP: replicate across nodes, shard inside a node) or 1",
        )
    return ParallelDims(replicate, world_size // cp // replicate, cp)


def build_mesh(dims: ParallelDims, device: torch.device):
    """("dp_replicate", "dp_shard", "cp"), cp innermost (a cp group on neighbouring GPUs of one node),
    plus "dp_shard_cp", the flattened FSDP dimension: parameters shard over dp_shard x cp."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dims.dp_replicate, dims.dp_shard, dims.cp),
                            mesh_dim_names=("dp_replicate", "dp_shard", "cp"))
    mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    return mesh


def checkpoint_mlps(model: torch.nn.Module) -> int:
    """Selective activation checkpointing: recompute both pathways' MLPs in the backward pass. Their
    gate/up/product intermediates (3x the width each) are most of a layer's saved activations, while
    attention, whose recompute costs the most per byte saved, keeps its activations. The forward is
    wrapped per instance, so parameter names (and checkpoints) do not change."""
    from torch.utils.checkpoint import checkpoint

    wrapped = 0
    for layer in model.layers:
        for mlp in (layer.mlp, layer.mlp_moe_gen):
            mlp.forward = functools.partial(checkpoint, mlp.forward, use_reentrant=False)
            wrapped += 1
    return wrapped


def parallelize(model: torch.nn.Module, mesh, cfg) -> torch.nn.Module:
    """Activation checkpointing, then compile, then FSDP2 per decoder layer and at the root.

    Parameters are kept in fp32 (the master copy the optimizer updates); compute runs in
    `parallel.param_dtype` and gradients are reduced in `parallel.reduce_dtype`. Frozen parameters
    are sharded like the rest but never enter the optimizer, so they cost no optimizer memory."""
    p = cfg.parallel
    if p.activation_checkpointing == "full":
        model.enable_gradient_checkpointing()
    elif p.activation_checkpointing == "selective":
        checkpoint_mlps(model)
    elif p.activation_checkpointing != "none":
        raise ConfigError("parallel.activation_checkpointing", f"{p.activation_checkpointing!r} is not supported",
                          "use 'none', 'selective' or 'full'")
    if p.compile:
        for layer in model.layers:
            layer.compile(dynamic=False)
    if mesh is None:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=DTYPES[p.param_dtype], reduce_dtype=DTYPES[p.reduce_dtype])
    fsdp_mesh = mesh["dp_replicate", "dp_shard_cp"] if mesh["dp_replicate"].size() > 1 else mesh["dp_shard_cp"]
    replicate_frozen = bool(getattr(p, "replicate_frozen", False))
    for layer in model.layers:
        fully_shard(layer, mesh=fsdp_mesh, mp_policy=mp, reshard_after_forward=p.reshard_after_forward,
                    ignored_params=_frozen(layer, DTYPES[p.param_dtype]) if replicate_frozen else None)
    fully_shard(model, mesh=fsdp_mesh, mp_policy=mp, reshard_after_forward=p.reshard_after_forward,
                ignored_params=_frozen(model, DTYPES[p.param_dtype]) if replicate_frozen else None)
    prefetch_layers(list(model.layers), int(getattr(p, "prefetch_layers", 0) or 0))
    return model


def _frozen(module: torch.nn.Module, dtype: torch.dtype) -> set[torch.nn.Parameter]:
    """The module's frozen parameters, cast to the compute dtype: FSDP2 leaves them whole on every
    rank (never gathered) and does not cast them, and nothing needs an fp32 master copy of them."""
    frozen = {q for q in module.parameters() if not q.requires_grad}
    for q in frozen:
        q.data = q.data.to(dtype)
    return frozen


def prefetch_layers(layers: list, n: int) -> None:
    """Issue the all-gathers of the next n layers (forward) / previous n layers (backward) early,
    instead of relying on the CPU running far enough ahead of the GPU."""
    if n <= 0:
        return
    for i, layer in enumerate(layers):
        layer.set_modules_to_forward_prefetch(layers[i + 1 : i + 1 + n])
        layer.set_modules_to_backward_prefetch(layers[max(0, i - n) : i][::-1])


def compute_precision(cfg, mesh, device: torch.device):
    """FSDP2 casts to `parallel.param_dtype` under torchrun; a single-process CUDA run gets the same
    bf16 compute over fp32 master weights from autocast."""
    if mesh is None and device.type == "cuda" and cfg.parallel.param_dtype == "bfloat16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def all_reduce_mean(value: float, ctx: DistContext) -> float:
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.item() / ctx.world_size


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()
