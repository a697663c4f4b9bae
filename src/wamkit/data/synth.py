"""The embedded demo dataset: a tiny 2-D reaching task written as a real LeRobot v3.0 dataset.

It lets every recipe, test and tutorial run end to end without downloads: a red point robot must
reach the green or blue disk (the other colour is a distractor), driven by a noisy proportional
expert. Writing it with our own v3.0 writer also exercises the reader on multi-episode parquet and
mp4 files. The renderer and simulator are public so tests can compare decoded data to ground truth.
"""

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

TASKS = ("reach the green target", "reach the blue target")
CAMERA_KEY = "observation.images.front"
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
_ENCODERS = {"h264": ("libx264", "h264"), "libx264": ("libx264", "h264"),
             "av1": ("libsvtav1", "av1"), "libsvtav1": ("libsvtav1", "av1")}
_COLORS = {"background": (40, 40, 48), "robot": (230, 40, 40), "green": (40, 200, 70), "blue": (50, 90, 235)}
_RADIUS = {"robot": 0.07, "target": 0.09}  # fractions of the image side
_REACH = 0.06  # gripper closes within this distance of the target
_GAIN, _VMAX, _NOISE = 2.0, 0.5, 0.03  # proportional gain [1/s], speed limit [side/s], command noise


@dataclass
class SynthEpisode:
    """Ground truth of one simulated episode: states [L,4], actions [L,3], frames [L,H,W,3]."""

    task_index: int
    states: np.ndarray
    actions: np.ndarray
    frames: np.ndarray
    green: np.ndarray
    blue: np.ndarray


# ---- simulation ---------------------------------------------------------------------------------
def render_scene(robot_xy: np.ndarray, green_xy: np.ndarray, blue_xy: np.ndarray, image_size: int) -> np.ndarray:
    """Top-down RGB uint8 image; positions in [0,1]^2 (x right, y down); soft disk edges help the codec."""
    img = np.empty((image_size, image_size, 3), np.float32)
    img[:] = _COLORS["background"]
    pix = (np.arange(image_size, dtype=np.float32) + 0.5) / image_size
    for xy, color, radius in ((green_xy, "green", _RADIUS["target"]), (blue_xy, "blue", _RADIUS["target"]),
                              (robot_xy, "robot", _RADIUS["robot"])):
        dist = np.hypot(pix[None, :] - xy[0], pix[:, None] - xy[1]) * image_size
        alpha = np.clip(radius * image_size + 0.5 - dist, 0.0, 1.0)[..., None]
        img = img * (1 - alpha) + np.asarray(_COLORS[color], np.float32) * alpha
    return np.round(img).astype(np.uint8)


def _place(rng: np.random.Generator, others: Sequence[np.ndarray], min_sep: float = 0.3) -> np.ndarray:
    """Random point in [0.15, 0.85]^2 at least min_sep from the others."""
    while True:
        p = rng.uniform(0.15, 0.85, size=2)
        if all(np.hypot(*(p - o)) >= min_sep for o in others):
            return p


def simulate_episode(rng: np.random.Generator, fps: int, image_size: int, length: int) -> SynthEpisode:
    """Roll out the scripted expert for `length` steps; state is recorded before each action."""
    task_index = int(rng.integers(len(TASKS)))
    pos = rng.uniform(0.15, 0.85, size=2)
    green = _place(rng, [pos])
    blue = _place(rng, [pos, green])
    target = green if task_index == 0 else blue
    vel, dt = np.zeros(2), 1.0 / fps
    states, actions, frames = [], [], []
    for _ in range(length):
        states.append([*pos, *vel])
        frames.append(render_scene(pos, green, blue, image_size))
        cmd = _GAIN * (target - pos)
        speed = np.hypot(*cmd)
        cmd = cmd * min(1.0, _VMAX / max(speed, 1e-9)) + rng.normal(0.0, _NOISE, size=2)
        grip = 1.0 if np.hypot(*(target - pos)) < _REACH else 0.0
        actions.append([*cmd, grip])
        vel = 0.5 * vel + 0.5 * cmd  # first-order actuator lag
        pos = np.clip(pos + vel * dt, 0.0, 1.0)
    return SynthEpisode(task_index, np.asarray(states, np.float32), np.asarray(actions, np.float32),
                        np.stack(frames), green, blue)


def generate_episodes(num_episodes: int, fps: int = 10, image_size: int = 64, seed: int = 0,
                      min_length: int = 40, max_length: int = 60) -> list[SynthEpisode]:
    """Deterministic for a seed, so tests can regenerate the ground truth of a written dataset."""
    rng = np.random.default_rng(seed)
    return [simulate_episode(rng, fps, image_size, int(rng.integers(min_length, max_length + 1)))
            for _ in range(num_episodes)]


# ---- statistics ---------------------------------------------------------------------------------
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


def _check_not_constant(stats: dict[str, dict[str, np.ndarray]]) -> None:
    for key, s in stats.items():
        for lo, hi in (("min", "max"), ("q01", "q99")):
            bad = np.flatnonzero(s[hi] <= s[lo])
            if bad.size:
                raise DataError(f'stats["{key}"]["{hi}"][{int(bad[0])}]', "zero range in generated data",
                                "generate more episodes so every channel varies")


# ---- writer -------------------------------------------------------------------------------------
def _encode_video(path: Path, frames: np.ndarray, fps: int, encoder: str) -> None:
    """Encode frames [N,H,W,3] as yuv420p mp4 with frame i at pts i/fps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if encoder == "libsvtav1":
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its full config at info level otherwise
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(encoder, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, fps)
        stream.codec_context.gop_size = 2 * fps
        stream.options = {"crf": "10", "preset": "veryfast"} if encoder == "libx264" else {"crf": "12", "preset": "8"}
        for i, img in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def _write_table(path: Path, columns: dict[str, pa.Array]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def _vector(values: np.ndarray) -> pa.Array:
    """[N, D] float32 -> fixed_size_list<float32>[D] column (what LeRobot/HF datasets write)."""
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), pa.float32()), values.shape[1])


def _write_file_group(root: Path, file_no: int, group: list[SynthEpisode], first_ep: int, first_index: int,
                      fps: int, encoder: str) -> list[dict]:
    """One data parquet + one mp4 holding `group`; returns the meta/episodes rows for it."""
    chunk, fidx = divmod(file_no, CHUNKS_SIZE)
    lengths = [len(e.states) for e in group]
    n = sum(lengths)
    frame_index = np.concatenate([np.arange(k) for k in lengths])
    _write_table(root / DATA_PATH.format(chunk_index=chunk, file_index=fidx), {
        "observation.state": _vector(np.concatenate([e.states for e in group])),
        "action": _vector(np.concatenate([e.actions for e in group])),
        "timestamp": pa.array((frame_index / fps).astype(np.float32)),
        "frame_index": pa.array(frame_index, pa.int64()),
        "episode_index": pa.array(np.repeat(np.arange(first_ep, first_ep + len(group)), lengths), pa.int64()),
        "index": pa.array(np.arange(first_index, first_index + n), pa.int64()),
        "task_index": pa.array(np.repeat([e.task_index for e in group], lengths), pa.int64()),
    })
    _encode_video(root / VIDEO_PATH.format(video_key=CAMERA_KEY, chunk_index=chunk, file_index=fidx),
                  np.concatenate([e.frames for e in group]), fps, encoder)
    rows, offset = [], 0
    for j, (ep, k) in enumerate(zip(group, lengths)):
        rows.append({"episode_index": first_ep + j, "tasks": [TASKS[ep.task_index]], "length": k,
                     "data/chunk_index": chunk, "data/file_index": fidx,
                     "dataset_from_index": first_index + offset, "dataset_to_index": first_index + offset + k,
                     f"videos/{CAMERA_KEY}/chunk_index": chunk, f"videos/{CAMERA_KEY}/file_index": fidx,
                     f"videos/{CAMERA_KEY}/from_timestamp": offset / fps,
                     f"videos/{CAMERA_KEY}/to_timestamp": (offset + k) / fps,
                     "meta/episodes/chunk_index": chunk, "meta/episodes/file_index": fidx})
        offset += k
    _write_table(root / EPISODES_PATH.format(chunk_index=chunk, file_index=fidx), pa.Table.from_pylist(rows))
    return rows


def _info(num_episodes: int, num_frames: int, fps: int, image_size: int, codec: str) -> dict:
    scalar = {"shape": [1], "names": None}
    return {
        "codebase_version": "v3.0", "robot_type": "planar_point_robot",
        "total_episodes": num_episodes, "total_frames": num_frames, "total_tasks": len(TASKS),
        "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500,
        "fps": fps, "splits": {"train": f"0:{num_episodes}"},
        "data_path": DATA_PATH, "video_path": VIDEO_PATH,
        "features": {
            CAMERA_KEY: {"dtype": "video", "shape": [image_size, image_size, 3],
                         "names": ["height", "width", "channels"],
                         "info": {"video.height": image_size, "video.width": image_size, "video.codec": codec,
                                  "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fps,
                                  "video.channels": 3, "has_audio": False}},
            "observation.state": {"dtype": "float32", "shape": [4], "names": ["x", "y", "vx", "vy"]},
            "action": {"dtype": "float32", "shape": [3], "names": ["dx", "dy", "grip"]},
            "timestamp": {"dtype": "float32", **scalar}, "frame_index": {"dtype": "int64", **scalar},
            "episode_index": {"dtype": "int64", **scalar}, "index": {"dtype": "int64", **scalar},
            "task_index": {"dtype": "int64", **scalar},
        },
    }


def _write_dataset(root: Path, episodes: list[SynthEpisode], fps: int, image_size: int, episodes_per_file: int,
                   encoder: str, codec: str) -> None:
    first_ep = first_index = 0
    groups = [episodes[i:i + episodes_per_file] for i in range(0, len(episodes), episodes_per_file)]
    for file_no, group in enumerate(groups):
        _write_file_group(root, file_no, group, first_ep, first_index, fps, encoder)
        first_ep += len(group)
        first_index += sum(len(e.states) for e in group)
    _write_table(root / "meta" / "tasks.parquet",
                 {"task_index": pa.array(range(len(TASKS)), pa.int64()), "task": pa.array(TASKS)})
    stats = compute_stats({"observation.state": np.concatenate([e.states for e in episodes]),
                           "action": np.concatenate([e.actions for e in episodes])})
    _check_not_constant(stats)
    (root / "meta" / "stats.json").write_text(json.dumps(
        {k: {f: v.tolist() for f, v in s.items()} for k, s in stats.items()}, indent=2))
    # info.json last: its presence marks a complete dataset
    (root / "meta" / "info.json").write_text(json.dumps(
        _info(len(episodes), first_index, fps, image_size, codec), indent=2))


def write_demo_dataset(out_dir: str | Path, num_episodes: int = 32, fps: int = 10, image_size: int = 64,
                       episodes_per_file: int = 16, seed: int = 0, codec: str = "h264") -> Path:
    """Simulate and write the demo dataset to `out_dir` (built in a temp dir, then renamed into place)."""
    out_dir = Path(out_dir)
    if codec not in _ENCODERS:
        raise DataError("write_demo_dataset: codec", f"{codec!r} is not supported", f"use one of {sorted(_ENCODERS)}")
    if num_episodes < 1 or episodes_per_file < 1 or image_size < 16 or image_size % 2 or fps < 1:
        raise DataError("write_demo_dataset", f"bad sizes num_episodes={num_episodes} episodes_per_file="
                        f"{episodes_per_file} image_size={image_size} fps={fps}",
                        "use positive counts and an even image_size >= 16")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise DataError(str(out_dir), "already exists and is not an empty directory",
                        "delete it or choose another output directory")
    encoder, codec_name = _ENCODERS[codec]
    episodes = generate_episodes(num_episodes, fps, image_size, seed)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        _write_dataset(tmp, episodes, fps, image_size, episodes_per_file, encoder, codec_name)
        if out_dir.exists():
            out_dir.rmdir()
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out_dir
