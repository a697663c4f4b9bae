"""``wamkit data doctor``: check a LeRobot v3.0 dataset against what a recipe needs, before training.

Every problem becomes a :class:`Finding` (severity, code, where, problem, fix); the doctor itself never
raises on malformed input. Checks run independently, so one broken file does not hide the others.
Video files are opened and only their last GOP is decoded to find where the stream really ends.
"""

from __future__ import annotations

import sys
from pathlib import Path

from wamkit.data.doctor_base import DatasetExpectation, DoctorReport
from wamkit.data.doctor_data import DataChecks
from wamkit.data.doctor_meta import MetaChecks
from wamkit.data.doctor_signals import Finding
from wamkit.data.doctor_stats import StatsChecks
from wamkit.data.doctor_video import VideoChecks

__all__ = ["DatasetExpectation", "DoctorReport", "Finding", "diagnose", "doctor_main"]


class _Doctor(MetaChecks, StatsChecks, DataChecks, VideoChecks):
    """All checks, run in order; each one guarded so one broken file does not hide the others."""

    def run(self) -> DoctorReport:
        if not self.root.is_dir():
            self.error("root_missing", self.root, "is not a directory", "point at a LeRobot v3.0 dataset root")
            return self.report
        ok = False
        try:
            ok = self.check_info()
        except Exception as exc:  # noqa: BLE001
            self.error("check_crashed", f"{self.root}/meta/info.json", f"{type(exc).__name__}: {exc}",
                       "regenerate meta/info.json")
        if not ok:
            return self.report
        self.guarded("features", self.check_features)
        self.guarded("stats", self.check_stats)
        self.guarded("tasks", self.check_tasks)
        self.guarded("episodes", self.check_episodes)
        self.guarded("lengths", self.check_lengths)
        self.guarded("data", self.check_data)
        self.guarded("stats against data", self.check_stats_vs_data)
        self.guarded("outliers", self.check_outliers)
        self.guarded("videos", self.check_videos)
        return self.report


def diagnose(path: str | Path, expect: DatasetExpectation | None = None) -> DoctorReport:
    """Check the dataset at `path` against `expect` (None -> the default recipe's expectations)."""
    return _Doctor(Path(path), expect or DatasetExpectation()).run()


def doctor_main(path: str, recipe_cfg=None) -> int:
    """CLI entry: print the report; 0 if no errors, else 1."""
    expect = DatasetExpectation.from_config(recipe_cfg) if recipe_cfg is not None else None
    from wamkit.data.summary import dataset_summary

    print("\n".join(dataset_summary(path)))
    report = diagnose(path, expect)
    print(report.format())
    return 0 if report.ok else 1


def _main(argv: list[str]) -> int:  # python -m wamkit.data.doctor PATH
    if len(argv) != 1:
        print("usage: python -m wamkit.data.doctor DATASET_ROOT", file=sys.stderr)
        return 2
    return doctor_main(argv[0])


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
