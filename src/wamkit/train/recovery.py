"""Which checkpoint a relaunched run resumes from, when the one `latest` names may be damaged.

A damaged latest checkpoint is never skipped in silence: by default the run stops with one
CheckpointError naming the damaged files, the newest intact checkpoint and the `--set` that resumes
from it; with checkpoint.on_damage = "previous" it resumes from that one itself, with a loud
warning. checkpoint.resume_step = N resumes from iter_<N> instead of `latest`. Nothing here deletes
or changes a file (a later save of the damaged step moves it aside: wamkit.train.checkpoint)."""

from __future__ import annotations

from pathlib import Path

from wamkit.errors import CheckpointError, ConfigError
from wamkit.train import checkpoint as ckpt
from wamkit.train.manifest import Damage, damage_report, rank_and_world, unverified_note


def resume_point(checkpoints_dir, cfg, ctx=None) -> Path | None:
    """The verified iteration directory to resume from, or None for a fresh run. `cfg` is the run's
    CheckpointConfig (verify, on_damage, resume_step); `ctx` the DistContext (all ranks call this)."""
    if ctx is None or ctx.is_main:
        ckpt.remove_stale_temporaries(checkpoints_dir)
    _barrier(ctx)
    latest = ckpt.latest_name(checkpoints_dir)
    if cfg.resume_step:
        target = _named_step(checkpoints_dir, cfg.resume_step, latest, cfg.verify)
        damage = _damage(target, cfg.verify)
    elif latest is None and not ckpt.iterations(checkpoints_dir):
        return None
    else:
        target = checkpoints_dir / (latest or ckpt.LATEST)
        damage = _pointer_damage(checkpoints_dir, latest) or _damage(target, cfg.verify)
    if not damage:
        return target
    previous = newest_intact(checkpoints_dir, ckpt.step_of_name(target.name) if target.exists() else None, cfg.verify)
    if cfg.on_damage == "previous" and previous is not None:
        if ctx is None or ctx.is_main:
            bar = "!" * 100
            print(f"{bar}\n[wamkit] WARNING: {target} {damage_report(target, damage)}\n[wamkit] WARNING: resuming from "
                  f"{previous.name} instead (checkpoint.on_damage = \"previous\"); the damaged files are kept as they are\n{bar}",
                  flush=True)
        return previous
    raise CheckpointError(str(target), damage_report(target, damage), _fix(target, previous))


def newest_intact(checkpoints_dir, before: int | None, verify: str) -> Path | None:
    """The newest iteration older than step `before` (None: any) whose files verify (collective)."""
    for path in reversed(ckpt.iterations(checkpoints_dir)):
        if (before is None or (ckpt.step_of_name(path.name) or 0) < before) and not _damage(path, verify):
            return path
    return None


def _pointer_damage(checkpoints_dir, latest: str | None) -> list:
    """`latest` lost while iterations exist, or naming none that exists: never a silent fresh start."""
    if latest is None:
        return [Damage(ckpt.LATEST, "missing, although iter_<N> directories exist (a fresh start would discard them)")]
    if ckpt.step_of_name(latest) is None or not (checkpoints_dir / latest).exists():
        return [Damage(ckpt.LATEST, f"names {latest!r}, which is no existing iter_<N> directory")]
    return []


def _damage(path, verify: str) -> list:
    """Like checkpoint_damage, with a checkpoint written before manifests judged by completeness."""
    if not path.exists():
        return [Damage(path.name, "missing: the directory is gone")]
    damage = ckpt.checkpoint_damage(path, verify)
    if damage is not None:
        return damage
    try:
        ckpt.check_complete(path)
    except CheckpointError:
        return [Damage(ckpt.COMPLETE_MARKER, "or .metadata missing")]
    if rank_and_world()[0] == 0:
        print(unverified_note(path), flush=True)
    return []


def _named_step(checkpoints_dir, step: int, latest: str | None, verify: str):
    """iter_<step>, which must exist; refused while `latest` names a newer intact checkpoint, so a
    relaunch that still carries the --set after the run went on never goes back."""
    target = ckpt.iteration_dir(checkpoints_dir, step)
    if not target.exists():
        have = [p.name for p in ckpt.iterations(checkpoints_dir)]
        raise ConfigError("checkpoint.resume_step", f"is {step}, but {target} does not exist",
                          f"use the step of one of {have}" if have else "leave it at 0 (resume from `latest`)")
    if latest and (ckpt.step_of_name(latest) or 0) > step and not _damage(checkpoints_dir / latest, verify):
        raise ConfigError("checkpoint.resume_step", f"is {step}, but {latest} (named by `latest`) is newer and intact",
                          f"remove --set checkpoint.resume_step={step} to continue from {latest}; resume_step is for "
                          "stepping back past a damaged checkpoint")
    return target


def _fix(target, previous) -> str:
    if previous is None:
        return ("this run has no older intact checkpoint: restore the damaged files from a copy, or start again under a new "
                "job.name (checkpoint.load_path may name another run's iteration). Nothing was deleted")
    step = ckpt.step_of_name(previous.name)
    return (f"the newest intact checkpoint is {previous}; resume from it with --set checkpoint.resume_step={step} (or "
            f"--set checkpoint.on_damage=previous to fall back automatically), or restore the damaged files of {target.name} "
            "from a copy and relaunch unchanged. Nothing was deleted")


def _barrier(ctx) -> None:
    if ctx is not None:
        from wamkit.train.parallel import barrier

        barrier(ctx)
