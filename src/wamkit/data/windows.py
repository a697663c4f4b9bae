"""Fixed-length training windows (T+1 frames, T actions) cut from episodes.

A world-action model sees frames [start, start+T] and the T actions that move between them, so a
window never crosses an episode boundary. Only the frames a window needs are decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from wamkit.data.frame_pool import frame_buffer, ship_from_workers
from wamkit.data.lerobot_v3 import LeRobotV3Dataset
from wamkit.data.selection import KeepRanges, NoWindowsKept, trajectory_keys
from wamkit.errors import DataError


@ship_from_workers
@dataclass
class Window:
    """One clip: video [V, T+1, H, W, 3] uint8 -- a list of V [T+1, H_v, W_v, 3] when the cameras differ in
    size -- (None when read without video), state [T+1, Ds] | None, action [T, Da]; goal_state [Ds] | None:
    with a `goal_horizon`, the state at the episode's last frame (0) or that many frames ahead (the hindsight goal
    of `diffusion.goal_state_loss_weight`)."""

    video: torch.Tensor | list[torch.Tensor] | None
    state: torch.Tensor | None
    action: torch.Tensor
    task: str
    episode_index: int
    start: int
    goal_state: torch.Tensor | None = None


class WindowDataset(Dataset):
    """All (episode, start) windows of `chunk_length` actions over the given episodes, optionally
    filtered by `keep_ranges` (see wamkit.data.selection; keys from `trajectory_key_field`).

    `dataset` is a LeRobotV3Dataset or a MultiDataset (same interface). The index lists windows grouped
    by episode, in episode order, starts ascending."""

    def __init__(self, dataset: LeRobotV3Dataset, episodes: Sequence[int], chunk_length: int,
                 camera_keys: Sequence[str] | None = None, state_key: str | None = "observation.state",
                 action_key: str = "action", stride: int = 1, keep_ranges: KeepRanges | None = None,
                 trajectory_key_field: str = "", goal_horizon: int | None = None):
        self.decode_video = True  # False when the video comes from a latent cache
        if chunk_length < 1 or stride < 1:
            raise DataError("WindowDataset", f"chunk_length={chunk_length}, stride={stride}: both must be >= 1",
                            "set data.chunk_length and data.stride to positive integers")
        self.dataset, self.chunk_length, self.stride = dataset, int(chunk_length), int(stride)
        self.camera_keys = list(dataset.camera_keys if camera_keys is None else camera_keys)
        self.state_key, self.action_key = state_key, action_key
        self.keep_ranges, self.trajectory_key_field = keep_ranges, trajectory_key_field
        # None: no goal state (nothing read or checked beyond the window); 0: the episode's last frame; H: H frames ahead
        self.goal_horizon = goal_horizon
        self._check_keys()
        self.index = self._build_index(list(episodes))

    def _check_keys(self) -> None:
        ds = self.dataset
        if not self.camera_keys:
            raise DataError(f"{ds.root}/meta/info.json: features", "no camera (video or image) features selected",
                            f"choose camera keys from {ds.camera_keys}")
        for key in self.camera_keys:
            if key not in ds.camera_keys:
                raise DataError(f"{ds.root}/meta/info.json: features[{key!r}]", "is not a camera (video or image) feature of "
                                "the dataset", f"choose camera keys from {ds.camera_keys}")
        for key in [self.action_key] + ([self.state_key] if self.state_key else []):
            ds.feature_dim(key)  # raises DataError naming info.json if missing

    def _build_index(self, episodes: list[int]) -> np.ndarray:
        need = self.chunk_length + 1
        pairs = [(ep, s) for ep in episodes
                 for s in range(0, self.dataset.episode_length(ep) - need + 1, self.stride)]
        if self.keep_ranges is not None and pairs:
            pairs = self._filter(pairs)
        if not pairs:
            longest = max((self.dataset.episode_length(ep) for ep in episodes), default=0)
            raise DataError(f"{self.dataset.root}: episodes", f"no episode has {need} frames for chunk_length="
                            f"{self.chunk_length} (longest of {len(episodes)} selected has {longest})",
                            f"lower data.chunk_length to at most {max(longest - 1, 0)} or add longer episodes")
        return np.asarray(pairs, dtype=np.int64)

    def _filter(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        keys = trajectory_keys(self.dataset, self.trajectory_key_field)
        arr = np.asarray(pairs, dtype=np.int64)
        kept = []
        for ep in dict.fromkeys(int(e) for e in arr[:, 0]):
            starts = self.keep_ranges.starts(keys[ep], arr[arr[:, 0] == ep, 1], self.chunk_length)
            kept.extend((ep, int(s)) for s in starts)
        if not kept:
            raise NoWindowsKept(f"data.keep_ranges_path: {self.keep_ranges.source}", f"keeps no window of the "
                            f"{len(set(arr[:, 0].tolist()))} selected episodes (chunk_length={self.chunk_length}); "
                            f"episode keys look like {sorted(set(keys.values()))[:3]}, filter keys like "
                            f"{sorted(self.keep_ranges.ranges)[:3]}",
                            "check data.trajectory_key_field and that ranges are longer than chunk_length")
        return kept

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Window:
        ep, start = (int(v) for v in self.index[i])
        T = self.chunk_length
        keys = [self.action_key] + ([self.state_key] if self.state_key else [])
        cols = self.dataset.episode_columns(ep, keys)
        video = self._decode(ep, np.arange(start, start + T + 1)) if self.decode_video else None
        state = goal_state = None
        if self.state_key:
            episode_state = _as_2d(cols[self.state_key])
            state = torch.from_numpy(episode_state[start:start + T + 1].astype(np.float32))
            self._check_finite(ep, start, self.state_key, state)
            if self.goal_horizon is not None:
                last = len(episode_state) - 1
                goal_at = min(start + self.goal_horizon, last) if self.goal_horizon > 0 else last
                goal_state = torch.from_numpy(episode_state[goal_at].astype(np.float32))
                self._check_finite(ep, goal_at, self.state_key, goal_state[None])
        action = torch.from_numpy(_as_2d(cols[self.action_key][start:start + T]).astype(np.float32))
        self._check_finite(ep, start, self.action_key, action)
        return Window(video=video, state=state, action=action, task=self.dataset.frame_task(ep, start), episode_index=ep,
                      start=start, goal_state=goal_state)

    def _decode(self, ep: int, frames: np.ndarray) -> torch.Tensor | list[torch.Tensor]:
        """[V, T+1, H, W, 3] uint8, each camera decoded straight into its columns of one side-by-side buffer
        [T+1, H, V*W, 3] (so tiling the views for the canvas is a view, not a copy); a list of per-camera
        [T+1, H_v, W_v, 3] when the cameras differ in size."""
        sizes = [self.dataset.frame_size(cam) for cam in self.camera_keys]
        if len(set(sizes)) > 1:
            views = [frame_buffer((len(frames), h, w, 3)) for h, w in sizes]
            for view, cam in zip(views, self.camera_keys):
                self.dataset.decode_frames(ep, cam, frames, out=view.numpy())
            return views
        (h, w), views = sizes[0], len(sizes)
        buffer = frame_buffer((len(frames), h, views * w, 3))
        array = buffer.numpy()
        for v, cam in enumerate(self.camera_keys):
            self.dataset.decode_frames(ep, cam, frames, out=array[:, :, v * w:(v + 1) * w])
        return buffer.view(len(frames), h, views, w, 3).permute(2, 0, 1, 3, 4)

    def _check_finite(self, ep: int, start: int, key: str, values: torch.Tensor) -> None:
        """NaN/inf in a window would poison the loss silently: name the file, column, frame and channel."""
        bad = torch.nonzero(~torch.isfinite(values))
        if len(bad):
            r, c = (int(v) for v in bad[0])
            raise DataError(f"{self.dataset._data_path(ep)}[{key!r}]", f"{len(bad)} NaN/inf value(s) in the window "
                            f"of episode {ep} starting at frame {start}; first at frame_index {start + r}, channel {c}",
                            "repair or drop those frames (`wamkit data doctor` lists every one)")


def _as_2d(x: np.ndarray) -> np.ndarray:
    """Scalar features become one channel so every vector is [rows, channels]."""
    return x.reshape(len(x), -1)
