"""Checkpoints sized by what trains: a LoRA run saves only its trainable tensors (adapters, the
trained action pathway, their EMA and optimizer state) plus the identity of its base, and rebuilds
the frozen rest from that base on resume, export, serve and eval.

The identity is where the frozen weights come from (the expanded `checkpoint.load_path`, or "" for
a random base keyed by seed and parameter name: wamkit.model.materialize) and a checksum of their
values as the run computed with them (rounded to `parallel.param_dtype`): count, sum and sum of
squares in float64. A rebuild that does not reproduce the checksum -- another base file at the same
path, another seed, a changed architecture -- is refused instead of silently training or serving
adapters on weights they were not trained on."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from wamkit.errors import CheckpointError, ConfigError

BASE_KEY = "base"  # the completion marker's entry naming a trainable-only checkpoint's base
CHUNK = 1 << 24  # elements per float64 partial sum: bounded temporaries on a 1 B-parameter tensor


def saves_trainable_only(cfg) -> bool:
    """LoRA runs: the frozen weights are the base's, unchanged, and 99% of the model."""
    return bool(cfg.lora.enabled)


def check_trainable_only_build(cfg) -> None:
    """The frozen rest is rebuilt keyed by (seed, parameter name), which only the meta build does."""
    if saves_trainable_only(cfg) and cfg.parallel.init == "eager":
        raise ConfigError("parallel.init", "is 'eager' with lora.enabled = true; a LoRA checkpoint holds only what trains "
                          "and its frozen weights are rebuilt keyed by parameter name, which needs the meta build",
                          "use parallel.init = 'auto' (or 'meta')")


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model entry of a trainable-only checkpoint: the parameters that train, by state-dict name."""
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


def frozen_checksum(model: torch.nn.Module, dtype: torch.dtype, ctx=None) -> list[float]:
    """[count, sum, sum of squares] of every frozen value rounded to `dtype`, over the whole model:
    FSDP2 shards are summed over the ranks, whole (replicated) tensors counted once."""
    device = next(model.parameters()).device
    sharded = torch.zeros(3, dtype=torch.float64, device=device)
    whole = torch.zeros(3, dtype=torch.float64, device=device)
    for param in model.parameters():
        if param.requires_grad or not param.is_floating_point():
            continue
        local = param.to_local() if hasattr(param, "to_local") else param
        target = sharded if hasattr(param, "to_local") else whole
        flat = local.detach().reshape(-1)
        for start in range(0, flat.numel(), CHUNK):
            part = flat[start : start + CHUNK].to(dtype).double()
            target += torch.stack([part.new_tensor(float(part.numel())), part.sum(), part.square().sum()])
    if ctx is not None and ctx.distributed:
        import torch.distributed as dist

        dist.all_reduce(sharded)
    return (sharded + whole).tolist()


def base_identity(cfg, model: torch.nn.Module, ctx=None) -> dict:
    """What a trainable-only checkpoint records of its base (see the module docstring)."""
    from wamkit.config.env import resolved
    from wamkit.train.checkpoint import load_path_location
    from wamkit.train.parallel import DTYPES

    dtype = cfg.parallel.param_dtype  # the base's location as train.setup.base_weights_path gives it (setup imports this module)
    path = str(load_path_location(resolved(cfg.checkpoint, "load_path"))) if cfg.checkpoint.load_path else ""
    return {"load_path": path, "seed": cfg.job.seed, "param_dtype": dtype,
            "frozen_checksum": frozen_checksum(model, DTYPES[dtype], ctx)}


def describe_base(identity: dict) -> str:
    return identity["load_path"] or f"random base weights (seed {identity['seed']})"


def check_same_base(saved: dict, now: dict, checkpoint: str | Path) -> None:
    """Refuse adapters on another base than the one they were trained on, naming both."""
    fix = "train or resume against the base the checkpoint names (checkpoint.load_path, job.seed), or start a new job.name"
    if saved["load_path"] != now["load_path"] or (not saved["load_path"] and saved["seed"] != now["seed"]):
        raise CheckpointError(str(checkpoint), f"was trained on {describe_base(saved)}, not on {describe_base(now)}", fix)
    if not same_checksum(saved["frozen_checksum"], now["frozen_checksum"]):
        raise CheckpointError(
            str(checkpoint), f"was trained on frozen weights with checksum {saved['frozen_checksum']}; {describe_base(now)} "
            f"gives {now['frozen_checksum']}: the base changed since the checkpoint was written", fix)


def same_checksum(a: list[float], b: list[float]) -> bool:
    """Equal counts; sums equal up to float64 reduction order (ranks and chunks change it)."""
    if a[0] != b[0]:
        return False
    scale = math.sqrt(max(a[2], b[2], 1e-30))
    return math.isclose(a[1], b[1], rel_tol=1e-9, abs_tol=1e-9 * scale) and math.isclose(a[2], b[2], rel_tol=1e-9)


def require_full_weights(path: Path, marker: dict, what: str) -> None:
    """A trainable-only checkpoint cannot stand in for a full model (a chain's base, a teacher)."""
    if BASE_KEY in marker:
        raise CheckpointError(
            str(path), f"holds only a LoRA run's trainable tensors (its frozen weights are {describe_base(marker[BASE_KEY])}), "
            f"so it cannot be the {what}", "export it with `wamkit export RUN OUT` (adapters merged) and point at OUT/transformer")
