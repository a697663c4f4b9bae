"""``wamkit data doctor``: check a LeRobot v3.0 dataset against what a recipe needs, before training.

Every problem becomes a :class:`Finding` (severity, code, where, problem, fix); the doctor itself never
raises on malformed input. Checks run independently, so one broken file does not hide the others.
Video files are opened and only their last GOP is decoded to find where the stream really ends.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from wamkit.data import doctor_signals as signals
from wamkit.data.doctor_signals import ChannelSummary, Finding
from wamkit.data.lerobot_v3 import CAMERA_DTYPES, check_templates, check_version
from wamkit.data.normalize import CONSTANT_RTOL, constant_channels
from wamkit.errors import DataError

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


class _Doctor:
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

    # ---- info.json -------------------------------------------------------------------------------
    def check_info(self) -> bool:
        path = self.root / "meta" / "info.json"
        if not path.is_file():
            self.error("info_missing", path, "meta/info.json is missing; this is not a LeRobot v3.0 dataset root",
                       "point at the dataset root (the folder holding meta/, data/, videos/)")
            return False
        try:
            info = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self.error("info_invalid_json", path, f"invalid JSON: {exc}", "fix or regenerate meta/info.json")
            return False
        if not isinstance(info, dict):
            self.error("info_invalid_json", path, f"top level is {type(info).__name__}, not an object",
                       "regenerate meta/info.json")
            return False
        try:
            check_version(path, info)
        except DataError as exc:  # a v2.x layout: every other check would only repeat it
            self.error("info_bad_version", exc.where, exc.problem, exc.fix)
            return False
        missing = [k for k in INFO_REQUIRED if k not in info]
        if missing:
            self.error("info_missing_keys", path, f"missing keys {missing}", "regenerate meta/info.json (LeRobot v3.0)")
        try:
            check_templates(path, info)
        except DataError as exc:
            self.error("info_absolute_path", exc.where, exc.problem, exc.fix)
        fps = info.get("fps")
        if "fps" in info:
            if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
                self.error("info_bad_fps", f"{path}: fps", f"is {fps!r}, not a positive number", "set the real fps")
            else:
                self.fps = float(fps)
        feats = info.get("features", {})
        if not isinstance(feats, dict):
            self.error("info_bad_feature", f"{path}: features", "is not an object", "regenerate meta/info.json")
            feats = {}
        for key, feat in feats.items():
            if not isinstance(feat, dict) or "dtype" not in feat or not isinstance(feat.get("shape"), list):
                self.error("info_bad_feature", f"{path}: features[{key!r}]", "needs 'dtype' and a 'shape' list",
                           "regenerate meta/info.json")
            else:
                self.features[key] = feat
        if any(f["dtype"] == "video" for f in self.features.values()) and "video_path" not in info:
            self.error("info_missing_keys", f"{path}: video_path", "video features exist but no video_path template",
                       "add video_path, e.g. videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
        self.info = info
        return True

    def feature_dim(self, key: str) -> int | None:
        try:
            return int(math.prod(int(s) for s in self.features[key]["shape"]))
        except (KeyError, TypeError, ValueError):
            return None

    def check_features(self) -> None:
        e, where = self.expect, f"{self.root}/meta/info.json: features"
        have = sorted(self.features)
        for role, key in (("action", e.action_key), ("state", e.state_key)):
            if key is None:
                continue
            if key not in self.features:
                self.error("feature_missing", f"{where}[{key!r}]", f"the recipe's {role} feature {key!r} is missing "
                           f"(have {have})", f"set data.{role}_key to an existing feature"
                           + (" or data.use_state = false" if role == "state" else ""))
                continue
            if self.features[key].get("dtype") in ("video", "image", "string"):
                self.error("feature_wrong_type", f"{where}[{key!r}]", f"{role} feature has dtype "
                           f"{self.features[key].get('dtype')!r}", "choose a numeric feature")
                continue
            dim = self.feature_dim(key)
            if dim is not None and dim > e.max_action_dim:
                self.error(f"{role}_dim_too_large", f"{where}[{key!r}]", f"{role} has {dim} channels but "
                           f"model.max_action_dim is {e.max_action_dim}", f"raise model.max_action_dim to at least {dim}")
        cameras = sorted(k for k, f in self.features.items() if f.get("dtype") in CAMERA_DTYPES)
        if not cameras:
            self.error("camera_missing", where, "the dataset has no camera (video or image) features",
                       "a world-action model needs video")
        for cam in e.camera_keys:
            if cam not in cameras:
                self.error("camera_missing", f"{where}[{cam!r}]", f"the recipe's camera {cam!r} is not a video or "
                           f"image feature (cameras: {cameras})", f"set data.camera_keys to a subset of {cameras}")
        if self.info is not None and self.fps is not None and e.fps and abs(e.fps - self.fps) > 1e-6:
            self.error("fps_mismatch", f"{self.root}/meta/info.json: fps", f"is {self.fps} but the recipe says "
                       f"data.fps = {e.fps}", "set data.fps to the dataset's fps (or 0 to take it from the dataset)")

    # ---- stats.json ------------------------------------------------------------------------------
    def check_stats(self) -> None:
        e = self.expect
        needs = [(e.action_key, e.normalization)]
        if e.state_key:
            needs.append((e.state_key, e.state_normalization or e.normalization))
        needs = [(k, m) for k, m in needs if m != "none"]
        path = self.root / "meta" / "stats.json"
        if not path.is_file():
            if needs:
                self.error("stats_missing", path, "meta/stats.json is missing but the recipe normalizes "
                           f"{[k for k, _ in needs]}", "run `wamkit data stats PATH` (wamkit.data.stats.write_stats)")
            return
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self.error("stats_invalid", path, f"invalid JSON: {exc}", "recompute with `wamkit data stats --overwrite`")
            return
        if not isinstance(raw, dict):
            self.error("stats_invalid", path, "top level is not an object", "recompute meta/stats.json")
            return
        from wamkit.data.stats import default_stat_keys

        unread = sorted(k for k in default_stat_keys({"features": self.features}) if k not in raw
                        and k not in (e.action_key, e.state_key))
        if unread:
            self.warn("stats_key_missing", path, f"no statistics for {unread}, features this recipe does not read "
                      "(a recipe that normalizes them would stop)", "recompute meta/stats.json (`wamkit data stats "
                      "PATH --overwrite`)")
        for key, mode in needs:
            if key not in raw:
                self.error("stats_key_missing", f'{path}: stats["{key}"]', f"no statistics for {key!r} (have "
                           f"{sorted(raw)})", "recompute meta/stats.json including this feature")
                continue
            fields = raw[key]
            if not isinstance(fields, dict):
                self.error("stats_invalid", f'{path}: stats["{key}"]', "is not an object of stat fields",
                           "recompute meta/stats.json")
                continue
            wanted = MODE_FIELDS.get(mode)
            if wanted is None:
                self.error("normalization_unknown", f"recipe normalization for {key!r}", f"{mode!r} is unknown",
                           f"use one of {sorted(MODE_FIELDS)}")
                continue
            if mode == "asinh" and "asinh_scale" in fields:
                wanted = ("asinh_scale",)
            self.stat_used[key] = set(wanted)
            values = {}
            for name in wanted:
                where = f'{path}: stats["{key}"]["{name}"]'
                if name not in fields:
                    self.error("stats_field_missing", where, f"field {name!r} needed by normalization {mode!r} is "
                               f"missing (have {sorted(fields)})", "recompute meta/stats.json with all fields")
                    continue
                try:
                    v = np.asarray(fields[name], dtype=np.float64).reshape(-1)
                except (TypeError, ValueError) as exc:
                    self.error("stats_invalid", where, f"not numeric: {exc}", "recompute meta/stats.json")
                    continue
                bad = np.flatnonzero(~np.isfinite(v))
                if bad.size:
                    c = int(bad[0])
                    self.error("stats_nonfinite", f"{where}[{c}]", f"is {v[c]} (NaN/inf) at channel {c} "
                               f"({bad.size} channel(s) bad)", "recompute stats; drop NaN/inf samples from the data")
                    continue
                dim = self.feature_dim(key)
                if dim is not None and v.size != dim:
                    self.error("stats_dim_mismatch", where, f"has {v.size} channels but info.json says {key!r} has "
                               f"{dim}", "recompute meta/stats.json for this dataset")
                    continue
                values[name] = v
            self._read_bounds(key, fields)
            self._check_range(path, key, mode, values)

    def _read_bounds(self, key: str, fields: dict) -> None:
        """Remember min/max and the moments (compared with the data later) and the channels the stats call
        constant; a field that does not parse is left out (reported by the field checks when the mode needs it)."""
        dim = self.feature_dim(key)
        self.stat_fields[key] = {}
        for name in ("min", "max", "mean", "std", "q01", "q99"):
            try:
                v = np.asarray(fields.get(name), dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                continue
            if name in fields and v.size == dim and np.isfinite(v).all():
                self.stat_fields[key][name] = v
        try:
            bounds = {n: np.asarray(fields[n], dtype=np.float64).reshape(-1) for n in ("min", "max") if n in fields}
            constant = constant_channels(fields)
        except (TypeError, ValueError):
            return
        self.stat_constants[key] = {c: v for c, v in constant.items() if dim is None or c < dim}
        if len(bounds) == 2 and all(b.size == dim and np.isfinite(b).all() for b in bounds.values()):
            self.stat_bounds[key] = (bounds["min"], bounds["max"])

    def _check_range(self, path: Path, key: str, mode: str, v: dict[str, np.ndarray]) -> None:
        """Zero or negative ranges, except on channels the stats record as constant (see check_stats_vs_data)."""
        constant = list(self.stat_constants.get(key, {}))
        if mode in ("minmax", "quantile"):
            lo, hi = MODE_FIELDS[mode]
            if lo in v and hi in v and v[lo].shape == v[hi].shape:
                ok = v[hi] > v[lo]
                ok[[c for c in constant if c < ok.size]] = True
                bad = np.flatnonzero(~ok)
                if bad.size:
                    c = int(bad[0])
                    self.error("stats_zero_range", f'{path}: stats["{key}"]["{hi}"][{c}]', f"{hi} ({v[hi][c]}) <= "
                               f"{lo} ({v[lo][c]}) at channel {c}: zero range divides by zero, and min/max say "
                               "the channel is not constant", "recompute meta/stats.json, or use 'minmax' or "
                               "'meanstd' for this feature")
        else:
            for name in ("std", "asinh_scale"):
                if name in v:
                    ok = v[name] > 0
                    ok[[c for c in constant if c < ok.size]] = True
                    bad = np.flatnonzero(~ok)
                    if bad.size:
                        c = int(bad[0])
                        self.error("stats_zero_range", f'{path}: stats["{key}"]["{name}"][{c}]', f"{name} is "
                                   f"{v[name][c]} at channel {c} (zero or negative)",
                                   "recompute meta/stats.json (a constant channel needs min == max)")

    def check_stats_vs_data(self) -> None:
        """Stats against the parquets: data outside [min, max] and a 'constant' channel that varies are
        errors; a channel constant in both is a warning naming its value (it trains and serves fine)."""
        path = self.root / "meta" / "stats.json"
        for key, constant in self.stat_constants.items():
            summary = self.data_summary.get(key)
            data = None if summary is None else (summary.lo, summary.hi)
            if data is not None and any(c >= data[0].size for c in constant):
                continue  # a width mismatch, reported on its own
            for c, value in sorted(constant.items()):
                where = f'{path}: stats["{key}"]["max"][{c}]'
                if data is not None and max(data[1][c] - value, value - data[0][c]) > \
                        CONSTANT_RTOL * max(1.0, abs(value)):
                    self.error("stats_zero_range", where, f"min == max == {value} says channel {c} of {key!r} is "
                               f"constant, but the data varies from {data[0][c]} to {data[1][c]} there",
                               "recompute meta/stats.json (`wamkit data stats PATH --overwrite`)")
                elif data is not None:
                    self.warn("constant_channel", f'{path}: stats["{key}"] channel {c}', f"channel {c} of {key!r} "
                              f"is constant at {value} in every frame (an unused gripper or a fixed joint?)",
                              f"nothing to fix: it is normalized to 0 and unnormalized back to exactly {value}; drop it "
                              "from the feature if the robot never moves it")
        for key, (lo, hi) in self.stat_bounds.items():
            summary = self.data_summary.get(key)
            data = None if summary is None else (summary.lo, summary.hi)
            if data is None or data[0].shape != lo.shape:
                continue
            tol = STATS_RANGE_RTOL * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi)))
            outside = np.flatnonzero((data[0] < lo - tol) | (data[1] > hi + tol))
            if outside.size:
                c = int(outside[0])
                self.error("stats_data_mismatch", f'{path}: stats["{key}"]["min"/"max"][{c}]', f"the data of "
                           f"{key!r} spans [{data[0][c]}, {data[1][c]}] at channel {c}, outside the stats' "
                           f"[{lo[c]}, {hi[c]}] ({outside.size} channel(s) outside)",
                           "recompute meta/stats.json for this data (`wamkit data stats PATH --overwrite`)")
        if self.report.codes("error") & PARTIAL_DATA:
            return  # the moments of the rows that were read say nothing about the stats of all of them
        for key, fields in self.stat_fields.items():
            if key in self.data_summary:
                self.report.findings += signals.stats_moment_findings(str(path), key, fields, self.data_summary[key],
                                                                      self.stat_used.get(key, set()))

    def check_outliers(self) -> None:
        """Glitch values in the action/state channels the recipe reads (after every data file was read)."""
        for key in (self.expect.action_key, self.expect.state_key):
            if key in self.data_summary:
                self.report.findings += signals.outlier_findings(f"{self.root}/data", key, self.data_summary[key])

    # ---- tasks ----------------------------------------------------------------------------------
    def check_tasks(self) -> None:
        import pyarrow.parquet as pq

        path = self.root / "meta" / "tasks.parquet"
        if not path.is_file():
            self.error("tasks_missing", path, "meta/tasks.parquet is missing", "regenerate meta/tasks.parquet")
            return
        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001
            self.error("tasks_invalid", path, f"cannot read parquet: {exc}", "regenerate meta/tasks.parquet")
            return
        if "task_index" not in table.column_names:
            self.error("tasks_invalid", path, f"no 'task_index' column (have {table.column_names})",
                       "regenerate meta/tasks.parquet")
            return
        self.tasks = {int(v) for v in table.column("task_index").to_pylist() if v is not None}
        total = (self.info or {}).get("total_tasks")
        if isinstance(total, int) and total != table.num_rows:
            self.warn("total_tasks_mismatch", f"{self.root}/meta/info.json: total_tasks", f"is {total} but "
                      f"meta/tasks.parquet has {table.num_rows} rows", "regenerate meta/info.json")

    # ---- meta/episodes --------------------------------------------------------------------------
    def check_episodes(self) -> None:
        import pyarrow.parquet as pq

        folder = self.root / "meta" / "episodes"
        files = sorted(folder.glob("*/*.parquet"))
        if not files:
            self.error("episodes_missing", folder, "no episode metadata parquet files",
                       "regenerate meta/episodes/chunk-XXX/file-XXX.parquet")
            return
        cams = [k for k, f in self.features.items() if f.get("dtype") == "video"]
        needed = list(EPISODE_REQUIRED) + [f"videos/{c}/{f}" for c in cams for f in VIDEO_FIELDS]
        counts: dict[int, list[str]] = defaultdict(list)
        for path in files:
            try:
                table = pq.read_table(path)
            except Exception as exc:  # noqa: BLE001
                self.error("episodes_invalid", path, f"cannot read parquet: {exc}", "regenerate the episode metadata")
                continue
            missing = [c for c in needed if c not in table.column_names]
            if missing:
                self.error("episodes_invalid", path, f"missing columns {missing}", "regenerate the episode metadata")
                if any(c in missing for c in EPISODE_REQUIRED):
                    continue
            for row in table.to_pylist():
                if row.get("episode_index") is None or row.get("length") is None:
                    self.error("episodes_invalid", path, f"row with null episode_index/length: {row}",
                               "regenerate the episode metadata")
                    continue
                ep = int(row["episode_index"])
                counts[ep].append(str(path))
                if ep not in self.episodes:
                    self.episodes[ep], self.episode_source[ep] = row, str(path)
        for ep, where in sorted(counts.items()):
            if len(where) > 1:
                self.error("episode_index_duplicate", f"{where[0]}: episode_index", f"episode_index {ep} appears "
                           f"{len(where)} times (in {sorted(set(where))})", "deduplicate meta/episodes")
        if self.episodes:
            present = sorted(self.episodes)
            gaps = sorted(set(range(present[-1] + 1)) - set(present))
            if gaps:
                self.error("episode_index_gap", f"{folder}: episode_index", f"episode indices are not 0..{present[-1]}: "
                           f"missing {gaps[:10]}{' ...' if len(gaps) > 10 else ''}",
                           "re-export the dataset or renumber episodes contiguously from 0")
            total = self.info.get("total_episodes") if self.info else None
            if isinstance(total, int) and total != len(present):
                self.warn("total_episodes_mismatch", f"{self.root}/meta/info.json: total_episodes", f"is {total} but "
                          f"meta/episodes lists {len(present)}", "regenerate meta/info.json")
            frames = (self.info or {}).get("total_frames")
            lengths = sum(int(r["length"]) for r in self.episodes.values())
            if isinstance(frames, int) and frames != lengths:
                self.warn("total_frames_mismatch", f"{self.root}/meta/info.json: total_frames", f"is {frames} but "
                          f"the episodes in meta/episodes hold {lengths} frames", "regenerate meta/info.json")
            for ep, row in self.episodes.items():
                if int(row["length"]) <= 0:
                    self.error("episodes_invalid", f"{self.episode_source[ep]}: length[{ep}]", "episode has no frames",
                               "drop the empty episode")
                tasks = row.get("tasks")
                if not tasks:
                    self.warn("episode_no_task", f"{self.episode_source[ep]}: tasks[{ep}]", "episode has no task text",
                              "annotate a task")

    def check_lengths(self) -> None:
        if not self.episodes:
            return
        need = self.expect.chunk_length + 1
        lengths = {ep: int(r["length"]) for ep, r in self.episodes.items()}
        short = sorted(ep for ep, n in lengths.items() if n < need)
        where = f"{self.root}/meta/episodes: length"
        if len(short) == len(lengths):
            self.error("no_episode_long_enough", where, f"no episode has {need} frames for chunk_length="
                       f"{self.expect.chunk_length} (longest has {max(lengths.values())})",
                       f"lower data.chunk_length to at most {max(max(lengths.values()) - 1, 0)} or add longer episodes")
        elif short:
            self.warn("episode_too_short", where, f"{len(short)} of {len(lengths)} episodes are shorter than "
                      f"chunk_length+1 = {need} and will be skipped: {short[:10]}{' ...' if len(short) > 10 else ''}",
                      "lower data.chunk_length to use them")

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

    # ---- data parquet ---------------------------------------------------------------------------
    def check_data(self) -> None:
        by_file: dict[Path, list[int]] = defaultdict(list)
        for ep, row in sorted(self.episodes.items()):
            try:
                p = self._format("data_path", chunk_index=int(row["data/chunk_index"]),
                                 file_index=int(row["data/file_index"]))
            except (TypeError, ValueError):
                self.error("episodes_invalid", f"{self.episode_source[ep]}: data/chunk_index[{ep}]",
                           "chunk/file index is not an integer", "regenerate the episode metadata")
                continue
            if p is None:
                return
            by_file[p].append(ep)
        for path, eps in by_file.items():
            self.guarded(f"data file {path.name}", lambda path=path, eps=eps: self._check_data_file(path, eps))

    def _check_data_file(self, path: Path, eps: list[int]) -> None:
        import pyarrow.parquet as pq

        from wamkit.data.lerobot_v3 import column_to_numpy

        if not path.is_file():
            self.error("data_file_missing", path, f"data parquet referenced by meta/episodes (episodes {eps[:10]}) "
                       "is missing", "restore the file or re-export the dataset")
            return
        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001
            self.error("data_file_unreadable", path, f"cannot read parquet: {exc}", "re-export the dataset")
            return
        cols: dict[str, np.ndarray] = {}
        want = ["episode_index", "frame_index", "timestamp", "task_index", self.expect.action_key]
        if self.expect.state_key:
            want.append(self.expect.state_key)
        for key in want:
            if key not in table.column_names:
                if key in self.features or key in ("episode_index", "frame_index", "timestamp"):
                    self.error("data_column_missing", f"{path}[{key!r}]", f"column missing (have {table.column_names})",
                               "re-export the dataset with this column")
                continue
            try:
                cols[key] = column_to_numpy(table, key, str(path))
            except DataError as exc:
                self.error("data_column_invalid", exc.where, exc.problem, exc.fix)
        self._check_other_columns(path, table)
        if "episode_index" not in cols or "frame_index" not in cols:
            return
        epi, fi = cols["episode_index"].astype(np.int64), cols["frame_index"].astype(np.int64)
        index = table.column("index").to_numpy() if "index" in table.column_names else None
        unknown = sorted(set(np.unique(epi).tolist()) - set(self.episodes))
        if unknown:
            self.error("data_episode_unknown", f"{path}: episode_index", f"rows of episodes {unknown[:10]} that "
                       "meta/episodes does not list", "re-export the dataset; data and meta/episodes disagree")
        for ep in eps:
            rows = np.flatnonzero(epi == ep)
            rows = rows[np.argsort(fi[rows], kind="stable")]
            length = int(self.episodes[ep]["length"])
            where = f"{path}: episode {ep}"
            if len(rows) != length:
                self.error("row_count_mismatch", where, f"has {len(rows)} rows but meta/episodes length is {length}",
                           "re-export the dataset; data parquet and meta/episodes disagree")
            frames = fi[rows]
            expected = np.arange(len(rows))
            if not np.array_equal(frames, expected):
                k = int(np.flatnonzero(frames != expected)[0])
                self.error("frame_index_gap", f"{path}: frame_index (episode {ep})", f"frame_index is not 0..{len(rows)-1}"
                           f" without gaps/duplicates: at position {k} found {int(frames[k])}, expected {k}",
                           "re-export the episode; frames are missing or duplicated")
            if "timestamp" in cols and self.fps and len(rows):
                ts = cols["timestamp"][rows].astype(np.float64)
                dev = np.abs(ts - frames / self.fps)
                worst = int(np.argmax(dev))
                if dev[worst] > TIMESTAMP_ERROR_PERIODS / self.fps or not np.isfinite(dev[worst]):
                    self.error("timestamp_mismatch", f"{path}: timestamp (episode {ep})", f"timestamp {ts[worst]:.6f}s"
                               f" at frame_index {int(frames[worst])} but frame_index / fps = "
                               f"{frames[worst] / self.fps:.6f}s (fps {self.fps})",
                               "fix info.json fps or re-export timestamps as frame_index / fps")
                elif dev[worst] > TIMESTAMP_WARN_S:
                    self.warn("timestamp_drift", f"{path}: timestamp (episode {ep})", f"timestamps drift up to "
                              f"{dev[worst]:.2e}s from frame_index / fps", "re-export timestamps as frame_index / fps")
            for role, key in (("action", self.expect.action_key), ("state", self.expect.state_key)):
                if key is None or key not in cols:
                    continue
                x = np.asarray(cols[key][rows], dtype=np.float64).reshape(len(rows), -1)
                bad = np.argwhere(~np.isfinite(x))
                if bad.size:
                    r, c = (int(v) for v in bad[0])
                    self.error(f"{role}_nan", f"{path}[{key!r}] (episode {ep})", f"{len(bad)} NaN/inf value(s), first "
                               f"at frame_index {int(frames[r])} channel {c}",
                               "repair or drop those frames (training windows over them would be NaN)")
                dim = self.feature_dim(key)
                if dim is not None and x.shape[1] != dim and len(rows):
                    self.error("data_dim_mismatch", f"{path}[{key!r}]", f"rows have {x.shape[1]} values but info.json "
                               f"says {dim}", "fix meta/info.json features or re-export the data")
                elif len(rows):
                    self._note_bounds(key, x, ep)
                    if role == "action":
                        self.report.findings += signals.frozen_findings(str(path), key, ep, x)
            self._check_index(path, ep, rows, frames, index)
            if "task_index" in cols and self.tasks is not None and len(rows):
                unknown_t = sorted(set(np.unique(cols["task_index"][rows]).tolist()) - self.tasks)
                if unknown_t:
                    self.error("task_index_unknown", f"{path}: task_index (episode {ep})", f"task_index values "
                               f"{unknown_t} are not in meta/tasks.parquet (has {sorted(self.tasks)})",
                               "add the tasks to meta/tasks.parquet or fix task_index")

    def _note_bounds(self, key: str, x: np.ndarray, ep: int) -> None:
        """Running per-channel summary of the finite values (NaN/inf are reported on their own)."""
        summary, have = ChannelSummary.of(x, ep), self.data_summary.get(key)
        self.data_summary[key] = summary if have is None or have.lo.shape != summary.lo.shape else have.merge(summary)

    def _check_index(self, path: Path, ep: int, rows: np.ndarray, frames: np.ndarray, index) -> None:
        """The global `index` column is where LeRobot's reader looks a frame up (meta/episodes
        dataset_from_index + frame_index): wamkit reads by episode_index, LeRobot would read other rows."""
        start = self.episodes[ep].get("dataset_from_index")
        if index is None or start is None or not len(rows):
            return
        off = np.flatnonzero(index[rows] != int(start) + frames)
        if off.size:
            k = int(off[0])
            self.warn("index_mismatch", f"{path}: index (episode {ep})", f"index is {int(index[rows][k])} at "
                      f"frame_index {int(frames[k])} but meta/episodes dataset_from_index + frame_index = "
                      f"{int(start) + int(frames[k])} ({off.size} row(s) off): LeRobot's reader would return other "
                      "frames", "re-export the dataset (or renumber index to dataset_from_index + frame_index)")

    def _check_other_columns(self, path: Path, table) -> None:
        """Columns besides the recipe's action/state: embedded camera frames (errors: training decodes
        them), stored types that disagree with info.json, declared features the file lacks and
        NaN in features the recipe does not read (warnings)."""
        from wamkit.data.lerobot_v3 import column_to_numpy

        e, names = self.expect, table.column_names
        for key, feat in self.features.items():
            dtype = feat.get("dtype")
            if dtype == "video":
                continue
            if key not in names:
                if dtype == "image" or key in (e.action_key, e.state_key, "episode_index", "frame_index", "timestamp"):
                    if dtype == "image":
                        self.error("data_column_missing", f"{path}[{key!r}]", f"the camera's embedded frames are "
                                   f"missing (have {names})", "re-export the dataset with this camera")
                    continue
                self.warn("data_column_missing", f"{path}[{key!r}]", "feature declared in meta/info.json is not a "
                          "column of this file (the recipe does not read it)", "drop it from info.json features")
                continue
            if dtype == "image":
                cells = table.column(key).to_pylist()
                frames = table.column("frame_index").to_numpy() if "frame_index" in names else np.arange(len(cells))
                self.report.findings += signals.image_cell_findings(f"{path}[{key!r}]", cells, frames, feat["shape"])
                continue
            stored = table.schema.field(key).type
            stored = getattr(stored, "value_type", stored)
            if dtype in ARROW_FLOATS and str(stored) in ARROW_FLOATS.values() and str(stored) != ARROW_FLOATS[dtype]:
                self.warn("data_dtype_mismatch", f"{path}[{key!r}]", f"stored as {stored} but meta/info.json "
                          f"says {dtype} (files of merged datasets?)", "re-export the files with one dtype")
            if key in (e.action_key, e.state_key) or dtype not in ARROW_FLOATS:
                continue
            try:
                x = np.asarray(column_to_numpy(table, key, str(path)), dtype=np.float64)
            except (DataError, ValueError, TypeError):
                continue
            if not np.isfinite(x).all():
                self.warn("unused_nan", f"{path}[{key!r}]", f"{int((~np.isfinite(x)).sum())} NaN/inf value(s) in a "
                          "feature this recipe does not read", "repair the feature before a recipe reads it")

    # ---- videos ---------------------------------------------------------------------------------
    def check_videos(self) -> None:
        cams = self.expect.camera_keys or sorted(k for k, f in self.features.items() if f.get("dtype") == "video")
        cams = [c for c in cams if self.features.get(c, {}).get("dtype") == "video"]
        for cam in cams:
            by_file: dict[Path, list[int]] = defaultdict(list)
            for ep, row in sorted(self.episodes.items()):
                if any(f"videos/{cam}/{f}" not in row or row[f"videos/{cam}/{f}"] is None for f in VIDEO_FIELDS):
                    continue  # reported by check_episodes
                p = self._format("video_path", video_key=cam, chunk_index=int(row[f"videos/{cam}/chunk_index"]),
                                 file_index=int(row[f"videos/{cam}/file_index"]))
                if p is None:
                    return
                by_file[p].append(ep)
            for path, eps in by_file.items():
                self.guarded(f"video {path.name}", lambda cam=cam, path=path, eps=eps: self._check_video(cam, path, eps))

    def _check_video(self, cam: str, path: Path, eps: list[int]) -> None:
        import av

        if not path.is_file():
            self.error("video_file_missing", path, f"video of {cam!r} referenced by meta/episodes (episodes "
                       f"{eps[:10]}) is missing", "restore the file or re-export the dataset videos")
            return
        spans = {ep: (float(self.episodes[ep][f"videos/{cam}/from_timestamp"]),
                      float(self.episodes[ep][f"videos/{cam}/to_timestamp"])) for ep in eps}
        fps = self.fps or 0.0
        for ep, (t0, t1) in spans.items():
            length = int(self.episodes[ep]["length"])
            if not (math.isfinite(t0) and math.isfinite(t1)) or t1 <= t0 or t0 < 0:
                self.error("video_span_invalid", f"{self.episode_source[ep]}: videos/{cam}/from,to_timestamp[{ep}]",
                           f"[{t0}, {t1}] is not a valid time range", "regenerate the episode metadata")
            elif fps and abs((t1 - t0) * fps - length) > 1.0:
                self.warn("video_span_length_mismatch", f"{self.episode_source[ep]}: videos/{cam}/to_timestamp[{ep}]",
                          f"[{t0:.3f}, {t1:.3f}]s is {(t1 - t0) * fps:.1f} frames at {fps} fps but the episode has "
                          f"{length}", "regenerate the episode metadata")
        try:
            container = av.open(str(path))
        except Exception as exc:  # noqa: BLE001
            self.error("video_undecodable", path, f"cannot open video: {exc}", "re-encode the video (H.264 or AV1 mp4)")
            return
        try:
            if not container.streams.video:
                self.error("video_undecodable", path, "file has no video stream", "re-export the dataset videos")
                return
            stream = container.streams.video[0]
            self._check_video_shape(cam, path, stream)
            tb = float(stream.time_base)
            t_need = max(t1 for _, t1 in spans.values())
            period = 1.0 / fps if fps else (1.0 / float(stream.average_rate) if stream.average_rate else 0.0)
            try:
                first = next((f for f in container.decode(stream) if f.pts is not None), None)
                if first is None:
                    self.error("video_undecodable", path, "no frame could be decoded", "re-encode the video")
                    return
                # seek to the keyframe before the latest needed time, decode to the end: the last real frame
                container.seek(int(max(t_need - 2 * period - 1.0, 0.0) / tb), stream=stream, backward=True,
                               any_frame=False)
                last = None
                for frame in container.decode(stream):
                    if frame.pts is not None:
                        last = frame.pts * tb if last is None else max(last, frame.pts * tb)
            except av.FFmpegError as exc:
                self.error("video_undecodable", path, f"decoding failed: {exc}", "re-encode the video")
                return
            if last is None:
                self.error("video_undecodable", path, "no frame decoded after seeking near the end", "re-encode the video")
                return
            end = last + period  # the last frame is shown for one period
            short = sorted(ep for ep, (_, t1) in spans.items() if end < t1 - 0.5 * period - 1e-6)
            if short:
                ep = short[0]
                self.error("video_too_short", f"{path} (episode {ep})", f"video ends at {end:.3f}s (last frame at "
                           f"{last:.3f}s) but meta/episodes to_timestamp of episode {ep} is {spans[ep][1]:.3f}s "
                           f"({len(short)} episode(s) not covered)",
                           "re-encode the full video or fix from/to_timestamp in meta/episodes")
            if fps and stream.average_rate and abs(float(stream.average_rate) - fps) > 0.01 * fps:
                self.warn("video_fps_mismatch", path, f"stream rate is {float(stream.average_rate):.3f} fps but "
                          f"info.json fps is {fps}", "re-encode at the dataset fps")
        finally:
            container.close()

    def _check_video_shape(self, cam: str, path: Path, stream) -> None:
        """The loader decodes into buffers of info.json's shape and refuses frames of another size."""
        shape = list(self.features[cam].get("shape", []))
        h, w = stream.codec_context.height, stream.codec_context.width
        if h and w and shape not in ([h, w, 3], [3, h, w]):
            self.error("video_shape_mismatch", path, f"frames are {h}x{w} but meta/info.json says {cam!r} has "
                       f"shape {shape}", f"set features[{cam!r}]['shape'] to [{h}, {w}, 3] or re-encode the video")

    # ---- run ------------------------------------------------------------------------------------
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
