"""Flow-matching sampling of action chunks for packed batches (policy mode).

The training objective noises x_s = s*eps + (1-s)*x0 and the transformer predicts v = eps - x0, so
integrating dx/ds = v from s = 1 (pure noise) to s = 0 recovers x0; an Euler step from s_i to
s_{i+1} is x += (s_{i+1} - s_i) * v. As in training, latent frame 0 (the observed frame) and the
state row are clean; future video latents and the T action rows start from noise. Every sample of
a step (and, with guidance, its unconditional twin) goes through ONE packed forward, laid out once
per call."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from wamkit.diffusion.flow import guided_velocity, shift_sigma
from wamkit.diffusion.rtc import InpaintTarget, guided_velocities
from wamkit.model.denoise import DenoisingForward
from wamkit.model.packing import SequenceSample
from wamkit.model.tokenizer import future_latent_frames


@dataclass
class PolicyInput:
    """One observation, already in model space.

    frame: uint8 [H, W, 3] (several cameras already tiled side by side along W);
    state: normalized state padded to max_action_dim, or None when the model uses no state row;
    prompt: the text exactly as the model sees it (prompt template already applied);
    inpaint: real-time chunking's committed actions and soft mask (wamkit.diffusion.rtc), or None."""

    frame: torch.Tensor
    state: torch.Tensor | None
    prompt: str
    chunk_length: int
    action_dim: int
    domain_id: int = 0
    inpaint: InpaintTarget | None = None


def sigma_schedule(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """num_steps + 1 noise levels from 1 down to 0, shifted with s' = k s / (1 + (k-1) s)."""
    if num_steps < 1:
        raise ValueError(f"num_steps is {num_steps}; use at least 1 sampling step")
    if shift <= 0:
        raise ValueError(f"shift is {shift}; use a positive shift (1.0 = no shift)")
    base = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return shift_sigma(base, shift).float()


def _check_inputs(observations: list[PolicyInput], max_action_dim: int) -> None:
    if not observations:
        raise ValueError("observations is empty; pass at least one PolicyInput")
    for i, obs in enumerate(observations):
        if obs.frame.dtype != torch.uint8 or obs.frame.ndim != 3 or obs.frame.shape[-1] != 3:
            raise ValueError(f"observations[{i}].frame must be uint8 [H, W, 3], got {obs.frame.dtype} {tuple(obs.frame.shape)}")
        if obs.chunk_length < 1 or obs.chunk_length % 4:
            raise ValueError(f"observations[{i}].chunk_length is {obs.chunk_length}; it must be a positive multiple of 4")
        if not 1 <= obs.action_dim <= max_action_dim:
            raise ValueError(f"observations[{i}].action_dim is {obs.action_dim}; it must be in [1, {max_action_dim}]")
        if obs.state is not None and tuple(obs.state.shape) != (max_action_dim,):
            raise ValueError(f"observations[{i}].state must have shape [{max_action_dim}] (padded), got {tuple(obs.state.shape)}")
        if obs.inpaint is not None and (tuple(obs.inpaint.actions.shape) != (obs.chunk_length, max_action_dim)
                                        or tuple(obs.inpaint.weights.shape) != (obs.chunk_length,)):
            raise ValueError(f"observations[{i}].inpaint must hold actions [{obs.chunk_length}, {max_action_dim}] and weights "
                             f"[{obs.chunk_length}], got {tuple(obs.inpaint.actions.shape)} and {tuple(obs.inpaint.weights.shape)}")
    if len({o.state is None for o in observations}) > 1:
        raise ValueError("either every observation has a state row or none does")


def _generators(generator, n: int) -> list[torch.Generator]:
    if isinstance(generator, (list, tuple)):
        if len(generator) != n:
            raise ValueError(f"got {len(generator)} generators for {n} observations")
        return list(generator)
    return [generator] * n


@torch.no_grad()
def sample_policy(
    model, processor, video_tokenizer, text_tokenizer, observations: list[PolicyInput], num_steps: int,
    shift: float, generator: torch.Generator | list[torch.Generator], fps: float, guidance: float = 1.0,
    uncond_prompt: str = "", cache_text: bool = True, video_prediction: str = "velocity",
    action_prediction: str = "velocity", reuse_text_kv: bool = False, noise_scale: float = 1.0,
    future_latents: int = 0, future_stride: int = 1,
) -> torch.Tensor:
    """Sample one action chunk per observation; returns normalized actions [B, T, max_action_dim]
    (channels >= each observation's action_dim are zero).

    `generator` is one generator (noise is drawn sample after sample, so calling once per sample
    with the same generator object gives the same noise) or one generator per observation.
    `guidance` > 1 mixes in an unconditional prediction (prompt `uncond_prompt`), packed in the
    same forward: v = v_u + g (v_c - v_u); guidance = 1.0 is off. `cache_text` computes the text
    pathway once per call instead of once per step (exact; see wamkit.model.denoise); with
    `reuse_text_kv` also once for every later call with the same prompts (the weights must not change).
    `video_prediction` / `action_prediction`: what the network's video / action outputs are (the
    run's `diffusion.video_prediction` / `action_prediction`). An observation with `inpaint` is
    steered towards its committed actions (real-time chunking, wamkit.diffusion.rtc): one extra
    backward per denoising step through the pack. `future_latents` / `future_stride`: the future latent
    frames generated beside the actions (the run's `diffusion.future_video_latents` / `future_video_stride`; 0 / 1:
    the whole chunk's). `noise_scale` multiplies the noise the chunk (video and
    actions) starts from: 1 samples the trained distribution, < 1 nearer its mode, 0 gives the same chunk
    for every seed (the draws are made either way, so a generator advances alike)."""
    if not noise_scale >= 0:
        raise ValueError(f"noise_scale is {noise_scale}; it must be >= 0 (1 = the trained distribution)")
    max_action_dim = int(model.config.action_dim)
    _check_inputs(observations, max_action_dim)
    if len({o.chunk_length for o in observations}) > 1:
        raise ValueError("all observations of one call must share chunk_length")
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    gens = _generators(generator, len(observations))
    sigmas = sigma_schedule(num_steps, shift).tolist()
    use_cfg = float(guidance) != 1.0

    # Condition: only latent frame 0 is clean, and both tokenizers are causal in time (frame 0 is
    # encoded alone), so encoding the observed frame by itself gives exactly training's frame-0
    # latent; the other 1 + T/4 - 1 latent frames start as noise. One encoder call per frame size.
    first_latents = _encode_first_frames(video_tokenizer, [o.frame for o in observations])
    t = 1 + future_latent_frames(observations[0].chunk_length, future_latents, future_stride)
    x0_frames, videos, rows, masks, clean_rows = [], [], [], [], []
    for obs, gen, first in zip(observations, gens, first_latents):
        mask = torch.zeros(max_action_dim)
        mask[: obs.action_dim] = 1.0
        video = torch.randn((first.shape[0], t, *first.shape[1:]), generator=gen) * noise_scale
        video[:, 0] = first
        actions = torch.randn((obs.chunk_length, max_action_dim), generator=gen) * mask * noise_scale
        clean = []
        if obs.state is not None:
            actions = torch.cat([obs.state.float().cpu().unsqueeze(0), actions])
            clean = [0]
        x0_frames.append(first.to(device, non_blocking=True))  # no blocking copy (a stream sync) per observation
        videos.append(video.to(device, non_blocking=True))
        rows.append(actions.to(device, non_blocking=True))
        masks.append(mask.to(device, non_blocking=True))
        clean_rows.append(clean)

    texts = [text_tokenizer.encode(o.prompt) for o in observations]
    uncond_text = text_tokenizer.encode(uncond_prompt) if use_cfg else None

    seqs = [_sequence(texts[i], videos[i], rows[i], clean_rows[i], 1.0, obs, fps, dtype) for i, obs in enumerate(observations)]
    if use_cfg:
        seqs += [_sequence(uncond_text, videos[i], rows[i], clean_rows[i], 1.0, obs, fps, dtype) for i, obs in enumerate(observations)]
    n = len(observations)
    first = 1 if observations[0].state is not None else 0
    steered = [i for i, o in enumerate(observations) if o.inpaint is not None]
    # One tensor per quantity for the whole batch (every sample has one shape): a step costs the same
    # few kernels for 1 observation or 15, where a per-sample loop launched ~30 per sample.
    videos_t, rows_t, x0_t = torch.stack(videos), torch.stack(rows), torch.stack(x0_frames)
    masks_t = torch.stack(masks)[:, None]  # [n, 1, D]
    states_t = torch.stack([o.state.float() for o in observations]).to(device, non_blocking=True) if first else None
    with DenoisingForward(model, processor, seqs, cache_text=cache_text, reuse_text=reuse_text_kv, merge=True) as forward:
        for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
            # RTC needs d x0_hat / d x_s: the noisy action rows take gradients (only the steered ones' are used)
            with torch.enable_grad() if steered else contextlib.nullcontext():
                if steered:
                    rows_t = rows_t.detach().requires_grad_(True)
                row_views, video_views = list(rows_t.unbind(0)), list(videos_t.unbind(0))
                out = forward(video_views * (2 if use_cfg else 1), row_views * (2 if use_cfg else 1), sigma)
                v_videos, v_actions = _velocities(forward.batch, out, videos_t, rows_t, sigma, guidance if use_cfg else None,
                                                  video_prediction, action_prediction)
                if steered:
                    guided = guided_velocities([row_views[i] for i in steered], [v_actions[i] for i in steered], sigma,
                                               [observations[i].inpaint for i in steered], [masks[i] for i in steered], first)
                    v_actions = v_actions.detach().clone()
                    v_actions[steered] = torch.stack(guided)
            dt = sigma_next - sigma
            videos_t = videos_t + dt * v_videos.detach()
            videos_t[:, :, 0] = x0_t
            rows_t = (rows_t.detach() + dt * v_actions.detach()) * masks_t
            if first:
                rows_t[:, 0] = states_t.to(rows_t.dtype)

    return rows_t[:, first:]


def _velocities(batch, out, videos: torch.Tensor, rows: torch.Tensor, sigma: float, cfg: float | None, video_prediction: str,
                action_prediction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's video and action velocities of one forward ([n, ...] like `videos` and `rows`);
    with `cfg`, the conditional and unconditional halves of the pack mixed (guided_velocity)."""
    sample = batch.video_outputs(out).float()
    action = batch.action_outputs(out).float()
    return (guided_velocity(sample, videos, sigma, video_prediction, cfg),
            guided_velocity(action, rows, sigma, action_prediction, cfg))


def _sequence(text_ids, video, rows, clean_rows, sigma, obs: PolicyInput, fps: float, dtype) -> SequenceSample:
    return SequenceSample(
        text_ids=text_ids, video=video.to(dtype), actions=rows.to(dtype), clean_video_frames=[0],
        clean_action_rows=clean_rows, sigma=float(sigma), domain_id=obs.domain_id, fps=fps,
        action_start_frame=0 if clean_rows else 1,
    )


def _encode_first_frames(video_tokenizer, frames: list[torch.Tensor]) -> list[torch.Tensor]:
    """uint8 [H, W, 3] frames -> latent frame 0 of each, [C, h, w] float on the CPU."""
    groups: dict[tuple, list[int]] = {}
    for i, frame in enumerate(frames):
        groups.setdefault(tuple(frame.shape), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(frames)
    with torch.no_grad():
        for indices in groups.values():
            clips = torch.stack([frames[i] for i in indices]).unsqueeze(1)  # [B, 1, H, W, 3]
            latents = video_tokenizer.encode(clips)[:, :, 0].float().cpu()
            for j, i in enumerate(indices):
                out[i] = latents[j]
    return out
