"""The doctor's checks of the data parquets: rows against meta/episodes, frame indices, timestamps, NaN, columns."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from wamkit.data import doctor_signals as signals
from wamkit.data.doctor_base import ARROW_FLOATS, TIMESTAMP_ERROR_PERIODS, TIMESTAMP_WARN_S, DoctorBase
from wamkit.data.doctor_signals import ChannelSummary
from wamkit.errors import DataError


class DataChecks(DoctorBase):
    """Every data file the episodes reference, read once; summaries kept for the stats checks."""

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
