"""Read a LeRobot v3.0 dataset from disk.

v3.0 packs many episodes into each data parquet and each mp4, and keeps the per-episode offsets in
``meta/episodes/*/*.parquet``. This reader resolves an episode to its rows and its time range in the
shared mp4, so training code can ask for "episode 7, frames 10..26" without knowing the layout.
Every malformed input raises :class:`DataError` naming the file or field at fault.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from wamkit.config.lerobot_home import hf_lerobot_home
from wamkit.data.episode_frames import DecodedEpisodes, fits
from wamkit.data.video import decode_at_times, decode_images
from wamkit.errors import DataError

EPISODE_COLUMNS = (
    "episode_index",
    "tasks",
    "length",
    "data/chunk_index",
    "data/file_index",
    "dataset_from_index",
    "dataset_to_index",
)
VIDEO_EPISODE_FIELDS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
CAMERA_DTYPES = ("video", "image")  # image: frames embedded in the data parquet (LeRobot's use_videos=False)
INFO_KEYS = ("codebase_version", "fps", "features", "data_path")
_MAX_CACHED_FILES = 8


def read_parquet(path: Path) -> pa.Table:
    """Read a parquet file, turning a missing/corrupt file into a DataError that names it."""
    if not path.is_file():
        raise DataError(str(path), "parquet file is missing", "restore the file or re-export the dataset")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(str(path), f"cannot read parquet: {exc}", "re-export the dataset") from exc


def column_to_numpy(table: pa.Table, name: str, where: str) -> np.ndarray:
    """Convert a scalar, fixed-size-list or equal-length-list column to a numpy array ([N] or [N, D])."""
    if name not in table.column_names:
        raise DataError(where, f"column {name!r} is missing (have {table.column_names})",
                        "re-export the dataset with this feature")
    arr = table.column(name).combine_chunks()
    if arr.null_count:
        raise DataError(f"{where}[{name!r}]", f"{arr.null_count} null values", "re-export without missing values")
    kind = arr.type
    if pa.types.is_fixed_size_list(kind):
        return arr.flatten().to_numpy(zero_copy_only=False).reshape(len(arr), kind.list_size)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        if len(arr) == 0:
            return np.zeros((0, 0), dtype=np.float32)
        if (lengths != lengths[0]).any():
            raise DataError(f"{where}[{name!r}]", f"rows have different lengths {sorted(set(lengths.tolist()))}",
                            "store every row of a vector feature with the same length")
        return arr.flatten().to_numpy(zero_copy_only=False).reshape(len(arr), int(lengths[0]))
    return arr.to_numpy(zero_copy_only=False)


def image_bytes(table: pa.Table, name: str, where: str) -> np.ndarray:
    """The encoded frames of an `image` feature: LeRobot embeds each frame as struct<bytes, path>."""
    if name not in table.column_names:
        raise DataError(where, f"column {name!r} is missing (have {table.column_names})",
                        "re-export the dataset with this feature")
    arr = table.column(name).combine_chunks()
    if not pa.types.is_struct(arr.type) or arr.type.get_field_index("bytes") < 0:
        raise DataError(f"{where}[{name!r}]", f"is {arr.type}, not LeRobot's struct<bytes, path> image column",
                        "re-export the dataset with LeRobot (features[...]['dtype'] = 'image')")
    data = arr.field("bytes")
    if data.null_count:
        raise DataError(f"{where}[{name!r}]", f"{data.null_count} frames hold only a path, not their bytes",
                        "embed the images: re-save the dataset with LeRobot (finalize() embeds them)")
    return data.to_numpy(zero_copy_only=False)


CONVERTER = "python -m lerobot.datasets.v30.convert_dataset_v21_to_v30"  # LeRobot >= 0.4


def convert_fix(root: Path, version: str) -> str:
    """How to turn an older LeRobot dataset into v3.0: LeRobot's own converter, which converts
    `<--root>/<--repo-id>` in place (keeping the original as `<name>_old`); --push-to-hub=false, or it
    would push the result to the hub. Inside LeRobot's cache the repo id is the path below it."""
    root = Path(root).resolve()
    try:
        repo_id = root.relative_to(hf_lerobot_home().resolve()).as_posix()
    except ValueError:
        repo_id = root.name
    parent = Path(str(root)[: -len(repo_id)].rstrip("/") or "/")
    older = "" if version == "v2.1" else " (the converter reads v2.1: bring older datasets to v2.1 first)"
    return (f"convert it to LeRobot v3.0 in place with LeRobot 0.4+: `{CONVERTER} --repo-id={repo_id} "
            f"--root={parent} --push-to-hub=false` (the original is kept as {root.name}_old){older}")


def check_version(path: Path, info: dict[str, Any]) -> None:
    """A v2.x (or older) dataset is refused before anything else: its layout (episodes.jsonl, one parquet
    per episode) is not v3.0's, so every later error would mislead."""
    root = path.parent.parent
    version = str(info.get("codebase_version", ""))
    if "codebase_version" in info and not version.startswith("v3."):
        raise DataError(f"{path}: codebase_version", f"is {version!r}: a LeRobot {version} dataset; wamkit reads "
                        "v3.x", convert_fix(root, version))
    if "codebase_version" not in info and (root / "meta" / "episodes.jsonl").is_file():
        raise DataError(f"{path}: codebase_version", "is missing and meta/episodes.jsonl exists: a LeRobot v2.x "
                        "layout; wamkit reads v3.x", convert_fix(root, "v2.x"))


def check_templates(path: Path, info: dict[str, Any]) -> None:
    """data_path/video_path are relative to the dataset root. An absolute one names the files of wherever
    the dataset was written: on another machine they are missing, and where they exist they may be
    another dataset's, read in place of this one's."""
    for key, example in (("data_path", "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
                         ("video_path", "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")):
        template = info.get(key)
        if isinstance(template, str) and (template.startswith("/") or Path(template).is_absolute()):
            raise DataError(f"{path}: {key}", f"{template!r} is an absolute path, not relative to the dataset "
                            f"root {path.parent.parent}", f"set it to LeRobot's relative template {example!r}")


def load_info(root: Path) -> dict[str, Any]:
    """Load and check meta/info.json: it is the contract for every other file."""
    path = root / "meta" / "info.json"
    if not path.is_file():
        raise DataError(str(path), "meta/info.json is missing; this is not a LeRobot v3.0 dataset root",
                        "point the recipe at the dataset root (the folder holding meta/, data/, videos/)")
    try:
        info = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(str(path), f"invalid JSON: {exc}", "fix or regenerate meta/info.json") from exc
    if not isinstance(info, dict):
        raise DataError(str(path), f"top level is {type(info).__name__}, not an object", "regenerate meta/info.json")
    check_version(path, info)
    check_templates(path, info)
    missing = [k for k in INFO_KEYS if k not in info]
    if missing:
        raise DataError(str(path), f"missing keys {missing}", "regenerate meta/info.json with LeRobot v3.0")
    for key, feat in info["features"].items():
        if not isinstance(feat, dict) or "dtype" not in feat or "shape" not in feat:
            raise DataError(f"{path}: features[{key!r}]", "needs 'dtype' and 'shape'", "regenerate meta/info.json")
    if any(f["dtype"] == "video" for f in info["features"].values()) and "video_path" not in info:
        raise DataError(f"{path}: video_path", "video features exist but no video_path template",
                        "add video_path, e.g. videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
    return info


def load_stats(root: Path) -> dict[str, dict[str, np.ndarray]] | None:
    """Load meta/stats.json if present; normalizers validate what they need later."""
    path = root / "meta" / "stats.json"
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(str(path), f"invalid JSON: {exc}", "recompute meta/stats.json") from exc
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, fields in raw.items():
        if not isinstance(fields, dict):
            raise DataError(f"{path}: [{key!r}]", "expected a dict of stat fields", "recompute meta/stats.json")
        try:
            stats[key] = {name: np.asarray(value, dtype=np.float64) for name, value in fields.items()}
        except (TypeError, ValueError) as exc:
            raise DataError(f"{path}: [{key!r}]", f"non-numeric stats: {exc}", "recompute meta/stats.json") from exc
    return stats


def load_tasks(root: Path) -> dict[int, str]:
    """Load meta/tasks.parquet (task string <-> task_index); the string may be a column or the pandas index."""
    path = root / "meta" / "tasks.parquet"
    table = read_parquet(path)
    text_col = next((c for c in ("task", "__index_level_0__") if c in table.column_names), None)
    if text_col is None or "task_index" not in table.column_names:
        raise DataError(str(path), f"needs a 'task' (or index) column and 'task_index'; have {table.column_names}",
                        "regenerate meta/tasks.parquet")
    return dict(zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist()))


def load_episodes(root: Path, video_keys: Sequence[str]) -> dict[int, dict[str, Any]]:
    """Load every meta/episodes/*/*.parquet (sorted) into {episode_index: row}."""
    files = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    if not files:
        raise DataError(str(root / "meta" / "episodes"), "no episode metadata parquet files",
                        "regenerate meta/episodes/chunk-XXX/file-XXX.parquet")
    needed = list(EPISODE_COLUMNS) + [f"videos/{k}/{f}" for k in video_keys for f in VIDEO_EPISODE_FIELDS]
    episodes: dict[int, dict[str, Any]] = {}
    for path in files:
        table = read_parquet(path)
        missing = [c for c in needed if c not in table.column_names]
        if missing:
            raise DataError(str(path), f"missing columns {missing}", "regenerate the episode metadata")
        for row in table.select(needed).to_pylist():
            ep = int(row["episode_index"])
            if ep in episodes:
                raise DataError(str(path), f"episode_index {ep} appears twice", "deduplicate meta/episodes")
            episodes[ep] = row
    return episodes


class LeRobotV3Dataset:
    """Random access to episodes, their columns and their video frames of a LeRobot v3.0 dataset."""

    def __init__(self, root: str | Path, expected_fps: float = 0.0):
        """`expected_fps` (the recipe's data.fps; 0 = any) must equal info.json's fps."""
        self.root = Path(root)
        self.info = load_info(self.root)
        try:
            self.fps = float(self.info["fps"])
        except (TypeError, ValueError) as exc:
            raise DataError(f"{self.root}/meta/info.json: fps", f"is {self.info['fps']!r}, not a number",
                            "set the dataset's real fps") from exc
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise DataError(f"{self.root}/meta/info.json: fps", f"is {self.fps}, not a positive number",
                            "set the dataset's real fps")
        if expected_fps and abs(float(expected_fps) - self.fps) > 1e-6:
            raise DataError(f"{self.root}/meta/info.json: fps", f"is {self.fps} but the recipe says data.fps = "
                            f"{expected_fps}", "set data.fps to the dataset's fps (or 0 to take it from the dataset)")
        self.features: dict[str, dict[str, Any]] = self.info["features"]
        self.camera_keys = sorted(k for k, f in self.features.items() if f["dtype"] in CAMERA_DTYPES)
        self.video_keys = [k for k in self.camera_keys if self.features[k]["dtype"] == "video"]
        self.stats = load_stats(self.root)
        self.tasks = load_tasks(self.root)
        self._episodes = load_episodes(self.root, self.video_keys)
        self.episode_indices = sorted(self._episodes)
        self._files: OrderedDict[Path, dict[str, Any]] = OrderedDict()
        self._decoded: DecodedEpisodes | None = None  # enable_frame_cache

    def __getstate__(self) -> dict[str, Any]:
        """Drop the column and frame caches when pickled into DataLoader workers (each worker refills its own)."""
        state = dict(self.__dict__)
        state["_files"] = OrderedDict()
        state["_decoded"] = self._decoded.empty_copy() if self._decoded is not None else None
        return state

    def decoded_video_bytes(self) -> int:
        """Bytes of every video frame of every episode decoded to RGB (uint8)."""
        per_frame = sum(int(np.prod(self.frame_size(k))) * 3 for k in self.video_keys)
        return per_frame * sum(self.episode_length(ep) for ep in self.episode_indices)

    def enable_frame_cache(self, budget_mb: float) -> bool:
        """Keep whole decoded episodes in each reading process when all of them fit `budget_mb`
        (wamkit.data.episode_frames); returns whether they do (and the cache is on)."""
        on = fits(self.decoded_video_bytes(), budget_mb)
        self._decoded = DecodedEpisodes(int(budget_mb * 2**20)) if on else None
        return on

    # ---- metadata -------------------------------------------------------------------------------
    def _episode(self, ep: int) -> dict[str, Any]:
        if ep not in self._episodes:
            raise DataError(f"{self.root}/meta/episodes", f"episode {ep} not found",
                            f"use one of the {len(self.episode_indices)} episodes in dataset.episode_indices")
        return self._episodes[ep]

    def episode_length(self, ep: int) -> int:
        return int(self._episode(ep)["length"])

    def episode_task(self, ep: int) -> str:
        """The episode's task text (first of its 'tasks'; LeRobot episodes have one task)."""
        tasks = self._episode(ep)["tasks"]
        if not tasks:
            raise DataError(f"{self.root}/meta/episodes: tasks[{ep}]", "episode has no task", "annotate a task")
        return str(tasks[0])

    def frame_task(self, ep: int, frame: int) -> str:
        """The task of one frame, from its task_index (as LeRobot gives each item its frame's task): an
        episode's task may change mid-episode, and meta/episodes 'tasks' lists them unordered."""
        if len(self._episode(ep)["tasks"]) == 1:  # one task: no need to read the column
            return self.episode_task(ep)
        path = self._data_path(ep)
        cached = self._file_columns(path, ["task_index"])
        index = int(cached["cols"]["task_index"][self._episode_rows(path, cached, ep)[frame]])
        if index not in self.tasks:
            raise DataError(f"{path}: task_index (episode {ep}, frame {frame})", f"is {index}, which "
                            f"meta/tasks.parquet does not list (it has {sorted(self.tasks)})",
                            "regenerate meta/tasks.parquet or fix the task_index column")
        return str(self.tasks[index])

    def _feature(self, key: str) -> dict[str, Any]:
        if key not in self.features:
            raise DataError(f"{self.root}/meta/info.json: features", f"feature {key!r} is missing "
                            f"(have {sorted(self.features)})", "choose an existing feature key in the recipe")
        return self.features[key]

    def feature_dim(self, key: str) -> int:
        """Flattened size of one frame's value of a non-video feature."""
        return int(math.prod(self._feature(key)["shape"]))

    def channel_names(self, key: str) -> list[str]:
        """The names of a non-video feature's channels (info.json features[key]['names'], a list or LeRobot's
        {"motors": [...]}); channel numbers where it has none."""
        names = self.features.get(key, {}).get("names")
        if isinstance(names, dict):
            names = next((v for v in names.values() if isinstance(v, list)), None)
        dim = self.feature_dim(key)
        return [str(n) for n in names] if isinstance(names, list) and len(names) == dim else [f"axis {i}" for i in range(dim)]

    # ---- tabular data ---------------------------------------------------------------------------
    def _format(self, template_key: str, **fields: Any) -> Path:
        """Fill a path template from info.json; unknown placeholders are a metadata error, not a KeyError."""
        template = self.info[template_key]
        try:
            return self.root / template.format(**fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise DataError(f"{self.root}/meta/info.json: {template_key}", f"template {template!r} cannot be "
                            f"filled with {sorted(fields)}: {exc!r}", "use the LeRobot v3.0 path templates") from exc

    def _data_path(self, ep: int) -> Path:
        row = self._episode(ep)
        return self._format("data_path", chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])

    def _file_columns(self, path: Path, keys: Sequence[str]) -> dict[str, Any]:
        """Whole-file numpy columns and per-episode row indices, cached per data file (LRU)."""
        cached = self._files.get(path)
        if cached is None or any(k not in cached["cols"] for k in keys):
            table = read_parquet(path)
            cached = cached or {"cols": {}, "rows": {}}
            for key in ("episode_index", "frame_index", *keys):
                if key not in cached["cols"]:
                    image = self.features.get(key, {}).get("dtype") == "image"
                    cached["cols"][key] = (image_bytes if image else column_to_numpy)(table, key, str(path))
            self._files[path] = cached
        self._files.move_to_end(path)
        while len(self._files) > _MAX_CACHED_FILES:
            self._files.popitem(last=False)
        return cached

    def _episode_rows(self, path: Path, cached: dict[str, Any], ep: int) -> np.ndarray:
        """Row numbers of episode `ep` in its data file, ordered by frame_index and checked against its length."""
        if ep in cached["rows"]:
            return cached["rows"][ep]
        cols = cached["cols"]
        rows = np.flatnonzero(cols["episode_index"] == ep)
        rows = rows[np.argsort(cols["frame_index"][rows], kind="stable")]
        length = self.episode_length(ep)
        frames = cols["frame_index"][rows]
        if len(rows) == length and not np.array_equal(frames, np.arange(length)):
            k = int(np.flatnonzero(frames != np.arange(length))[0])
            raise DataError(f"{path}: frame_index (episode {ep})", f"is not 0..{length - 1} without gaps/duplicates: "
                            f"at position {k} found {int(frames[k])}, expected {k}",
                            "re-export the episode; frames are missing or duplicated")
        if len(rows) != length:
            raise DataError(f"{path}: episode {ep}", f"has {len(rows)} rows (frame_index "
                            f"{cols['frame_index'][rows][:3].tolist()}...) but meta/episodes length is {length}",
                            "re-export the dataset; data parquet and meta/episodes disagree")
        cached["rows"][ep] = rows
        return rows

    def episode_columns(self, ep: int, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """All rows of episode `ep` for `keys`, ordered by frame_index; shape [L] or [L, D]."""
        for key in keys:
            if self._feature(key)["dtype"] in CAMERA_DTYPES:
                raise DataError(f"features[{key!r}]", f"is a camera ({self._feature(key)['dtype']}) feature, not a "
                                "vector column", "use decode_frames for cameras")
        path = self._data_path(ep)
        cached = self._file_columns(path, keys)
        rows = self._episode_rows(path, cached, ep)
        out = {}
        for key in keys:
            values = cached["cols"][key][rows]
            self._check_width(key, values, path)
            out[key] = values
        return out

    def _check_width(self, key: str, values: np.ndarray, path: Path) -> None:
        shape = self._feature(key)["shape"]
        want = int(math.prod(shape))
        got = 1 if values.ndim == 1 else int(math.prod(values.shape[1:]))
        if got != want:
            raise DataError(f"{path}[{key!r}]", f"rows have {got} values but info.json shape is {shape}",
                            "fix meta/info.json features or re-export the data")

    # ---- video ----------------------------------------------------------------------------------
    def video_path(self, ep: int, camera_key: str) -> Path:
        row = self._episode(ep)
        return self._format("video_path", video_key=camera_key, chunk_index=row[f"videos/{camera_key}/chunk_index"],
                            file_index=row[f"videos/{camera_key}/file_index"])

    def frame_size(self, camera_key: str) -> tuple[int, int]:
        """(H, W) of a camera's frames from info.json (LeRobot writes [H, W, 3]; channel-first accepted)."""
        shape = list(self._feature(camera_key)["shape"])
        return (shape[0], shape[1]) if shape[-1] == 3 or len(shape) != 3 else (shape[1], shape[2])

    def decode_frames(self, ep: int, camera_key: str, frame_indices: Sequence[int],
                      out: np.ndarray | None = None) -> np.ndarray:
        """RGB frames [n, H, W, 3] uint8 of episode `ep`, located at from_timestamp + frame timestamp in the
        mp4 (or, for an image feature, the rows' embedded images); written into `out` (uint8 [n, H, W, 3],
        any strides) and returned when given."""
        if self._feature(camera_key)["dtype"] not in CAMERA_DTYPES:
            raise DataError(f"features[{camera_key!r}]", "is not a camera feature", f"use one of {self.camera_keys}")
        frame_indices = np.asarray(frame_indices, dtype=np.int64)
        length = self.episode_length(ep)
        if frame_indices.size and (frame_indices.min() < 0 or frame_indices.max() >= length):
            raise DataError(f"episode {ep}", f"frame indices {frame_indices.tolist()} outside [0, {length})",
                            "request frames inside the episode")
        if frame_indices.size == 0:
            h, w, c = self.features[camera_key]["shape"]
            return np.zeros((0, h, w, c), dtype=np.uint8)
        if self.features[camera_key]["dtype"] == "image":
            return self._decode_images(ep, camera_key, frame_indices, out)
        timestamps = self.episode_columns(ep, ["timestamp"])["timestamp"].astype(np.float64)
        self._check_timestamps(ep, timestamps)
        start = float(self._episode(ep)[f"videos/{camera_key}/from_timestamp"])
        path = self.video_path(ep, camera_key)
        if self._decoded is not None:
            def decode_episode() -> np.ndarray:
                whole = decode_at_times(path, start + timestamps, self.fps)
                self._check_frame_shape(camera_key, whole, path)
                return whole

            frames = self._decoded.frames(ep, camera_key, decode_episode)[frame_indices]
            if out is None:
                return frames
            out[...] = frames
            return out
        frames = decode_at_times(path, start + timestamps[frame_indices], self.fps, out)
        self._check_frame_shape(camera_key, frames, path)
        return frames

    def _decode_images(self, ep: int, camera_key: str, frame_indices: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """Frames of an image feature: the episode's rows of the data parquet, by frame_index (no timestamps)."""
        path = self._data_path(ep)
        cached = self._file_columns(path, [camera_key])
        rows = self._episode_rows(path, cached, ep)[frame_indices]
        h, w = self.frame_size(camera_key)
        out = np.empty((len(rows), h, w, 3), dtype=np.uint8) if out is None else out
        return decode_images(cached["cols"][camera_key][rows], f"{path}[{camera_key!r}] (episode {ep})", out)

    def _check_timestamps(self, ep: int, timestamps: np.ndarray) -> None:
        """Frames are located by timestamp: one off by more than a tenth of a period is a data error."""
        dev = np.abs(timestamps - np.arange(len(timestamps)) / self.fps)
        if dev.size and not dev.max() <= 0.1 / self.fps:
            i = int(np.argmax(np.nan_to_num(dev, nan=np.inf)))
            raise DataError(f"{self._data_path(ep)}: timestamp (episode {ep})", f"timestamp {timestamps[i]:.6f}s at "
                            f"frame_index {i} but frame_index / fps = {i / self.fps:.6f}s (fps {self.fps})",
                            "fix info.json fps or re-export timestamps as frame_index / fps")

    def _check_frame_shape(self, camera_key: str, frames: np.ndarray, path: Path) -> None:
        shape = list(self.features[camera_key]["shape"])
        h, w, c = frames.shape[1:]
        if shape not in ([h, w, c], [c, h, w]):  # LeRobot writes [H, W, 3]; accept channel-first too
            raise DataError(str(path), f"decoded frames are {list(frames.shape[1:])}, info.json says {shape} "
                            f"for {camera_key!r}", "fix features[...]['shape'] in meta/info.json")
