"""A few lines saying what a LeRobot v3.0 dataset holds, read from its metadata alone (meta/info.json,
meta/tasks.parquet): what `wamkit data doctor` read, so a user checks it is the dataset they meant
before reading the findings. Never raises: a dataset too broken to summarise is the doctor's to report."""

from __future__ import annotations

import json
from pathlib import Path

CAMERA_DTYPES = ("video", "image")


def dataset_summary(root: str | Path) -> list[str]:
    """Episodes, frames (and seconds), fps, cameras with their HxW, the other features with their
    dims, and the tasks; [] when meta/info.json is unreadable."""
    root = Path(root)
    try:
        info = json.loads((root / "meta" / "info.json").read_text())
        features = dict(info.get("features", {}))
        fps = float(info["fps"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    frames = int(info.get("total_frames", 0))
    cameras = [f"{k} {_size(v)}" for k, v in features.items() if isinstance(v, dict) and v.get("dtype") in CAMERA_DTYPES]
    other = [f"{k} {_dims(v)}" for k, v in features.items() if isinstance(v, dict) and v.get("dtype") not in CAMERA_DTYPES
             and not k.endswith("index") and k != "timestamp"]
    tasks = _tasks(root)
    shown = "; ".join(repr(t) for t in tasks[:3]) + (f"; ... ({len(tasks) - 3} more)" if len(tasks) > 3 else "")
    return [
        f"dataset: {info.get('total_episodes', '?')} episodes, {frames} frames ({frames / fps:.1f} s at {fps:g} fps), "
        f"robot {info.get('robot_type') or '?'}, {info.get('codebase_version', '?')}",
        f"cameras (HxW px): {', '.join(cameras) or 'none'}",
        f"features: {', '.join(other) or 'none'}",
        f"tasks ({len(tasks)}): {shown or 'none'}",
    ]


def _size(feature: dict) -> str:
    shape = feature.get("shape") or []
    return f"{shape[0]}x{shape[1]}" if len(shape) >= 2 else "?"


def _dims(feature: dict) -> str:
    shape = feature.get("shape") or [1]
    return f"{'x'.join(str(s) for s in shape)}-D {feature.get('dtype', '?')}"


def _tasks(root: Path) -> list[str]:
    try:
        from wamkit.data.lerobot_v3 import load_tasks

        return [text for _, text in sorted(load_tasks(root).items())]
    except Exception:  # noqa: BLE001 - the doctor reports a broken tasks file itself
        return []
