"""What every inference-side user of a checkpoint reads from its data contract: dims, chunk, fps,
cameras, the normalizers, and the noise shift training used. One place, so a policy and a world
model built from the same checkpoint can never disagree."""

from __future__ import annotations

from wamkit.data import Normalizer
from wamkit.diffusion.flow import resolution_shift
from wamkit.errors import WamkitError


class ContractModel:
    """Base of Policy and WorldModel: `self.loaded` is a wamkit.policy.loading.LoadedModel."""

    def _init_contract(self, loaded) -> None:
        self.loaded, self.model, self.contract = loaded, loaded.model, loaded.contract
        self.video_tokenizer, self.text_tokenizer = loaded.video_tokenizer, loaded.text_tokenizer
        self.action_normalizer = Normalizer.from_state_dict(self.contract["action_normalizer"])
        state_norm = self.contract.get("state_normalizer")
        if self.use_state and state_norm is None:
            raise WamkitError("data contract", "use_state is true but there is no state_normalizer", "re-save the checkpoint")
        self.state_normalizer = Normalizer.from_state_dict(state_norm) if self.use_state else None

    @property
    def chunk_length(self) -> int:
        return int(self.contract["chunk_length"])

    @property
    def action_dim(self) -> int:
        return int(self.contract["action_dim"])

    @property
    def state_dim(self) -> int:
        return int(self.contract.get("state_dim") or 0)

    @property
    def max_action_dim(self) -> int:
        return int(self.contract["max_action_dim"])

    @property
    def use_state(self) -> bool:
        return bool(self.contract["use_state"])

    @property
    def camera_keys(self) -> list[str]:
        return list(self.contract.get("camera_keys") or [])

    @property
    def fps(self) -> float:
        return float(self.contract["fps"])

    @property
    def video_prediction(self) -> str:
        """What the network's video output is (the run's `diffusion.video_prediction`; older runs: velocity)."""
        return str(self.loaded.diffusion.get("video_prediction", "velocity"))

    @property
    def future_video_latents(self) -> int:
        """Future latent frames the policy generates beside its actions (the run's `diffusion.future_video_latents`;
        0, and older runs: the whole chunk's)."""
        return int(self.loaded.diffusion.get("future_video_latents", 0) or 0)

    @property
    def future_video_stride(self) -> int:
        """Frames between the video frames the policy's future latents stack (the run's `diffusion.future_video_stride`;
        1, and older runs: consecutive frames)."""
        return int(self.loaded.diffusion.get("future_video_stride", 1) or 1)

    @property
    def action_prediction(self) -> str:
        """What the network's action output is (the run's `diffusion.action_prediction`; older runs: velocity)."""
        return str(self.loaded.diffusion.get("action_prediction", "velocity"))

    def training_shift(self, height: int, width: int) -> float:
        """The noise shift training used for frames of this size."""
        d = self.loaded.diffusion
        if d.get("shift", 0.0) > 0:
            return float(d["shift"])
        return resolution_shift(height, width, float(d["base_shift"]), int(d["base_resolution"]))
