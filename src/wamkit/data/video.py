"""Frame-accurate decoding of frames at given times from mp4 files (H.264, AV1) with PyAV.

LeRobot v3.0 concatenates many episodes into one mp4, so frames are addressed by time. We seek once
to the earliest requested time, decode forward, and keep the frame whose pts is nearest each target.
Open containers are cached per process: reopening (and re-initialising the decoder) per window is
the dominant cost when training on short clips.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import av
import numpy as np

from wamkit.errors import DataError

_MAX_OPEN = 8
_cache: OrderedDict[Path, av.container.InputContainer] = OrderedDict()
_inherited: list[av.container.InputContainer] = []


def _forget_inherited() -> None:
    """In a forked child (DataLoader worker) the parent's decoders are unusable, and freeing them can
    crash (their codec threads did not survive the fork): park them, never touch them, open fresh ones."""
    _inherited.extend(_cache.values())
    _cache.clear()


os.register_at_fork(after_in_child=_forget_inherited)


def _container(path: Path) -> av.container.InputContainer:
    """Open `path` or reuse its open container (decoder reuse across windows of the same file)."""
    if path in _cache:
        _cache.move_to_end(path)
        return _cache[path]
    if not path.is_file():
        raise DataError(str(path), "video file is missing", "restore the file or re-export the dataset videos")
    try:
        container = av.open(str(path))
    except av.FFmpegError as exc:
        raise DataError(str(path), f"cannot open video: {exc}", "re-encode the video (H.264 or AV1 mp4)") from exc
    if not container.streams.video:
        container.close()
        raise DataError(str(path), "file has no video stream", "re-export the dataset videos")
    container.streams.video[0].thread_type = "AUTO"
    _cache[path] = container
    while len(_cache) > _MAX_OPEN:
        _cache.popitem(last=False)[1].close()
    return container


def close_all() -> None:
    """Close every cached container (tests, or before deleting files)."""
    while _cache:
        _cache.popitem()[1].close()


def decode_at_times(path: Path, times: np.ndarray, fps: float) -> np.ndarray:
    """Frames nearest each time in `times` (seconds) as uint8 [n, H, W, 3]; error if none within half a frame."""
    times = np.asarray(times, dtype=np.float64)
    if times.size == 0:
        raise DataError(str(path), "no frame times requested", "request at least one frame")
    container = _container(path)
    try:
        best_time, frames, first = _scan(container, times, 0.5 / fps, float(times.min()))
        if first > times.min() + 0.5 / fps:  # the demuxer seeked past the target: scan from the start
            best_time, frames, first = _scan(container, times, 0.5 / fps, 0.0)
    except av.FFmpegError as exc:
        _cache.pop(path, None)
        container.close()
        raise DataError(str(path), f"decoding failed: {exc}", "re-encode the video") from exc
    off = np.abs(best_time - times)
    bad = np.flatnonzero(~(off <= 0.5 / fps + 1e-6))
    if bad.size:
        i = int(bad[0])
        raise DataError(str(path), f"no frame within half a frame period of t={times[i]:.4f}s "
                        f"(nearest at {best_time[i]:.4f}s)",
                        "check meta/episodes from_timestamp/to_timestamp and the parquet timestamp column")
    return np.stack(frames)


def _scan(container: av.container.InputContainer, times: np.ndarray, half: float, seek_time: float):
    """Seek to the keyframe before seek_time, decode forward, keep the nearest frame per target.

    Returns (time of chosen frame per target, frames, time of the first decoded frame)."""
    stream = container.streams.video[0]
    container.seek(int(max(seek_time - half, 0.0) / float(stream.time_base)), stream=stream, backward=True,
                   any_frame=False)
    t_hi = float(times.max())
    best_time = np.full(times.shape, np.inf)
    frames: list[np.ndarray | None] = [None] * len(times)
    first = np.inf
    for frame in container.decode(stream):
        if frame.pts is None:
            continue
        t = float(frame.pts * stream.time_base)
        first = min(first, t)
        closer = np.flatnonzero(np.abs(t - times) < np.abs(best_time - times))
        if closer.size:
            rgb = frame.to_ndarray(format="rgb24")
            for i in closer:
                best_time[i], frames[i] = t, rgb
        if t > t_hi + half:
            break
    if any(f is None for f in frames):  # nothing decoded for some target; the caller reports it
        frames = [np.zeros((1, 1, 3), np.uint8)] * len(times)
    return best_time, frames, first
