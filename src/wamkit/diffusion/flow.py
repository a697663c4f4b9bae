"""Rectified flow, as the reference trains Cosmos3: x_s = s*eps + (1-s)*x0, velocity target
v = eps - x0, one noise level s per sample shared by all its noisy tokens (the action chunk draws its own
with `diffusion.action_sigma = "independent"`); clean tokens keep x0."""

from __future__ import annotations

import math

import torch

from wamkit.config.schema import PREDICTIONS, X0_LOSS_WEIGHTINGS

X0_LOSS_MIN_SIGMA = 0.05  # x0 prediction's velocity loss divides by max(s, this): finite near s = 0


def shift_sigma(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    """Push noise levels towards 1 for larger shift: s' = k s / (1 + (k - 1) s)."""
    return shift * sigma / (1.0 + (shift - 1.0) * sigma)


def resolution_shift(height: int, width: int, base_shift: float, base_resolution: int) -> float:
    """More pixels carry more redundant signal, so training needs noisier samples to stay hard."""
    return base_shift * math.sqrt(height * width / float(base_resolution**2))


def sample_sigmas(n: int, generator: torch.Generator, shift: float, logit_mean: float = 0.0, logit_std: float = 1.0) -> torch.Tensor:
    """Logit-normal noise levels, then shifted."""
    return sigmas_from_normals(torch.randn(n, generator=generator), shift, logit_mean, logit_std)


def sigmas_from_normals(normals: torch.Tensor, shift: float, logit_mean: float = 0.0, logit_std: float = 1.0) -> torch.Tensor:
    """The noise levels of standard-normal draws (sample_sigmas' transform): elementwise, so a batch of
    draws from many generators, transformed at once, gives each the value it would get alone."""
    return shift_sigma(torch.sigmoid(normals * logit_std + logit_mean), shift)


def add_noise(x0: torch.Tensor, sigma: float, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (x_sigma, velocity target)."""
    return sigma * noise + (1.0 - sigma) * x0, noise - x0


def as_velocity(prediction: torch.Tensor, x_s: torch.Tensor, sigma: float, kind: str) -> torch.Tensor:
    """A network output (video or actions) as the velocity eps - x0 that the samplers integrate.

    kind "x0" (`diffusion.video_prediction` / `action_prediction`): x_s = s eps + (1 - s) x0 gives v = (x_s - x0) / s,
    so an Euler step to s' lands on (s'/s) x_s + (1 - s'/s) x0_hat and the last one (s' = 0) on
    x0_hat itself. Samplers never evaluate s = 0."""
    if kind == "velocity":
        return prediction
    if kind == "x0":
        return (x_s - prediction) / float(sigma)
    raise ValueError(f"unknown prediction {kind!r}: use one of {list(PREDICTIONS)}")


def guided_velocity(outputs: torch.Tensor, x_s: torch.Tensor, sigma: float, kind: str, guidance: float | None) -> torch.Tensor:
    """The velocities of a batch's network outputs ([n, ...] like `x_s`, or [2n, ...] with the
    unconditional twins after the conditional samples); with `guidance`, mixed as v_u + g (v_c - v_u)."""
    n = len(x_s)
    v = as_velocity(outputs[:n], x_s, sigma, kind)
    if guidance is None:
        return v
    v_uncond = as_velocity(outputs[n:], x_s, sigma, kind)
    return v_uncond + guidance * (v - v_uncond)


def x0_loss_weight(sigma: float, weighting: str = "velocity") -> float:
    """Weight of an x0 squared error at noise level s (`diffusion.x0_loss_weighting`): "velocity"
    turns it into the velocity squared error it implies, "uniform" keeps it as it is."""
    if weighting == "velocity":
        return 1.0 / max(float(sigma), X0_LOSS_MIN_SIGMA) ** 2
    if weighting == "uniform":
        return 1.0
    raise ValueError(f"unknown x0 loss weighting {weighting!r}: use one of {list(X0_LOSS_WEIGHTINGS)}")


def to_video_residual(latents: torch.Tensor) -> torch.Tensor:
    """Latent frames 1.. as differences from latent frame 0 (time is dim -3: [.., C, T, h, w]).

    With `diffusion.video_residual` the network generates these differences, so an all-zero
    prediction is the copy-last-frame video and only what changes has to be learned. Frame 0 (the
    observed, clean frame) is kept as it is."""
    out = latents.clone()
    out[..., 1:, :, :] -= latents[..., :1, :, :]
    return out


def from_video_residual(latents: torch.Tensor) -> torch.Tensor:
    """The inverse of `to_video_residual`."""
    out = latents.clone()
    out[..., 1:, :, :] += latents[..., :1, :, :]
    return out
