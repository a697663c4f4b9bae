"""DCP checkpoints under <run>/checkpoints/iter_<9 digits>/, written atomically.

A save goes to a hidden temporary directory that is renamed into place only once complete, and
`latest` is replaced (write temp file + os.replace) only after that rename. A crash at any moment
therefore leaves `latest` naming a complete checkpoint or the previous one. Before anything is
written, the save checks that the filesystem can hold it (wamkit.train.disk) and stops otherwise.

In an object store (s3://, gs://: wamkit.storage) there is no rename: every rank writes its shards
straight into iter_<N>/ through DCP's fsspec writer, rank 0 then puts the completion marker, and
`latest` last (a single-object PUT, which readers see whole or not at all). An iter_<N>/ without a
marker is an interrupted save: never named by `latest`, and removed at the next start (unless it got
as far as its manifest: what recorded its files is never deleted).

Before the marker, every save writes a manifest of its files (wamkit.train.manifest: each rank hashes
its own shards), and every load checks the files against it. A completed iteration directory is never
deleted to make room for a new save of the same step: it is set aside as replaced_iter_<N>."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from wamkit.train import dcp_quiet as dcp  # DCP without its one-process warning

from wamkit.errors import CheckpointError, ConfigError
from wamkit.storage import is_remote, location, move_tree, remove_tree
from wamkit.train import disk
from wamkit.train import manifest
from wamkit.train.faults import KILL_DURING_SAVE, KILL_RANK_DURING_SAVE, maybe_kill

LATEST = "latest"
COMPLETE_MARKER = "wamkit_complete.json"


def iteration_dir(checkpoints_dir: Path, step: int) -> Path:
    return checkpoints_dir / f"iter_{step:09d}"


def save_checkpoint(checkpoints_dir: Path, step: int, state: dict, metadata: dict | None = None, ctx=None,
                    verify: str = "hash") -> Path:
    """Every rank writes its shards (DCP); rank 0 alone creates, completes and publishes the
    directory. `ctx` is the DistContext of a torchrun job, None for one process. Raises
    CheckpointError on every rank, before writing anything, when the disk cannot hold the save.
    `verify` (checkpoint.verify): "size" records no hashes in the manifest."""
    if is_remote(checkpoints_dir):
        return _save_to_object_store(checkpoints_dir, step, state, metadata, ctx, verify)
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
    entries = _shard_entries(tmp, ctx, verify)
    if main:
        _complete(tmp, step, metadata, entries, verify)
        _fsync_dir(tmp)
        maybe_kill(KILL_DURING_SAVE, step)
        _clear_for_save(final, checkpoints_dir)  # re-saving a step: after a crash before `latest` moved, or past damage
        os.rename(tmp, final)
        _fsync_dir(checkpoints_dir)
        _write_latest(checkpoints_dir, final.name)
    _barrier(ctx)
    return final


def _save_to_object_store(checkpoints_dir, step: int, state: dict, metadata: dict | None, ctx, verify: str):
    """The object-store save: shards in place, then the manifest, the marker, and `latest` last
    (module docstring)."""
    main = ctx is None or ctx.is_main
    final = iteration_dir(checkpoints_dir, step)
    if main:  # an interrupted save of this step (never named by `latest`) must not mix into this one
        _clear_for_save(final, checkpoints_dir)
    _barrier(ctx)
    dcp.save(state, storage_writer=_writer(str(final), 0 if ctx is None else ctx.rank, step))
    _barrier(ctx)
    entries = _shard_entries(final, ctx, verify)
    if main:
        _complete(final, step, metadata, entries, verify)
        maybe_kill(KILL_DURING_SAVE, step)
        (checkpoints_dir / LATEST).write_text(final.name + "\n")
    _barrier(ctx)
    return final


def _shard_entries(directory, ctx, verify: str) -> dict:
    """Manifest entries of every file DCP wrote: each rank sizes and hashes its own `__<rank>_*`
    shards (still in its page cache), rank 0 the rest (.metadata); every rank gets all entries."""
    rank, world = (0, 1) if ctx is None else (ctx.rank, ctx.world_size)
    names = manifest.list_files(directory)
    mine = [n for n in names if _shard_rank(n, world) == rank]
    return dict(manifest.gather(list(manifest.file_entries(directory, mine, verify == "hash").items())))


def _shard_rank(name: str, world: int) -> int:
    """The rank that wrote `name` (DCP names shards __<rank>_<i>.distcp); 0 for every other file."""
    head, _, _ = name.removeprefix("__").partition("_")
    return int(head) if name.startswith("__") and head.isdigit() and int(head) < world else 0


def _complete(directory, step: int, metadata: dict | None, entries: dict, verify: str) -> None:
    """Manifest (listing the marker too, whose bytes are known before it is written), then marker."""
    marker = json.dumps({"step": step, **(metadata or {}), "manifest": manifest.MANIFEST}, indent=2).encode()
    manifest.write_manifest(directory, {**entries, COMPLETE_MARKER: manifest.bytes_entry(marker, verify == "hash")}, verify == "hash")
    (directory / COMPLETE_MARKER).write_bytes(marker)


def _clear_for_save(final, checkpoints_dir) -> None:
    """Make room for a new save of `final`'s step. An interrupted save's leftovers (no marker, no
    manifest, not named by `latest`) are removed; anything else is a completed checkpoint, damaged
    or intact, and is moved aside to replaced_iter_<N> instead."""
    if not final.exists():
        return
    if not ((final / COMPLETE_MARKER).exists() or (final / manifest.MANIFEST).exists() or latest_name(checkpoints_dir) == final.name):
        remove_tree(final)
        return
    aside, n = checkpoints_dir / f"replaced_{final.name}", 1
    while aside.exists():
        aside, n = checkpoints_dir / f"replaced_{final.name}_{n}", n + 1
    move_tree(final, aside)
    print(f"[wamkit] {final} existed from an earlier save; kept it as {aside.name} (delete it once you no longer need it)", flush=True)


def latest_name(checkpoints_dir) -> str | None:
    pointer = checkpoints_dir / LATEST
    return pointer.read_text().strip() if pointer.exists() else None


def _writer(url: str, rank: int, step: int):
    """DCP's fsspec writer; with the crash-injection variable set (wamkit.train.faults) the chosen
    rank is SIGKILLed once its own shards are written, before the save is complete."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    class Writer(FsspecWriter):
        def write_data(self, plan, planner):
            written = super().write_data(plan, planner)
            written.wait()
            maybe_kill(KILL_RANK_DURING_SAVE, f"{rank}:{step}")
            return written

    return Writer(url)


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


def checkpoint_reader(path):
    """DCP's reader for a checkpoint directory, local or in an object store."""
    if is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(str(path))
    return dcp.FileSystemReader(str(path))


def load_path_location(text: str):
    """checkpoint.load_path (expanded) as a Path, or a UPath for a wamkit checkpoint in an object
    store, which DCP reads in place; a diffusers or safetensors base there would have to be
    downloaded whole, so it is refused with the fix."""
    path = location(text, "checkpoint.load_path")
    if not path.exists():
        raise ConfigError("checkpoint.load_path", f"{path} does not exist", "point it at base weights or leave it empty for random init")
    if is_remote(path) and not (path / COMPLETE_MARKER).exists():
        raise ConfigError("checkpoint.load_path", f"{path} is not a wamkit checkpoint (no {COMPLETE_MARKER}); from an object "
                          "store only wamkit iteration directories load", "copy diffusers or safetensors base weights to a "
                          "local or shared filesystem and point checkpoint.load_path there")
    return path


def read_marker(path: Path) -> dict:
    """A completed iteration's completion marker: its step and the metadata the save recorded."""
    try:
        return json.loads((path / COMPLETE_MARKER).read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(str(path / COMPLETE_MARKER), f"is torn or altered (not JSON: {exc})",
                              "restore the checkpoint from a copy, or use another iteration") from exc


def checkpoint_step(path: Path) -> int:
    return int(read_marker(path)["step"])


DAMAGE_FIX = "restore the damaged files from a copy of this checkpoint, or load another iteration (runs/<name>/checkpoints/iter_<N>)"


def checkpoint_damage(path, verify: str = "hash", collective: bool = True) -> list | None:
    """What is damaged in an iteration directory (wamkit.train.manifest.Damage; [] when intact), or
    None for one written before manifests. `collective`: see wamkit.train.manifest.damage_of."""
    damage = manifest.damage_of(path, verify, collective)
    marker = path / COMPLETE_MARKER
    if damage is None:
        recorded = marker.exists() and _marker_field(marker, "manifest")
        return [manifest.Damage(manifest.MANIFEST, "missing (the completion marker says one was written)")] if recorded else None
    if not damage and path.name.startswith("iter_") and _marker_field(marker, "step") != step_of_name(path.name):
        damage = [manifest.Damage(COMPLETE_MARKER, f"records step {_marker_field(marker, 'step')}: the files of another iteration")]
    return damage


def verify_checkpoint(path, verify: str = "hash", fix: str = DAMAGE_FIX) -> None:
    """Raise one CheckpointError naming every damaged file of `path`; a directory written before
    manifests is checked for completeness only, with a one-line note."""
    damage = checkpoint_damage(path, verify)
    if damage is None:
        check_complete(path)
        if manifest.rank_and_world()[0] == 0:
            print(manifest.unverified_note(path), flush=True)
    elif damage:
        raise CheckpointError(str(path), manifest.damage_report(path, damage), fix)


def _marker_field(marker, key: str):
    try:
        return json.loads(marker.read_text()).get(key)
    except (ValueError, OSError, UnicodeDecodeError):
        return None


def step_of_name(name: str) -> int | None:
    """N of an iter_<N> name; None for any other name."""
    digits = name.removeprefix("iter_")
    return int(digits) if name.startswith("iter_") and digits.isdigit() else None


def load_checkpoint(path: Path, state: dict, verify: str | None = "hash") -> None:
    """Load in place into `state` (same structure as saved), resharded to this run's world size,
    after checking its files (checkpoint.verify; None: the caller has just verified them)."""
    if verify is None:
        check_complete(path)
    else:
        verify_checkpoint(path, verify)
    try:
        dcp.load(state, storage_reader=checkpoint_reader(path))
    except Exception as exc:  # DCP raises several types for missing / mismatched entries
        raise CheckpointError(str(path), f"could not be loaded into this run: {exc}", "check that the recipe matches the one that wrote it") from exc


def remove_stale_temporaries(checkpoints_dir: Path) -> None:
    """Half-written saves of a killed process are garbage: they were never named by `latest`. In an
    object store they are the iter_<N>/ prefixes without a completion marker."""
    if is_remote(checkpoints_dir):
        latest = latest_name(checkpoints_dir)
        stale = [p for p in iterations(checkpoints_dir) if p.name != latest
                 and not (p / COMPLETE_MARKER).exists() and not (p / manifest.MANIFEST).exists()]
    else:
        stale = list(checkpoints_dir.glob(".tmp_iter_*")) if checkpoints_dir.is_dir() else []
    for tmp in stale:
        remove_tree(tmp)


def iterations(checkpoints_dir) -> list:
    """The iter_<N> directories (or prefixes), oldest first."""
    if not checkpoints_dir.exists():
        return []
    return sorted((p for p in checkpoints_dir.glob("iter_*") if p.is_dir()), key=lambda p: p.name)


def prune_checkpoints(checkpoints_dir: Path, keep_last: int) -> None:
    """Keep the newest `keep_last` checkpoints that pass the size check, up to the one `latest` names
    (just saved). Damaged ones are never removed and never count, and newer ones (left by a run that
    resumed from before them) neither count nor go, so the last intact checkpoint always stays."""
    if keep_last <= 0:
        return
    latest = step_of_name(latest_name(checkpoints_dir) or "")
    if latest is None:
        return
    older = [p for p in iterations(checkpoints_dir) if (step_of_name(p.name) or 0) <= latest]
    intact = [p for p in older if _passes_size_check(p)]
    for old in intact[:-keep_last]:
        remove_tree(old)


def _passes_size_check(path) -> bool:
    """Complete and, where it has a manifest, every file of the recorded size (stat calls only)."""
    try:
        damage = checkpoint_damage(path, "size", collective=False) if (path / COMPLETE_MARKER).exists() else [COMPLETE_MARKER]
    except CheckpointError:
        return False
    return not damage
