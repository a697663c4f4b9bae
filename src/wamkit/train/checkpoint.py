"""DCP checkpoints under <run>/checkpoints/iter_<9 digits>/, written atomically.

A save goes to a hidden temporary directory that is renamed into place only once complete, and
`latest` is replaced (write temp file + os.replace) only after that rename. A crash at any moment
therefore leaves `latest` naming a complete checkpoint or the previous one. Before anything is
written, the save checks that the filesystem can hold it (wamkit.train.disk) and stops otherwise."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch.distributed.checkpoint as dcp

from wamkit.errors import CheckpointError
from wamkit.train import disk
from wamkit.train.faults import KILL_DURING_SAVE, maybe_kill

LATEST = "latest"
COMPLETE_MARKER = "wamkit_complete.json"


def iteration_dir(checkpoints_dir: Path, step: int) -> Path:
    return checkpoints_dir / f"iter_{step:09d}"


def save_checkpoint(checkpoints_dir: Path, step: int, state: dict, metadata: dict | None = None, ctx=None) -> Path:
    """Every rank writes its shards (DCP); rank 0 alone creates, completes and publishes the
    directory. `ctx` is the DistContext of a torchrun job, None for one process. Raises
    CheckpointError on every rank, before writing anything, when the disk cannot hold the save."""
    main = ctx is None or ctx.is_main
    final = iteration_dir(checkpoints_dir, step)
    tmp = checkpoints_dir / f".tmp_{final.name}"
    _check_space(checkpoints_dir, disk.required_bytes(disk.state_nbytes(state)), ctx)
    if main:
        checkpoints_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier(ctx)
    dcp.save(state, checkpoint_id=str(tmp))
    _barrier(ctx)
    if main:
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"step": step, **(metadata or {})}, indent=2))
        _fsync_dir(tmp)
        maybe_kill(KILL_DURING_SAVE, step)
        if final.exists():  # re-saving the same step (e.g. after a crash right before `latest` moved)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(checkpoints_dir)
        _write_latest(checkpoints_dir, final.name)
    _barrier(ctx)
    return final


def _check_space(checkpoints_dir: Path, needed: int, ctx) -> None:
    """Rank 0 measures the shared directory's free space and every rank gets its verdict, so all
    ranks stop together instead of the others hanging in the save's collectives."""
    free = disk.free_bytes(checkpoints_dir) if ctx is None or ctx.is_main else 0
    if ctx is not None and ctx.distributed:
        import torch
        import torch.distributed as dist

        numbers = torch.tensor([needed, free], dtype=torch.int64, device=ctx.device)
        dist.broadcast(numbers, src=0)
        needed, free = (int(v) for v in numbers.tolist())
    disk.check_free_space(checkpoints_dir, needed, free)


def find_latest(checkpoints_dir: Path, ctx=None) -> Path | None:
    """The run's latest completed iteration after rank 0 removed the temporaries of an interrupted
    save; every rank waits for that before looking. `ctx`: the DistContext, None for one process."""
    if ctx is None or ctx.is_main:
        remove_stale_temporaries(checkpoints_dir)
    _barrier(ctx)
    return latest_checkpoint(checkpoints_dir)


def _barrier(ctx) -> None:
    if ctx is not None:
        from wamkit.train.parallel import barrier

        barrier(ctx)


def _write_latest(checkpoints_dir: Path, name: str) -> None:
    tmp = checkpoints_dir / f".{LATEST}.tmp_{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, checkpoints_dir / LATEST)
    _fsync_dir(checkpoints_dir)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The checkpoint `latest` names, or None for a fresh run. Errors if it names a broken one."""
    pointer = checkpoints_dir / LATEST
    if not pointer.is_file():
        return None
    path = checkpoints_dir / pointer.read_text().strip()
    check_complete(path)
    return path


def check_complete(path: Path) -> None:
    if not (path / COMPLETE_MARKER).is_file() or not (path / ".metadata").is_file():
        raise CheckpointError(
            str(path), "is not a complete wamkit DCP checkpoint (no completion marker or DCP .metadata)",
            "point at an iter_<N> directory that a finished save wrote, or delete the broken directory",
        )


def checkpoint_step(path: Path) -> int:
    return int(json.loads((path / COMPLETE_MARKER).read_text())["step"])


def load_checkpoint(path: Path, state: dict) -> None:
    """Load in place into `state` (same structure as saved)."""
    check_complete(path)
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:  # DCP raises several types for missing / mismatched entries
        raise CheckpointError(str(path), f"could not be loaded into this run: {exc}", "check that the recipe matches the one that wrote it") from exc


def remove_stale_temporaries(checkpoints_dir: Path) -> None:
    """Half-written saves of a killed process are garbage: they were never named by `latest`."""
    if checkpoints_dir.is_dir():
        for tmp in checkpoints_dir.glob(".tmp_iter_*"):
            shutil.rmtree(tmp, ignore_errors=True)


def prune_checkpoints(checkpoints_dir: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    done = sorted(p for p in checkpoints_dir.glob("iter_*") if p.is_dir())
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
