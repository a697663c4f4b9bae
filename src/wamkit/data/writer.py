"""The LeRobot v3.0 writer: any episodes (task strings, state/action names, one or more cameras)
to the on-disk layout `wamkit.data.LeRobotV3Dataset` and LeRobot's own reader expect. Used by the
demo dataset, the simulator recorders and the schema-exact synthetic datasets."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Mapping, Sequence

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wamkit.errors import DataError

CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
ENCODERS = {"h264": ("libx264", "h264"), "libx264": ("libx264", "h264"),
            "av1": ("libsvtav1", "av1"), "libsvtav1": ("libsvtav1", "av1")}
# yuv420p (LeRobot's default) halves the colour resolution: at 64 px a small coloured cue (a handle
# marker, a finger pad) smears into its neighbours, so a policy trained on the decoded video sees
# other colours than the raw camera it acts on. yuv444p keeps full colour (H.264 only: SVT-AV1 is 4:2:0).
PIXEL_FORMATS = {"yuv420p": ("libx264", "libsvtav1"), "yuv444p": ("libx264",)}


def compute_stats(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Per-channel min/max/mean/std/q01/q99/count of [N, D] (or [N]) arrays, as in meta/stats.json."""
    stats = {}
    for key, values in arrays.items():
        x = np.asarray(values, dtype=np.float64)
        if len(x) == 0:
            raise DataError(f"compute_stats[{key!r}]", "no rows", "compute stats on a non-empty dataset")
        x = x.reshape(len(x), -1)
        stats[key] = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0),
                      "q01": np.quantile(x, 0.01, axis=0), "q99": np.quantile(x, 0.99, axis=0),
                      "count": np.asarray([len(x)])}
    return stats


def encode_video(path: Path, frames: np.ndarray, fps: int, encoder: str, pix_fmt: str = "yuv420p") -> None:
    """Encode frames [N,H,W,3] as an mp4 in `pix_fmt` with frame i at pts i/fps."""
    video = _VideoStream(path, frames.shape[1:3], fps, encoder, pix_fmt)
    try:
        video.add(frames)
        video.close()
    except BaseException:
        video.container.close()
        raise


def write_table(path: Path, columns: dict[str, pa.Array]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def vector_column(values: np.ndarray) -> pa.Array:
    """[N, D] float32 -> fixed_size_list<float32>[D] column (what LeRobot/HF datasets write)."""
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), pa.float32()), values.shape[1])



DEFAULT_CAMERA_KEY = "observation.images.front"
CAMERA_KEY_PREFIX = "observation.images."


def camera_key(camera: str) -> str:
    """A camera's dataset key, as LeRobot names its cameras: `corner` -> `observation.images.corner`."""
    return CAMERA_KEY_PREFIX + camera


def camera_name(key: str) -> str:
    """A dataset camera key's camera name: `observation.images.corner` -> `corner` (`corner@2.5x` whole)."""
    return key[len(CAMERA_KEY_PREFIX):] if key.startswith(CAMERA_KEY_PREFIX) else key.rsplit(".", 1)[-1]


RECORDING_META = "meta/wamkit_recording.json"  # `wamkit sim record`'s provenance beside a recording


def recorded_sim_camera(root: str | Path, camera_keys: list[str]) -> str | None:
    """The simulator camera spec(s) that rendered these keys of a `wamkit sim record` recording, for a closed
    loop to render the same: a one-camera recording keys its view `observation.images.front` whatever camera
    rendered it (its provenance names it), a several-camera one by camera. None for other datasets."""
    meta = Path(root) / RECORDING_META
    if not meta.is_file():
        return None
    try:
        recorded = str(json.loads(meta.read_text())["camera"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(str(meta), f"has no readable 'camera' ({exc})", "re-record the dataset with `wamkit sim record`") from exc
    if "," not in recorded:
        return recorded
    return ",".join(camera_name(k) for k in camera_keys)


@dataclass
class RecordedEpisode:
    """One episode: states [L, Ds], actions [L, Da], frames [L, H, W, 3] uint8 (row t: obs before action t),
    or a dict camera key -> such frames for several cameras."""

    task: str
    states: np.ndarray
    actions: np.ndarray
    frames: np.ndarray | dict[str, np.ndarray]

    def camera_frames(self, default_key: str) -> dict[str, np.ndarray]:
        return self.frames if isinstance(self.frames, dict) else {default_key: self.frames}


def _check_episode(i: int, e: RecordedEpisode, camera_key: str, ds: int, da: int, sizes: dict) -> None:
    """Episode `i` against the layout the first episode set (state dim, action dim, camera sizes)."""
    n = len(e.states)
    cams = e.camera_frames(camera_key)
    if n < 1 or e.states.shape != (n, ds) or e.actions.shape != (n, da) or set(cams) != set(sizes) or any(
            f.shape != (n, *sizes[k], 3) for k, f in cams.items()):
        raise DataError(f"write_lerobot_dataset: episode {i}", f"inconsistent shapes states {e.states.shape} "
                        f"actions {e.actions.shape} frames {({k: f.shape for k, f in cams.items()})}",
                        "record rows of equal length and size, with the same cameras")
    if any(f.dtype != np.uint8 for f in cams.values()):
        raise DataError(f"write_lerobot_dataset: episode {i}", "frames are not uint8", "pass uint8 frames")
    if not (np.all(np.isfinite(e.states)) and np.all(np.isfinite(e.actions))):
        raise DataError(f"write_lerobot_dataset: episode {i}", "NaN/inf in states or actions", "drop the episode")


def _layout(first: RecordedEpisode, camera_key: str) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """(state dim, action dim, camera key -> (H, W)) of the first episode, every later one must match."""
    ds, da = first.states.shape[1], first.actions.shape[1]
    sizes = {k: tuple(f.shape[1:3]) for k, f in first.camera_frames(camera_key).items()}
    for key, (h, w) in sizes.items():
        if h % 2 or w % 2:
            raise DataError(f"write_lerobot_dataset: {key}", f"frame size {h}x{w} is odd", "yuv420p needs even sizes")
    return ds, da, sizes


def check_encoding(codec: str, pix_fmt: str, caller: str = "write_lerobot_dataset") -> tuple[str, str]:
    """(encoder, codec name) of a supported `codec` / `pix_fmt` pair, else a DataError naming `caller`'s field and the fix."""
    if codec not in ENCODERS:
        raise DataError(f"{caller}: codec", f"{codec!r} is not supported", f"use one of {sorted(ENCODERS)}")
    encoder, name = ENCODERS[codec]
    if encoder not in PIXEL_FORMATS.get(pix_fmt, ()):
        usable = sorted(f for f, encoders in PIXEL_FORMATS.items() if encoder in encoders)
        raise DataError(f"{caller}: pix_fmt", f"{pix_fmt!r} is not supported with {codec!r}", f"use one of {usable}")
    return encoder, name


class _VideoStream:
    """One mp4 being written frame by frame (frame i at pts i/fps), as encode_video writes it whole."""

    def __init__(self, path: Path, size: tuple[int, int], fps: int, encoder: str, pix_fmt: str = "yuv420p"):
        path.parent.mkdir(parents=True, exist_ok=True)
        if encoder == "libsvtav1":
            os.environ.setdefault("SVT_LOG", "1")
        self.container = av.open(str(path), mode="w")
        self.stream = self.container.add_stream(encoder, rate=fps)
        self.stream.width, self.stream.height = size[1], size[0]
        self.stream.pix_fmt = pix_fmt
        self.stream.codec_context.time_base = Fraction(1, fps)
        self.stream.codec_context.gop_size = 2 * fps
        self.stream.options = {"crf": "10", "preset": "veryfast"} if encoder == "libx264" else {"crf": "12", "preset": "8"}
        self.pts = 0

    def add(self, frames: np.ndarray) -> None:
        for img in frames:
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = self.pts
            self.pts += 1
            self.container.mux(self.stream.encode(frame))

    def close(self) -> None:
        self.container.mux(self.stream.encode(None))
        self.container.close()


def _widen_constant(stats: dict, key: str, bounds: tuple[Sequence[float], Sequence[float]] | None) -> list[int]:
    """Channels that never vary in the data (e.g. a gripper the expert never closes) get the channel's
    declared physical range when `bounds` are given (min/q01 = low, max/q99 = high, std = (high - low) / 2),
    so a policy can still learn to move them; without bounds they stay constant (min == max), which every
    normalization maps to 0 and back to the value. Returns the widened channels."""
    s = stats[key]
    flat = np.flatnonzero(~((s["max"] > s["min"]) & (s["q99"] > s["q01"]) & (s["std"] > 0)))
    if bounds is None:
        return []
    for c in flat:
        lo, hi = float(bounds[0][c]), float(bounds[1][c])
        lo, hi = min(lo, float(s["min"][c])), max(hi, float(s["max"][c]))
        if not hi > lo:
            raise DataError(f"stats[{key!r}][{c}]", "constant channel without a usable declared range",
                            "declare low < high bounds for the channel")
        s["min"][c] = s["q01"][c] = lo
        s["max"][c] = s["q99"][c] = hi
        s["std"][c] = (hi - lo) / 2
    return flat.tolist()


def write_lerobot_dataset(out_dir: str | Path, episodes: Sequence[RecordedEpisode], fps: float, *,
                          state_names: Sequence[str], action_names: Sequence[str], robot_type: str,
                          camera_key: str = DEFAULT_CAMERA_KEY, episodes_per_file: int = 16,
                          state_bounds=None, action_bounds=None, extra_info: dict | None = None,
                          codec: str = "h264", pix_fmt: str = "yuv420p", tasks: Sequence[str] | None = None) -> dict:
    """Write `episodes` as a LeRobot v3.0 dataset (H.264 video), atomically (temp dir, then rename).
    Returns {"widened_channels": {...}} naming constant channels whose stats took the declared bounds.
    For episodes that arrive one at a time (a recording), `LeRobotWriter` holds one episode's frames at once."""
    if not episodes:
        raise DataError("write_lerobot_dataset", "no episodes to write", "record at least one successful episode")
    writer = LeRobotWriter(out_dir, fps, state_names=state_names, action_names=action_names, robot_type=robot_type,
                           camera_key=camera_key, episodes_per_file=episodes_per_file, state_bounds=state_bounds,
                           action_bounds=action_bounds, extra_info=extra_info, codec=codec, pix_fmt=pix_fmt,
                           tasks=tasks if tasks is not None else sorted({e.task for e in episodes}))
    try:
        for episode in episodes:
            writer.add(episode)
        return writer.finish()
    finally:
        writer.abort()


class LeRobotWriter:
    """A LeRobot v3.0 dataset written episode by episode: each episode's frames go to the open video
    file of its group (`episodes_per_file` episodes per data/video file) as it arrives, so memory holds
    one episode's frames, plus every episode's states and actions (for the stats: [frames, D] floats).
    `finish` writes tasks, stats and info.json (last: it marks a complete dataset) and renames the temp
    directory into place; `abort` (a no-op after finish) removes it."""

    def __init__(self, out_dir: str | Path, fps: float, *, state_names: Sequence[str], action_names: Sequence[str],
                 robot_type: str, tasks: Sequence[str], camera_key: str = DEFAULT_CAMERA_KEY, episodes_per_file: int = 16,
                 state_bounds=None, action_bounds=None, extra_info: dict | None = None, codec: str = "h264",
                 pix_fmt: str = "yuv420p"):
        out_dir = Path(out_dir)
        if int(round(fps)) != fps or fps < 1:
            raise DataError("write_lerobot_dataset: fps", f"{fps} is not a positive integer", "record at an integer rate")
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise DataError(str(out_dir), "already exists and is not an empty directory",
                            "delete it or choose another output directory")
        self.encoder, self.codec_name = check_encoding(codec, pix_fmt)
        self.pix_fmt = pix_fmt
        self.out_dir, self.fps, self.camera_key = out_dir, int(fps), camera_key
        self.state_names, self.action_names, self.robot_type = list(state_names), list(action_names), robot_type
        self.episodes_per_file, self.bounds = int(episodes_per_file), (state_bounds, action_bounds)
        self.extra_info, self.tasks = extra_info, list(tasks)
        self.task_index = {t: i for i, t in enumerate(self.tasks)}
        self.layout: tuple[int, int, dict[str, tuple[int, int]]] | None = None
        self.states: list[np.ndarray] = []
        self.actions: list[np.ndarray] = []
        self.group: list[tuple[RecordedEpisode, int]] = []  # (episode without frames, length) of the open file
        self.videos: dict[str, _VideoStream] = {}
        self.file_no = self.first_ep = self.first_index = 0
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = out_dir.parent / f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}"

    def add(self, episode: RecordedEpisode) -> None:
        i = len(self.states)
        if self.layout is None:
            self.layout = _layout(episode, self.camera_key)
            ds, da, _ = self.layout
            if len(self.state_names) != ds or len(self.action_names) != da:
                raise DataError("write_lerobot_dataset", f"names ({len(self.state_names)} state, {len(self.action_names)} "
                                f"action) do not match the data ({ds}, {da})", "pass one name per channel")
        _check_episode(i, episode, self.camera_key, *self.layout)
        if episode.task not in self.task_index:
            raise DataError("write_lerobot_dataset: tasks", f"episodes use tasks not listed: {[episode.task]}", "list every task")
        chunk, fidx = divmod(self.file_no, CHUNKS_SIZE)
        for key, frames in episode.camera_frames(self.camera_key).items():
            if key not in self.videos:
                self.videos[key] = _VideoStream(self.tmp / VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=fidx),
                                                self.layout[2][key], self.fps, self.encoder, self.pix_fmt)
            self.videos[key].add(frames)
        self.states.append(np.asarray(episode.states))
        self.actions.append(np.asarray(episode.actions))
        self.group.append((RecordedEpisode(episode.task, episode.states, episode.actions, frames={}), len(episode.states)))
        if len(self.group) == self.episodes_per_file:
            self._close_file()

    def _close_file(self) -> None:
        """The data parquet and episode metadata of the open group; its videos are complete."""
        if not self.group:
            return
        for video in self.videos.values():
            video.close()
        self.videos = {}
        fps, sizes = self.fps, self.layout[2]
        group, lengths = [e for e, _ in self.group], [k for _, k in self.group]
        chunk, fidx = divmod(self.file_no, CHUNKS_SIZE)
        first_ep, first_index, n = self.first_ep, self.first_index, sum(lengths)
        frame_index = np.concatenate([np.arange(k) for k in lengths])
        write_table(self.tmp / DATA_PATH.format(chunk_index=chunk, file_index=fidx), {
            "observation.state": vector_column(np.concatenate([e.states for e in group]).astype(np.float32)),
            "action": vector_column(np.concatenate([e.actions for e in group]).astype(np.float32)),
            "timestamp": pa.array((frame_index / fps).astype(np.float32)),
            "frame_index": pa.array(frame_index, pa.int64()),
            "episode_index": pa.array(np.repeat(np.arange(first_ep, first_ep + len(group)), lengths), pa.int64()),
            "index": pa.array(np.arange(first_index, first_index + n), pa.int64()),
            "task_index": pa.array(np.repeat([self.task_index[e.task] for e in group], lengths), pa.int64()),
        })
        rows, offset = [], 0
        for j, (ep, k) in enumerate(zip(group, lengths)):
            row = {"episode_index": first_ep + j, "tasks": [ep.task], "length": k,
                   "data/chunk_index": chunk, "data/file_index": fidx,
                   "dataset_from_index": first_index + offset, "dataset_to_index": first_index + offset + k,
                   "meta/episodes/chunk_index": chunk, "meta/episodes/file_index": fidx}
            for key in sizes:
                row.update({f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": fidx,
                            f"videos/{key}/from_timestamp": offset / fps, f"videos/{key}/to_timestamp": (offset + k) / fps})
            rows.append(row)
            offset += k
        write_table(self.tmp / EPISODES_PATH.format(chunk_index=chunk, file_index=fidx), pa.Table.from_pylist(rows))
        self.first_ep += len(group)
        self.first_index += n
        self.file_no += 1
        self.group = []

    def finish(self) -> dict:
        if not self.states:
            raise DataError("write_lerobot_dataset", "no episodes to write", "record at least one successful episode")
        self._close_file()
        fps, tasks, (ds, da, sizes) = self.fps, self.tasks, self.layout
        tmp, total = self.tmp, len(self.states)
        write_table(tmp / "meta" / "tasks.parquet",
                    {"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks)})
        stats = compute_stats({"observation.state": np.concatenate(self.states), "action": np.concatenate(self.actions)})
        widened = {"observation.state": _widen_constant(stats, "observation.state", self.bounds[0]),
                   "action": _widen_constant(stats, "action", self.bounds[1])}
        (tmp / "meta" / "stats.json").write_text(json.dumps(
            {k: {f: np.asarray(v).tolist() for f, v in s.items()} for k, s in stats.items()}, indent=2))
        scalar = {"shape": [1], "names": None}
        info = {
            "codebase_version": "v3.0", "robot_type": self.robot_type,
            "total_episodes": total, "total_frames": self.first_index, "total_tasks": len(tasks),
            "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500,
            "fps": fps, "splits": {"train": f"0:{total}"},
            "data_path": DATA_PATH, "video_path": VIDEO_PATH,
            "features": {
                **{key: {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
                         "info": {"video.height": h, "video.width": w, "video.codec": self.codec_name,
                                  "video.pix_fmt": self.pix_fmt, "video.is_depth_map": False, "video.fps": fps,
                                  "video.channels": 3, "has_audio": False}}
                   for key, (h, w) in sizes.items()},
                "observation.state": {"dtype": "float32", "shape": [ds], "names": self.state_names},
                "action": {"dtype": "float32", "shape": [da], "names": self.action_names},
                "timestamp": {"dtype": "float32", **scalar}, "frame_index": {"dtype": "int64", **scalar},
                "episode_index": {"dtype": "int64", **scalar}, "index": {"dtype": "int64", **scalar},
                "task_index": {"dtype": "int64", **scalar},
            },
        }
        if self.extra_info:
            info.update(self.extra_info)
        # info.json last: its presence marks a complete dataset
        (tmp / "meta" / "info.json").write_text(json.dumps(info, indent=2))
        if self.out_dir.exists():
            self.out_dir.rmdir()
        tmp.rename(self.out_dir)
        return {"widened_channels": widened}

    def abort(self) -> None:
        for video in self.videos.values():
            try:
                video.container.close()
            except Exception:  # noqa: BLE001 - cleaning up after another error
                pass
        self.videos = {}
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
