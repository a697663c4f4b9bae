"""Turn a raw Window into the model's fixed-shape input.

The model has one action width (`model.max_action_dim`) shared across robots/datasets, so actions and
state are normalized then zero-padded to it, with a mask marking the real channels; several cameras
are tiled side by side into one video, since the model consumes a single video stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wamkit.data.canvas import CanvasTransform
from wamkit.data.frame_pool import pooled, ship_from_workers
from wamkit.data.normalize import Normalizer
from wamkit.data.windows import Window
from wamkit.errors import DataError


@ship_from_workers
@dataclass
class TrainingSample:
    """video [T+1, H, W, 3] uint8 (the camera canvas), actions [T, A] f32, state [A] f32 | None, action_mask [A] bool;
    `latents` [C, t, h, w] when the video was tokenized ahead of time (then `video` is None); with a state,
    goal_state [A] f32 (Window.goal_state, normalized and padded as `state`) and state_mask [A] bool."""

    video: torch.Tensor | None
    actions: torch.Tensor
    state: torch.Tensor | None
    action_mask: torch.Tensor
    task: str
    domain_id: int
    latents: torch.Tensor | None = None
    goal_state: torch.Tensor | None = None
    state_mask: torch.Tensor | None = None


class SampleTransform:
    """Window -> TrainingSample: normalize, pad to max_action_dim, compose the cameras (`canvas`,
    default: side by side at native resolution); `frame_indices` keeps only those of the window's frames
    (`diffusion.future_video_latents` / `future_video_stride`: wamkit.model.tokenizer.sample_frame_indices)."""

    def __init__(self, action_normalizer: Normalizer, state_normalizer: Normalizer | None, max_action_dim: int,
                 use_state: bool, domain_id: int, canvas: CanvasTransform | None = None,
                 frame_indices: list[int] | None = None):
        if max_action_dim < 1:
            raise DataError("model.max_action_dim", f"is {max_action_dim}", "set a positive max_action_dim")
        if use_state and state_normalizer is None:
            raise DataError("data.use_state", "is true but no state normalizer was given",
                            "set a state feature (data.state_key) or set data.use_state = false")
        self.action_normalizer, self.state_normalizer = action_normalizer, state_normalizer
        self.max_action_dim, self.use_state, self.domain_id = int(max_action_dim), bool(use_state), int(domain_id)
        self.canvas = canvas or CanvasTransform()
        self.frame_indices = list(frame_indices) if frame_indices is not None else None
        self._check_dim(action_normalizer.dim, action_normalizer.key)
        if use_state:
            self._check_dim(state_normalizer.dim, state_normalizer.key)

    def _check_dim(self, dim: int | None, feature: str) -> None:
        if dim is not None and dim > self.max_action_dim:
            raise DataError("model.max_action_dim", f"is {self.max_action_dim} but dataset feature {feature!r} "
                            f"has {dim} channels", f"raise model.max_action_dim to at least {dim}")

    def _pad(self, x: torch.Tensor, feature: str) -> torch.Tensor:
        self._check_dim(x.shape[-1], feature)
        return torch.nn.functional.pad(x, (0, self.max_action_dim - x.shape[-1]))

    def _kept(self, video):
        """The window's cameras ([V, T+1, H, W, 3], or one [T+1, H, W, 3] a camera), only the frames at frame_indices."""
        if self.frame_indices is None:
            return video
        at = self.frame_indices
        return [v[at] for v in video] if isinstance(video, (list, tuple)) else video[:, at]

    def __call__(self, window: Window) -> TrainingSample:
        action = window.action.float()
        actions = self._pad(self.action_normalizer.normalize(action), self.action_normalizer.key)
        mask = torch.zeros(self.max_action_dim, dtype=torch.bool)
        mask[: action.shape[-1]] = True
        state = goal_state = state_mask = None
        if self.use_state:
            if window.state is None:
                raise DataError("data.use_state", f"is true but window of episode {window.episode_index} has no "
                                "state", "set data.state_key to the dataset's state feature or use_state = false")
            state = self._normalized_state(window.state[0])
            if window.goal_state is not None:
                goal_state = self._normalized_state(window.goal_state)
                state_mask = torch.arange(self.max_action_dim) < window.goal_state.shape[-1]
        # [V,T+1,H,W,3] -> [T+1,H',W',3]; in a loader worker over a slot of its frame pool (a new tensor is copied into one)
        video = pooled(self.canvas(self._kept(window.video)).contiguous()) if window.video is not None else None
        return TrainingSample(video=video, actions=actions.float(), state=state, action_mask=mask, task=window.task,
                              domain_id=self.domain_id, goal_state=goal_state, state_mask=state_mask)

    def _normalized_state(self, state: torch.Tensor) -> torch.Tensor:
        return self._pad(self.state_normalizer.normalize(state.float()), self.state_normalizer.key).float()
