"""A LeRobot policy (ACT, Diffusion Policy; lerobot >= 0.6) behind the interface that wamkit's
closed-loop harness (`wamkit.eval.sim_eval.evaluate`) uses from a `wamkit.policy.Policy`:
`predict(list of raw observations) -> list of raw action chunks [T, action_dim]`, plus the attributes
it reads (chunk_length, action_dim, state_dim, use_state, camera_keys, fps, num_steps, contract,
loaded.source). Nothing here imports lerobot: the caller builds the policy and its processors.

Raw observation in: `{"image": uint8 [H, W, 3], "state": float [Ds], "prompt": str}` (the prompt is
ignored: ACT and Diffusion Policy are not language-conditioned; several cameras: `"image"` is a list of
[H, W, 3] views in `camera_keys` order). Each view becomes float [3, H, W] in [0, 1] under its dataset
camera key, the state `observation.state`; LeRobot's own preprocessor
normalizes them and its postprocessor turns the predicted chunk back into raw action units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace

import numpy as np
import torch

from wamkit.errors import WamkitError

STATE_KEY = "observation.state"


class LeRobotAdapterError(WamkitError, ValueError):
    """An observation or policy does not fit the adapter."""


def add_obs_steps_dim(batch: dict, policy) -> dict:
    """Diffusion Policy reads the state as [B, n_obs_steps, Ds] (it adds the step axis to images
    itself); ACT reads [B, Ds]. With one observation step, add that axis for the diffusion policy."""
    if getattr(policy, "name", "") == "diffusion" and batch[STATE_KEY].ndim == 2:
        batch = dict(batch)
        batch[STATE_KEY] = batch[STATE_KEY].unsqueeze(1)
    return batch


class LeRobotPolicy:
    """Raw observations in, raw action chunks out, for a LeRobot policy and its processor pipelines."""

    use_state = True

    def __init__(self, policy, preprocessor, postprocessor, *, camera_keys: Sequence[str], chunk_length: int,
                 action_dim: int, state_dim: int, fps: float, source: dict | None = None, num_steps: int = 1,
                 contract: dict | None = None):
        self.policy, self.preprocessor, self.postprocessor = policy, preprocessor, postprocessor
        if isinstance(camera_keys, str) or not camera_keys:
            raise LeRobotAdapterError("camera_keys", f"is {camera_keys!r}", "pass the list of the dataset's camera keys")
        self.camera_keys = list(camera_keys)
        self.chunk_length, self.action_dim, self.state_dim = int(chunk_length), int(action_dim), int(state_dim)
        self.fps = float(fps)
        self.num_steps = int(num_steps)  # reported only: the policy's own config sets its sampler steps
        # the training data's contract (wamkit.train.setup: dataset, state_key, canvas) when the caller has one: the
        # world-model judge checks it against the world model's; without it pass `resolution=` to evaluate()
        self.contract: dict = dict(contract or {})
        self.loaded = SimpleNamespace(source={"kind": "lerobot", "policy": getattr(policy, "name", type(policy).__name__),
                                              **(source or {})},
                                      model_info={"mode": "policy"})  # acts from a frame (wamkit.worldmodel.policy_eval)

    def _observation_batch(self, observations: list[Mapping]) -> dict:
        if isinstance(observations, Mapping) or not isinstance(observations, (list, tuple)) or not observations:
            raise LeRobotAdapterError("observations", "must be a non-empty list of dicts", "predict([obs])")
        images, states = {key: [] for key in self.camera_keys}, []
        for i, obs in enumerate(observations):
            state = np.asarray(obs.get("state"), dtype=np.float32)
            for key, view in zip(self.camera_keys, self._views(f"observations[{i}]['image']", obs.get("image"))):
                images[key].append(torch.from_numpy(np.ascontiguousarray(view)).permute(2, 0, 1).float() / 255.0)
            if state.shape != (self.state_dim,):
                raise LeRobotAdapterError(f"observations[{i}]['state']", f"shape is {state.shape}",
                                          f"pass the {self.state_dim}-D robot state")
            states.append(torch.from_numpy(state))
        return {**{key: torch.stack(views) for key, views in images.items()}, STATE_KEY: torch.stack(states)}

    def _views(self, where: str, image) -> list[np.ndarray]:
        """One uint8 [H, W, 3] view per camera: the image itself for one camera, else a list in camera order."""
        views = list(image) if isinstance(image, (list, tuple)) else [image]
        views = [np.asarray(v) for v in views]
        if len(views) != len(self.camera_keys):
            raise LeRobotAdapterError(where, f"has {len(views)} view(s), the policy was trained on {self.camera_keys}",
                                      "pass one uint8 [H, W, 3] image per camera, as a list in that order")
        for view in views:
            if view.dtype != np.uint8 or view.ndim != 3 or view.shape[-1] != 3:
                raise LeRobotAdapterError(where, f"is {view.dtype} {view.shape}", "pass uint8 [H, W, 3] camera images")
        return views

    @torch.no_grad()
    def predict(self, observations: list[Mapping], seed: int | torch.Generator = 0, num_steps: int | None = None,
                guidance: float | None = None) -> list[np.ndarray]:
        """One float32 [chunk_length, action_dim] chunk per observation, in raw robot units. `seed`
        seeds torch's global generator (LeRobot's samplers draw from it); `num_steps`/`guidance` are
        accepted for interface compatibility and ignored."""
        torch.manual_seed(seed.initial_seed() if isinstance(seed, torch.Generator) else int(seed))
        self.policy.eval()
        batch = add_obs_steps_dim(self.preprocessor(self._observation_batch(observations)), self.policy)
        actions = self.postprocessor(self.policy.predict_action_chunk(batch))
        actions = actions[:, : self.chunk_length, : self.action_dim].float().cpu().numpy()
        if actions.shape[1] != self.chunk_length:
            raise LeRobotAdapterError("predict", f"the policy returned {actions.shape[1]} actions per chunk, "
                                      f"expected {self.chunk_length}", "set chunk_length to its n_action_steps")
        return [chunk.astype(np.float32) for chunk in actions]
