"""The doctor's shared pieces: what a recipe expects of a dataset, the report, and the state and helpers
every check reads (the checks themselves live in doctor_meta, doctor_stats, doctor_data, doctor_video)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from wamkit.data.doctor_signals import ChannelSummary, Finding

# fields each normalization mode reads from stats.json (asinh: asinh_scale or std)
MODE_FIELDS = {"minmax": ("min", "max"), "quantile": ("q01", "q99"), "meanstd": ("mean", "std"), "none": (),
               "asinh": ("std",)}
INFO_REQUIRED = ("codebase_version", "fps", "features", "data_path")
EPISODE_REQUIRED = ("episode_index", "length", "data/chunk_index", "data/file_index")
VIDEO_FIELDS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
TIMESTAMP_WARN_S = 1e-4  # LeRobot's own tolerance
TIMESTAMP_ERROR_PERIODS = 0.1  # error when off by more than this fraction of a frame period
# errors after which the doctor has not read every row of the dataset
PARTIAL_DATA = {"data_file_missing", "data_file_unreadable", "data_column_missing", "data_dim_mismatch",
                "data_episode_unknown", "episode_index_duplicate", "row_count_mismatch", "episodes_missing"}
ARROW_FLOATS = {"float32": "float", "float64": "double"}  # info.json dtype -> arrow's name for it
STATS_RANGE_RTOL = 1e-5  # data outside stats [min, max] by more than this x max(1, |bound|) is not rounding


@dataclass
class DatasetExpectation:
    """What a recipe implies about the dataset."""

    action_key: str = "action"
    state_key: str | None = "observation.state"
    camera_keys: list[str] = field(default_factory=list)  # [] -> any (at least one camera)
    chunk_length: int = 32
    fps: float = 0.0  # 0 -> any
    max_action_dim: int = 36
    normalization: str = "minmax"
    state_normalization: str = ""  # "" -> same as normalization

    @classmethod
    def from_config(cls, cfg) -> "DatasetExpectation":
        d = cfg.data
        return cls(action_key=d.action_key, state_key=d.state_key if d.use_state else None,
                   camera_keys=list(d.camera_keys), chunk_length=int(d.chunk_length), fps=float(d.fps),
                   max_action_dim=int(cfg.model.max_action_dim), normalization=d.normalization,
                   state_normalization=d.state_normalization or "")


@dataclass
class DoctorReport:
    path: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def codes(self, severity: str | None = None) -> set[str]:
        return {f.code for f in self.findings if severity is None or f.severity == severity}

    def format(self) -> str:
        lines = [f"dataset doctor: {self.path}"]
        for f in sorted(self.findings, key=lambda f: f.severity != "error"):
            lines.append(f"{f.severity.upper()} [{f.code}] {f.where}")
            lines.append(f"  problem: {f.problem}")
            if f.fix:
                lines.append(f"  fix: {f.fix}")
        n_e, n_w = len(self.errors), len(self.warnings)
        verdict = "OK for training" if self.ok else "NOT usable for training until the errors are fixed"
        lines.append(f"{n_e} error(s), {n_w} warning(s): {verdict}")
        return "\n".join(lines)


class DoctorBase:
    """State the checks share (what info.json, meta/ and the data said so far) and the finding helpers."""

    def __init__(self, root: Path, expect: DatasetExpectation):
        self.root, self.expect = root, expect
        self.report = DoctorReport(str(root))
        self.info: dict[str, Any] | None = None
        self.fps: float | None = None
        self.features: dict[str, Any] = {}
        self.tasks: set[int] | None = None
        self.episodes: dict[int, dict[str, Any]] = {}
        self.episode_source: dict[int, str] = {}
        self.stat_bounds: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # stats.json min/max per normalized key
        self.stat_constants: dict[str, dict[int, float]] = {}  # channels the stats record as constant
        self.stat_fields: dict[str, dict[str, np.ndarray]] = {}  # stats.json fields that parse, per normalized key
        self.stat_used: dict[str, set[str]] = {}  # the fields the recipe's normalization reads, per key
        self.data_summary: dict[str, ChannelSummary] = {}  # the parquets' finite values, per channel

    # ---- helpers ---------------------------------------------------------------------------------
    def add(self, severity: str, code: str, where: Any, problem: str, fix: str = "") -> None:
        self.report.findings.append(Finding(severity, code, str(where), problem, fix))

    def error(self, code: str, where: Any, problem: str, fix: str = "") -> None:
        self.add("error", code, where, problem, fix)

    def warn(self, code: str, where: Any, problem: str, fix: str = "") -> None:
        self.add("warning", code, where, problem, fix)

    def guarded(self, name: str, check: Callable[[], None]) -> None:
        """Run one check; an unexpected exception becomes an error finding instead of a crash."""
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - the doctor must never crash on bad input
            self.error("check_crashed", f"{self.root} ({name})", f"the {name} check failed on unexpected input: "
                       f"{type(exc).__name__}: {exc}", "inspect the files this check reads; they are malformed")

    def rel(self, p: Path) -> str:
        return str(p)

    def feature_dim(self, key: str) -> int | None:
        try:
            return int(math.prod(int(s) for s in self.features[key]["shape"]))
        except (KeyError, TypeError, ValueError):
            return None


    def _format(self, template_key: str, **fields: Any) -> Path | None:
        template = (self.info or {}).get(template_key)
        if not isinstance(template, str):
            return None
        try:
            return self.root / template.format(**fields)
        except (KeyError, IndexError, ValueError) as exc:
            self.error("info_bad_template", f"{self.root}/meta/info.json: {template_key}", f"template {template!r} "
                       f"cannot be filled with {sorted(fields)}: {exc!r}", "use the LeRobot v3.0 path templates")
            return None
