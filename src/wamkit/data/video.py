"""Frame-accurate decoding of frames at given times from mp4 files (H.264, AV1) with PyAV.

LeRobot v3.0 concatenates many episodes into one mp4, so frames are addressed by time. We seek to the
last keyframe at or before the earliest requested time, decode forward, and keep the frame whose pts is nearest
each target. Only the chosen frames are converted to RGB, once each, straight into the caller's
buffer when one is given.

Per process (each DataLoader worker has its own), every file keeps an open reader: container, decoder,
RGB converter and the position where its decoding stopped. Reopening (and re-initialising the decoder)
per window is the dominant cost when training on short clips. When the next request starts ahead of
that position and no keyframe lies between the two, decoding simply continues instead of seeking:
the same frames, without decoding the GOP's leading frames again.

Inside a DataLoader worker the decoder runs on one thread (the workers already keep the cores busy;
codec threads there cost about a third more CPU per window); elsewhere FFmpeg picks its threads. RGB
conversion is always single-threaded: swscale's threads cost more than they save at these sizes.
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
from collections import OrderedDict
from pathlib import Path

import av
import numpy as np
from av.video.reformatter import VideoReformatter
from torch.utils.data import get_worker_info

from wamkit.errors import DataError

_MAX_OPEN = 8


class _Reader:
    """An open file: container, decoder, RGB converter, and where its decoding stopped.

    `frames` is the live decode iterator (None: the next request seeks) and `consumed` the time of the
    last frame taken from it."""

    def __init__(self, path: Path, container: av.container.InputContainer):
        self.path, self.container = path, container
        self.stream = container.streams.video[0]
        if get_worker_info() is None:
            self.stream.thread_type = "AUTO"
        else:  # DataLoader workers already keep every core busy: codec threads would only add CPU time
            self.stream.codec_context.thread_count = 1
            _reuse_freed_frame_memory()
        self.time_base = float(self.stream.time_base)
        # keyframe times (decode timestamps, <= their pts) from the container's index; empty if unindexed
        self.keyframes = np.sort(np.asarray([e.timestamp for e in self.stream.index_entries if e.is_keyframe],
                                            dtype=np.float64)) * self.time_base
        self.rgb = VideoReformatter()  # reused: building a converter per frame costs more than converting
        self.frames = None
        self.consumed = -np.inf
        self.seeks = self.decoded = 0  # seeks made and frames decoded (for tests)

    def close(self) -> None:
        self.frames = None
        self.container.close()

    def can_continue(self, t_first: float, fps: float) -> bool:
        """True when decoding on from the current position serves a request whose earliest time is
        `t_first` with no more decoding than a seek would do: every frame that could be nearest a target
        (at or after t_first - half a frame) is still ahead, and no keyframe lies between."""
        if self.frames is None or not self.consumed < t_first - 0.5 / fps:
            return False
        step = 1.0 / fps + 1e-6  # the next frame from the iterator is at about consumed + 1 / fps
        if self.keyframes.size:
            k = np.searchsorted(self.keyframes, t_first, side="right") - 1  # the keyframe a seek would land on
            return k < 0 or self.keyframes[k] <= self.consumed + step
        return t_first <= self.consumed + step  # no index: continue only onto the next frame

    def seek(self, t: float) -> None:
        """To the last keyframe at or before `t` (s)."""
        self.container.seek(round(max(t, 0.0) / self.time_base), stream=self.stream, backward=True, any_frame=False)
        self.frames, self.consumed = self.container.decode(self.stream), -np.inf
        self.seeks += 1

    def next_frame(self) -> av.VideoFrame | None:
        """The next decoded frame with a pts, or None at the end of the stream."""
        for frame in self.frames:
            if frame.pts is not None:
                self.decoded += 1
                self.consumed = float(frame.pts * self.time_base)
                return frame
        self.frames = None
        return None

    def to_rgb(self, frame: av.VideoFrame) -> np.ndarray:
        """uint8 [H, W, 3] (a view of the converted frame's buffer)."""
        return self.rgb.reformat(frame, format="rgb24", threads=1).to_ndarray()


@functools.cache
def _reuse_freed_frame_memory() -> None:
    """Make glibc keep freed memory for reuse in this (worker) process. Each converted RGB frame is a new
    0.2-1 MB allocation; glibc serves that size with mmap or trims the freed heap top back to the OS, so a
    480p window faulted its conversion memory in again every time (~1,800 page faults, 4 of its 20 ms).
    The thresholds are fixed at the largest values glibc's own dynamic adjustment would reach. Without
    glibc (no libc.so.6) nothing changes."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: allocations below 32 MiB come from the heap
    libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD: keep up to 64 MiB of free heap top


_cache: OrderedDict[Path, _Reader] = OrderedDict()
_inherited: list[_Reader] = []


def _forget_inherited() -> None:
    """In a forked child (DataLoader worker) the parent's decoders are unusable, and freeing them can
    crash (their codec threads did not survive the fork): park them, never touch them, open fresh ones."""
    _inherited.extend(_cache.values())
    _cache.clear()


os.register_at_fork(after_in_child=_forget_inherited)


def _reader(path: Path) -> _Reader:
    """Open `path` or reuse its open reader (decoder reuse across windows of the same file)."""
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
    _cache[path] = reader = _Reader(path, container)
    while len(_cache) > _MAX_OPEN:
        _cache.popitem(last=False)[1].close()
    return reader


def close_all() -> None:
    """Close every cached reader (tests, or before deleting files)."""
    while _cache:
        _cache.popitem()[1].close()


def decode_at_times(path: Path, times: np.ndarray, fps: float, out: np.ndarray | None = None) -> np.ndarray:
    """Frames nearest each time in `times` (seconds) as uint8 [n, H, W, 3]; error if none within half a frame.

    With `out` (uint8 [n, H, W, 3], any strides) the frames are written into it and it is returned."""
    times = np.asarray(times, dtype=np.float64)
    if times.size == 0:
        raise DataError(str(path), "no frame times requested", "request at least one frame")
    half, t_first = 0.5 / fps, float(times.min())
    reader = _reader(path)
    try:
        seek = not reader.can_continue(t_first, fps)
        if seek:
            # The first frame needed (nearest t_first) is not before the last keyframe at or before
            # t_first (that keyframe would be nearer), so seeking to t_first itself misses nothing.
            reader.seek(t_first)
        best_time, chosen, first = _scan(reader, times)
        if seek and first > t_first + 0.01 / fps:  # the demuxer seeked past the target: scan from the start
            reader.seek(0.0)
            best_time, chosen, first = _scan(reader, times)
    except av.FFmpegError as exc:
        _cache.pop(path, None)
        reader.close()
        raise DataError(str(path), f"decoding failed: {exc}", "re-encode the video") from exc
    off = np.abs(best_time - times)
    bad = np.flatnonzero(~(off <= half + 1e-6))
    if bad.size:
        i = int(bad[0])
        raise DataError(str(path), f"no frame within half a frame period of t={times[i]:.4f}s "
                        f"(nearest at {best_time[i]:.4f}s)",
                        "check meta/episodes from_timestamp/to_timestamp and the parquet timestamp column")
    return _convert(reader, chosen, out)


def _scan(reader: _Reader, times: np.ndarray):
    """Decode forward from the reader's position, keep the nearest frame per target. Frames come in pts
    order, so decoding stops at the first frame at or after the last target: later ones are farther.

    Returns (time of the chosen frame per target, chosen frames, time of the first decoded frame)."""
    t_hi = float(times.max())
    best_time = np.full(times.shape, np.inf)
    chosen: list[av.VideoFrame | None] = [None] * len(times)
    first = np.inf
    while (frame := reader.next_frame()) is not None:
        t = reader.consumed
        first = min(first, t)
        for i in np.flatnonzero(np.abs(t - times) < np.abs(best_time - times)):
            best_time[i], chosen[i] = t, frame
        if t >= t_hi - 1e-6:
            break
    return best_time, chosen, first


def _convert(reader: _Reader, chosen: list, out: np.ndarray | None) -> np.ndarray:
    """RGB of the chosen frames, each frame converted once."""
    rgb: dict[int, np.ndarray] = {}
    for i, frame in enumerate(chosen):
        key = id(frame)
        if key not in rgb:
            rgb[key] = reader.to_rgb(frame)
        if out is None:
            out = np.empty((len(chosen), *rgb[key].shape), dtype=np.uint8)
        if out.shape[1:] != rgb[key].shape:
            raise DataError(str(reader.path), f"decoded frames are {list(rgb[key].shape)}, expected "
                            f"{list(out.shape[1:])}", "fix features[...]['shape'] in meta/info.json")
        out[i] = rgb[key]
    return out


def decode_images(blobs, where: str, out: np.ndarray) -> np.ndarray:
    """Decode the encoded frames of a LeRobot `image` feature (PNG or JPEG bytes embedded in the data
    parquet) into `out` [n, H, W, 3] uint8; a frame of another size is an error naming `where`."""
    from PIL import Image, UnidentifiedImageError

    for i, blob in enumerate(blobs):
        try:
            with Image.open(io.BytesIO(blob)) as image:
                frame = np.asarray(image.convert("RGB"))
        except (UnidentifiedImageError, OSError) as exc:
            raise DataError(where, f"frame {i} of the request is not a readable image: {exc}",
                            "re-export the dataset") from exc
        if frame.shape != out.shape[1:]:
            raise DataError(where, f"an embedded image is {list(frame.shape)}, info.json says {list(out.shape[1:])}",
                            "fix features[...]['shape'] in meta/info.json")
        out[i] = frame
    return out
