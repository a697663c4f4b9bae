"""The doctor's checks of meta/: info.json, its features against the recipe, tasks.parquet, meta/episodes."""

from __future__ import annotations

import json
import math
from collections import defaultdict

from wamkit.data.doctor_base import EPISODE_REQUIRED, INFO_REQUIRED, VIDEO_FIELDS, DoctorBase
from wamkit.data.lerobot_v3 import CAMERA_DTYPES, check_templates, check_version
from wamkit.errors import DataError


class MetaChecks(DoctorBase):
    """info.json, features, tasks and episode metadata."""

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
