"""`wamkit export --student-only`: a distillation run's student EMA -> a standard wamkit export.

The export is exactly `wamkit.export.export_run(..., use_ema=True)` (the checkpoint's "model"/"ema"
entries are the student's; critic, optimizers and the frozen teacher/reference are never read), plus
`student.json`: the selected variant and the saved few-step sampling ladder, which inference must
reuse as it is."""

from __future__ import annotations

import json
from pathlib import Path

from wamkit.errors import CheckpointError
from wamkit.policy.loading import resolve_checkpoint, write_file_manifest
from wamkit.train import checkpoint as ckpt

STUDENT_MANIFEST = "student.json"


def export_student(run_or_checkpoint: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    from wamkit.export import export_run

    iteration, run_dir = resolve_checkpoint(run_or_checkpoint)
    marker = json.loads((iteration / ckpt.COMPLETE_MARKER).read_text())
    if "distill" not in marker:
        raise CheckpointError(str(iteration), "is not a distillation (stage 2/3) checkpoint: it records no student",
                              "export it without --student-only, or pass a stage-2/3 run")
    out = export_run(iteration, out_dir, use_ema=True, dtype=dtype)
    student = {
        "variant": "student_ema", "method": marker["distill"]["method"], "source_checkpoint": str(iteration.resolve()),
        "step": marker["step"], "student_updates": marker.get("student_updates"),
        "sampling": {"sampler": "multistep_consistency", "num_steps": marker["distill"]["student_steps"],
                     "sigmas": marker["student_sigmas"]},
        "excluded": ["critic", "critic_optimizer", "optimizer", "teacher/reference (frozen, never saved)"],
    }
    (Path(out) / STUDENT_MANIFEST).write_text(json.dumps(student, indent=2))
    write_file_manifest(Path(out))  # again, now listing student.json too
    return Path(out)


def student_ladder(path: str | Path) -> list[float] | None:
    """The few-step ladder a distilled student samples with (consistency steps), from an export's
    student.json or a distillation checkpoint's marker; None for any other model. One reader for both,
    so an export samples exactly as the run it came from."""
    from wamkit.policy.loading import is_export

    if is_export(path):
        manifest = Path(path).expanduser() / STUDENT_MANIFEST
        return json.loads(manifest.read_text())["sampling"]["sigmas"] if manifest.is_file() else None
    iteration, _ = resolve_checkpoint(path)
    marker = ckpt.read_marker(iteration)
    return [float(s) for s in marker["student_sigmas"]] if "distill" in marker else None
