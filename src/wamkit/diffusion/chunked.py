"""The chunk layout and per-chunk step rules of block-causal (chunk-autoregressive) world models.

With `diffusion.causal_chunk_frames = K`, latent frame 0 is chunk 0 and frames 1.. form chunks of K
frames. Training (stage 1's teacher forcing), distillation (stage 2's TF-dCM, stage 3's SF-DMD rollout)
and evaluation must cut chunks identically, so the cut lives here, below all three.

Two ways to take one step of a chunk from noise level s to s' (s' < s), given the network's velocity v:
  euler        x' = x + (s' - s) v                                   (an ODE step: the stage-1 teacher)
  consistency  x0 = x - s v;  x' = s' eps + (1 - s') x0, fresh eps   (multistep consistency sampling:
               the distilled student on its saved few-step ladder)
Both land on x0 = x - s v at s' = 0."""

from __future__ import annotations

import torch

CHUNK_SAMPLERS = ("euler", "consistency")


def chunk_ids(num_frames: int, chunk_frames: int) -> list[int]:
    """The chunk of every latent frame: [0, 1, .., 1, 2, ..] with `chunk_frames` frames per chunk."""
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames is {chunk_frames}; a block-causal layout has chunks of >= 1 latent frames")
    return [0] + [1 + (f - 1) // chunk_frames for f in range(1, num_frames)]


def chunk_frames_of(ids: list[int], chunk: int) -> list[int]:
    return [f for f, c in enumerate(ids) if c == chunk]


def chunk_step(sampler: str, x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_next: float,
               generator: torch.Generator | list[torch.Generator] | None = None) -> torch.Tensor:
    """One step of `sampler` (see the module docstring); `generator` draws the consistency re-noise, or
    a list of them one sample each along x's first dimension (each sample's noise then does not depend
    on which other samples share the batch)."""
    if sampler == "euler":
        return x + (sigma_next - sigma) * v
    if sampler == "consistency":
        x0 = x - sigma * v
        if sigma_next == 0:
            return x0
        if isinstance(generator, (list, tuple)):
            noise = torch.stack([torch.randn(x.shape[1:], generator=g) for g in generator])
        else:
            noise = torch.randn(x.shape, generator=generator)
        return sigma_next * noise.to(x.device, non_blocking=True) + (1 - sigma_next) * x0  # a blocking copy would drain the GPU's queue
    raise ValueError(f"unknown chunk sampler {sampler!r}: use one of {CHUNK_SAMPLERS}")
