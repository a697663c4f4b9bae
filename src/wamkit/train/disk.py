"""How big a checkpoint is, and whether the disk it goes to can hold it.

A save that runs out of space half way leaves a truncated temporary directory, a job that dies
hours into a run, and possibly a filesystem so full that the next launch cannot write its logs. A
save therefore measures what it is about to write and stops *before* writing when the checkpoints
directory's filesystem has less free space than that; the previous checkpoint and `latest` are not
touched."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from wamkit.errors import CheckpointError

# DCP's .metadata, the completion marker, scheduler/RNG/trainer extras and filesystem block rounding:
# a save needs its tensors' bytes plus this much (5%, at least 16 MiB) free.
HEADROOM_FRACTION = 0.05
HEADROOM_MIN_BYTES = 16 * 2**20


def state_nbytes(state) -> int:
    """Bytes the tensors of a (nested) state dict occupy in the whole checkpoint. A DTensor counts
    with its global shape (its shards across all ranks together, each written once); a plain tensor
    once (DCP deduplicates replicated tensors across ranks). Non-tensor leaves are in the headroom."""
    if isinstance(state, dict):
        return sum(state_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_nbytes(v) for v in state)
    if isinstance(state, torch.Tensor):  # a DTensor's numel() is its global element count
        return state.numel() * state.element_size()
    return 0


def required_bytes(nbytes: int) -> int:
    """Free space a save of `nbytes` of tensors needs: the tensors plus the headroom."""
    return nbytes + max(int(nbytes * HEADROOM_FRACTION), HEADROOM_MIN_BYTES)


def estimated_checkpoint_bytes(total_params: int, trainable_params: int, ema: bool, frozen_bytes: int = 4) -> int:
    """A training checkpoint's tensors from parameter counts (the dry run): the fp32 master weights
    of the trainable parameters, the frozen ones at `frozen_bytes` each (their stored dtype; 0 for a
    LoRA run, whose checkpoints leave the base out: wamkit.train.base_identity), AdamW's two fp32
    moments per trainable parameter, the fp32 EMA of the trainable ones."""
    return 4 * trainable_params + frozen_bytes * (total_params - trainable_params) + 8 * trainable_params + (4 * trainable_params if ema else 0)


def free_bytes(directory: Path) -> int:
    """Free space of the filesystem `directory` is (or will be created) on."""
    path = Path(directory).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_free_space(directory: Path, needed: int, free: int) -> None:
    if free < needed:
        raise CheckpointError(
            str(directory), f"has {format_bytes(free)} free, but the next checkpoint needs {format_bytes(needed)} "
            "(its tensors plus headroom); stopped before writing, so the previous checkpoint and `latest` are intact",
            "free space on that filesystem, lower checkpoint.keep_last (older checkpoints are removed after each save), "
            "or move the run to a larger disk with another job.output_root (resume by copying the run directory)",
        )


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def fraction_step(fraction: float, max_iter: int) -> int:
    """The training step of one checkpoint.save_fractions entry."""
    return max(1, round(float(fraction) * max_iter))


def extra_save_steps(max_iter: int, save_steps=(), save_fractions=()) -> set[int]:
    """checkpoint.save_steps and checkpoint.save_fractions (of max_iter) as training steps."""
    return {int(s) for s in save_steps} | {fraction_step(f, max_iter) for f in save_fractions}


def number_of_saves(max_iter: int, save_iter: int, save_steps=()) -> int:
    """Saves over a run: every save_iter steps, plus one at max_iter when it is not a multiple, plus the
    extra `save_steps` (extra_save_steps) that none of those cover."""
    extra = {int(s) for s in save_steps if 0 < int(s) < max_iter and int(s) % save_iter}
    return -(-max_iter // save_iter) + len(extra)


def saves_at(step: int, max_iter: int, save_iter: int, save_steps=()) -> bool:
    """Whether a run saves after training step `step` (1-based)."""
    return step % save_iter == 0 or step == max_iter or step in set(save_steps)
