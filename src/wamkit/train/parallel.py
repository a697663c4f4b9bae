"""torch.distributed for wamkit: process-group setup under torchrun, the (dp_replicate, dp_shard, cp)
device mesh, and one `parallelize()` that applies activation checkpointing, per-layer compile and
FSDP2 to a plain model. Parallelism never leaks into model code.

Launch: `torchrun --nproc-per-node=N -m wamkit.cli train RECIPE` (multi-node: add torchrun's
`--nnodes`, `--node-rank`, `--rdzv-endpoint`; set parallel.data_parallel_replicate_degree to the
node count for HSDP)."""

from __future__ import annotations

import functools
import os
import warnings
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
    attention, whose recompute costs the most per byte saved, keeps its activations. Each MLP's class
    is swapped for a checkpointed subclass (parameter names and checkpoints do not change), and every
    layer's MLP of one type shares that class: a per-instance wrapper would give each layer its own
    guard in the compiled layer, one recompile per layer until dynamo's limit."""
    wrapped = 0
    for layer in model.layers:
        for mlp in (layer.mlp, layer.mlp_moe_gen):
            mlp.__class__ = _checkpointed(type(mlp))
            wrapped += 1
    return wrapped


@functools.cache
def _checkpointed(cls: type) -> type:
    """`cls` whose forward runs under torch.utils.checkpoint (non-reentrant); one subclass per class."""
    from torch.utils.checkpoint import checkpoint

    if getattr(cls, "_wamkit_checkpointed", False):
        return cls

    def forward(self, *args, **kwargs):
        return checkpoint(cls.forward, self, *args, use_reentrant=False, **kwargs)

    return type(f"Checkpointed{cls.__name__}", (cls,), {"forward": forward, "_wamkit_checkpointed": True})


def refuse_silent_recompile_fallback() -> None:
    """Compiled layers that exceed dynamo's recompile limit would otherwise run eagerly from then on,
    flex attention with them, unfused and with the full N x N scores in memory (97 GiB for eight
    480p DROID samples): an error that names the cause instead (the trainer reports it)."""
    import torch._dynamo.config

    torch._dynamo.config.fail_on_recompile_limit_hit = True


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 wraps, innermost first: each decoder layer, then the root."""
    return [*model.layers, model]


# Root inputs that stay fp32 in bf16 compute: the model reads them with .float() (mRoPE positions run
# past 15000, where bf16 steps by 64) or embeds them in fp32 (diffusion timesteps).
FP32_ROOT_INPUTS = frozenset({"position_ids", "vision_timesteps", "action_timesteps", "sound_timesteps"})


def install_input_casts(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast floating inputs to the compute dtype at each shard unit (what FSDP2's cast_forward_inputs
    would do), except FP32_ROOT_INPUTS."""
    if dtype == torch.float32:
        return
    for layer in model.layers:
        layer.register_forward_pre_hook(_input_caster(dtype), with_kwargs=True)
    model.register_forward_pre_hook(_input_caster(dtype, FP32_ROOT_INPUTS), with_kwargs=True)


def run_mesh(ctx: DistContext, dims: ParallelDims):
    """The run's device mesh at every world size. One process gets a one-rank process group, so it
    runs FSDP2 like N ranks do: one mixed-precision mechanism, and one process computes exactly what
    N ranks compute. The group is made only when none exists (a torchrun job has made it already)."""
    if not dist.is_initialized():
        if ctx.world_size != 1:
            raise RuntimeError("a torchrun job without a process group: init_distributed must run first")
        cuda = ctx.device.type == "cuda"
        device_id = None
        if cuda:  # NCCL's eager init wants an indexed device: a bare "cuda" (a benchmark's --device cuda) is the current one
            device_id = ctx.device if ctx.device.index is not None else torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1, device_id=device_id)
    return build_mesh(dims, ctx.device if ctx.device.type == "cuda" else torch.device("cpu"))  # the meta device too: a gloo mesh


def parallelize(model: torch.nn.Module, mesh, cfg, checkpointing: str | None = None) -> torch.nn.Module:
    """Activation checkpointing, then compile, then FSDP2 per decoder layer and at the root.
    `checkpointing`: the mode to apply when the trainer resolved `parallel.activation_checkpointing
    = "auto"` for this GPU (wamkit.train.memory.choose_checkpointing); else the recipe's.

    Trainable parameters keep fp32 master shards (what the optimizer updates); compute runs in
    `parallel.param_dtype` and gradients are reduced in `parallel.reduce_dtype`. Frozen parameters
    are stored once, in `param_dtype`: nothing updates them, so an fp32 copy would only cost memory.
    They are left whole (never gathered, never copied) on one GPU and with
    `parallel.replicate_frozen`, and sharded like the rest otherwise."""
    p = cfg.parallel
    mode = checkpointing or p.activation_checkpointing
    if mode == "full":
        model.enable_gradient_checkpointing()
    elif mode == "selective":
        checkpoint_mlps(model)
    elif mode == "auto":
        raise ConfigError("parallel.activation_checkpointing", "is 'auto', which only `wamkit train` resolves (from its memory "
                          "estimate)", "set 'none', 'selective' or 'full' here")
    elif mode != "none":
        raise ConfigError("parallel.activation_checkpointing", f"{mode!r} is not supported",
                          "use 'none', 'selective', 'full' or (wamkit train) 'auto'")
    if p.compile:
        refuse_silent_recompile_fallback()
        for layer in model.layers:
            layer.compile(dynamic=False)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = DTYPES[p.param_dtype]
    store_frozen_in(model, dtype)
    model.register_forward_hook(_outputs_not_views)  # before FSDP2's own hook, which reads them
    # Inputs are cast by install_input_casts, not by FSDP2: its cast_forward_inputs would round the
    # root's mRoPE positions and timesteps to bf16 (positions 15000..15063 all become 14976 or 15040).
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=DTYPES[p.reduce_dtype], cast_forward_inputs=False)
    with warnings.catch_warnings():  # torch's deprecation of slicing a flattened dimension: nothing a user can act on
        warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
        fsdp_mesh = mesh["dp_replicate", "dp_shard_cp"] if mesh["dp_replicate"].size() > 1 else mesh["dp_shard_cp"]
    frozen_whole = frozen_left_whole(cfg, mesh.size())
    for unit in shard_units(model):
        fully_shard(unit, mesh=fsdp_mesh, mp_policy=mp, reshard_after_forward=p.reshard_after_forward,
                    ignored_params=frozen_parameters(unit) if frozen_whole else None)
    install_input_casts(model, dtype)
    prefetch_layers(list(model.layers), int(getattr(p, "prefetch_layers", 0) or 0))
    return model


def _outputs_not_views(module, args, output):
    """The transformer returns each sample's prediction as a slice of the packed output. FSDP2 hooks
    its pre-backward on those tensors, and an in-place op on a view would drop that hook (and the
    all-gather with it): own copies of the small per-sample outputs remove the hazard at its cause."""
    for field in ("sample", "sound", "action"):
        values = getattr(output, field, None)
        if isinstance(values, list):
            setattr(output, field, [v.clone() if isinstance(v, torch.Tensor) and v._base is not None else v for v in values])
    return output


def frozen_left_whole(cfg, world_size: int) -> bool:
    """Whether frozen weights stay whole on every rank: always on one GPU (there is nothing to shard
    them over, and FSDP2 would copy each layer per step), else `parallel.replicate_frozen`."""
    return world_size == 1 or bool(getattr(cfg.parallel, "replicate_frozen", False))


def frozen_parameters(module: torch.nn.Module) -> set[torch.nn.Parameter]:
    return {q for q in module.parameters() if not q.requires_grad}


def store_frozen_in(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Frozen floating parameters converted once to the compute dtype (on the meta device too, so a
    meta-built model is materialised directly in it)."""
    for q in frozen_parameters(model):
        if q.is_floating_point() and q.dtype != dtype:
            q.data = q.data.to(dtype)


def prefetch_layers(layers: list, n: int) -> None:
    """Issue the all-gathers of the next n layers (forward) / previous n layers (backward) early,
    instead of relying on the CPU running far enough ahead of the GPU."""
    if n <= 0:
        return
    for i, layer in enumerate(layers):
        layer.set_modules_to_forward_prefetch(layers[i + 1 : i + 1 + n])
        layer.set_modules_to_backward_prefetch(layers[max(0, i - n) : i][::-1])


def _input_caster(dtype: torch.dtype, keep: frozenset = frozenset()):
    """A forward pre-hook casting floating tensors in args and kwargs (nested lists too) to `dtype`,
    leaving the kwargs named in `keep` as they are."""
    from torch.utils._pytree import tree_map

    def cast(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype else x

    def hook(module, args, kwargs):
        return tree_map(cast, args), {k: v if k in keep else tree_map(cast, v) for k, v in kwargs.items()}

    return hook


def all_reduce_mean(value: float, ctx: DistContext) -> float:
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.item() / ctx.world_size


def all_reduce_min(value: float, ctx: DistContext) -> float:
    """The smallest value over the ranks: a choice every rank must make alike (the memory the
    tightest GPU has decides activation checkpointing "auto")."""
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.item()


def all_reduce_mean_tensor(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """The mean of a device tensor over the ranks, staying on the device (no host sync)."""
    if not ctx.distributed:
        return value
    value = value.clone()
    dist.all_reduce(value)
    return value / ctx.world_size


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()
