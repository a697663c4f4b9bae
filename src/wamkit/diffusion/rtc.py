"""Real-time chunking (Black, Galliker, Levine 2025, "Real-Time Execution of Action Chunking Flow
Policies"): sample the next chunk as an inpainting of the actions the robot has already committed to.

While chunk k+1 is computed the robot keeps executing chunk k, so the first `delay` actions of the new
chunk are already fixed: they are whatever chunk k says. Sampled freely, the new chunk may pick
another mode and the arm jumps at the seam. RTC steers every denoising step towards the committed
actions with pseudoinverse guidance (PiGDM): with the running clean estimate x0_hat = x_s - s v,

    v_guided = v - w(s) * J^T [W * (y - x0_hat)],   J = d x0_hat / d x_s (one vector-Jacobian product),

where y holds the committed actions, W is the soft mask (1 on the `delay` frozen actions, then an
exponential decay to 0 at `horizon`, 0 after), and w(s) = min(beta, (s^2 + (1-s)^2) / (s (1-s))) is
PiGDM's weight clipped at beta (the paper's beta = 5). Here s is our noise level (1 = noise, 0 =
data), i.e. 1 - tau in the paper's notation; the step x += ds * v with ds < 0 then moves x0_hat
towards y. The network is unchanged: this is inference-time only, no retraining."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEFAULT_MAX_GUIDANCE = 5.0  # the paper's beta: large weights early in sampling make chunks diverge


@dataclass
class InpaintTarget:
    """What one observation's chunk is steered towards, in model space.

    actions: normalized committed actions [chunk_length, max_action_dim] (rows past the committed
    ones and padded channels are zero); weights: the soft mask [chunk_length]; max_guidance: beta."""

    actions: torch.Tensor
    weights: torch.Tensor
    max_guidance: float = DEFAULT_MAX_GUIDANCE


def soft_mask(chunk_length: int, delay: int, horizon: int) -> torch.Tensor:
    """The paper's soft mask W: 1 for i < delay (actions executed before the chunk arrives),
    c_i (e^c_i - 1) / (e - 1) with c_i = (horizon - i) / (horizon - delay + 1) for delay <= i < horizon
    (still planned by the old chunk: trust it less the further out), 0 from horizon on (nothing to
    match). Soft rather than hard, because a hard mask lets the free part switch modes at once."""
    if not 0 <= delay <= horizon <= chunk_length:
        raise ValueError(f"need 0 <= delay ({delay}) <= horizon ({horizon}) <= chunk_length ({chunk_length})")
    i = torch.arange(chunk_length, dtype=torch.float64)
    c = ((horizon - i) / (horizon - delay + 1)).clamp(0.0, 1.0)
    decay = c * torch.expm1(c) / (math.e - 1.0)
    weights = torch.where(i < delay, torch.ones_like(i), torch.where(i < horizon, decay, torch.zeros_like(i)))
    return weights.float()


def guidance_weight(sigma: float, max_guidance: float) -> float:
    """PiGDM's weight (1 - tau) / (tau r_tau^2), r_tau^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2), with
    tau = 1 - sigma, clipped at `max_guidance` (it is infinite at pure noise)."""
    if sigma >= 1.0 or sigma <= 0.0:
        return float(max_guidance)
    return float(min(max_guidance, (sigma**2 + (1.0 - sigma) ** 2) / (sigma * (1.0 - sigma))))


def guided_velocities(rows: list[torch.Tensor], velocities: list[torch.Tensor], sigma: float,
                        targets: list[InpaintTarget], channel_masks: list[torch.Tensor], first: int) -> list[torch.Tensor]:
    """The guided action velocities of the steered samples of one step (detached).

    `rows[j]` ([first + T, D], requires grad) are the noisy rows the forward saw and `velocities[j]`
    the network's velocity for them, still attached to that graph; `first` clean rows (the state
    row) lead the action rows; `channel_masks[j]` ([D]) keeps padded channels out of the error. One backward serves every sample: the packed forward never lets one
    sample see another, so the gradient of the summed products is each sample's own VJP."""
    x0_hats = [r[first:] - sigma * v[first:] for r, v in zip(rows, velocities)]
    errors = [((t.actions.to(x.device, x.dtype) - x) * t.weights.to(x.device, x.dtype)[:, None] * m).detach()
              for t, x, m in zip(targets, x0_hats, channel_masks)]
    corrections = torch.autograd.grad(x0_hats, rows, grad_outputs=errors)
    return [v.detach() - guidance_weight(sigma, t.max_guidance) * c for v, t, c in zip(velocities, targets, corrections)]
