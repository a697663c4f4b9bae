"""Ground-truth checks for decoded frames, shared by the reader and window tests."""

from __future__ import annotations

import numpy as np

FRAME_TOL = 8.0  # mean |error| per pixel (0..255) tolerated from lossy yuv420p coding


def robot_centroid(frames: np.ndarray) -> np.ndarray:
    """Pixel centroid (x, y) of the red robot disk in each frame."""
    f = frames.astype(np.int16)
    mask = ((f[..., 0] > 150) & (f[..., 1] < 110) & (f[..., 2] < 110)).astype(np.float64)
    ys, xs = np.mgrid[: f.shape[1], : f.shape[2]]
    area = mask.sum((1, 2))
    return np.stack([(mask * xs).sum((1, 2)) / area, (mask * ys).sum((1, 2)) / area], axis=1)


def check_frames(frames: np.ndarray, truth, idx=None) -> None:
    """Within codec tolerance, and each frame shows the robot where that frame's state says it is."""
    idx = np.arange(len(truth.frames)) if idx is None else np.asarray(idx)
    assert frames.dtype == np.uint8 and frames.shape == truth.frames[idx].shape
    assert np.abs(frames.astype(np.int16) - truth.frames[idx]).mean() < FRAME_TOL
    size = frames.shape[2]
    expected = truth.states[idx, :2] * size - 0.5  # pixel centres sit at (i + 0.5) / size
    # an off-by-one frame is 1.4-3.3 px away while the robot moves; the right frame is < 0.75 px
    assert np.hypot(*(robot_centroid(frames) - expected).T).max() < 1.0
