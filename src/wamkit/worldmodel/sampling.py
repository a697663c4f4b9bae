"""Forward-dynamics (world-model) sampling: given the observed first frame and a chunk of actions,
generate the future video.

As in `model.mode = "forward_dynamics"` training, latent frame 0 (the observed frame), the optional
state row and EVERY action row are clean conditioning; only the future video latents start from
noise. The flow convention is the training one: x_s = s*eps + (1-s)*x0, the network predicts
v = eps - x0, and integration runs from s = 1 to s = 0 on the (shifted) `sigma_schedule`.

Solvers:
  "euler"  x += (s_{i+1} - s_i) * v
  "unipc"  diffusers' UniPCMultistepScheduler in flow mode (`use_flow_sigmas=True`,
           `prediction_type="flow_prediction"`, given the same shifted sigmas through
           `set_timesteps(sigmas=...)`; it computes x0 = x - s*v, which is exact for this convention).
Every sample of a step (and, where guidance applies, its unconditional twin with the empty prompt)
goes through ONE packed forward. Guidance (v = v_u + g (v_c - v_u)) applies only at steps whose
noise level s lies inside `guidance_interval` = (low, high); guidance = 1.0 is off.

The seed's evaluation setting is `num_steps=30, guidance=1.0, shift=10.0, solver="euler"`
(`SEED_EVAL_SETTING`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from wamkit.diffusion.flow import from_video_residual, guided_velocity
from wamkit.diffusion.sampling import _generators, sigma_schedule
from wamkit.model.denoise import DenoisingForward
from wamkit.model.packing import SequenceSample
from wamkit.model.tokenizer import TEMPORAL_FACTOR

SOLVERS = ("euler", "unipc")
SEED_EVAL_SETTING = {"num_steps": 30, "guidance": 1.0, "shift": 10.0, "solver": "euler", "guidance_interval": (0.0, 1.0)}


def _check(first_frames: torch.Tensor, actions: torch.Tensor, states, max_action_dim: int, prompts, solver: str):
    if first_frames.dtype != torch.uint8 or first_frames.ndim != 4 or first_frames.shape[-1] != 3:
        raise ValueError(f"first_frames must be uint8 [B, H, W, 3], got {first_frames.dtype} {tuple(first_frames.shape)}")
    b = first_frames.shape[0]
    if b == 0:
        raise ValueError("first_frames is empty; pass at least one frame")
    if actions.ndim != 3 or actions.shape[0] != b or actions.shape[2] != max_action_dim:
        raise ValueError(f"actions must be normalized and padded [B={b}, T, max_action_dim={max_action_dim}], got {tuple(actions.shape)}")
    t = actions.shape[1]
    if t < 1 or t % TEMPORAL_FACTOR:
        raise ValueError(f"actions have T = {t} rows; T must be a positive multiple of {TEMPORAL_FACTOR} (the chunk length)")
    if states is not None and tuple(states.shape) != (b, max_action_dim):
        raise ValueError(f"states must be None or normalized and padded [B={b}, max_action_dim={max_action_dim}], got {tuple(states.shape)}")
    if len(prompts) != b:
        raise ValueError(f"got {len(prompts)} prompts for {b} samples")
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}: use one of {SOLVERS}")


def _unipc_scheduler(sigmas: list[float]):
    """Diffusers' UniPC (order 2) on the given, already shifted, noise levels; one serves the whole batch."""
    try:
        from diffusers import UniPCMultistepScheduler
    except ImportError as exc:  # pragma: no cover - diffusers is a hard dependency
        raise NotImplementedError("solver='unipc' needs diffusers.UniPCMultistepScheduler (pip install diffusers)") from exc
    s = UniPCMultistepScheduler(num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True,
                                flow_shift=1.0, solver_order=2, final_sigmas_type="zero")
    # Already shifted (flow_shift=1 keeps them); a numpy array: diffusers 0.42 arithmetics fails on a
    # plain list despite its `list[float]` hint. The scheduler appends the final 0.
    s.set_timesteps(sigmas=np.asarray(sigmas[:-1], dtype=np.float64))
    return s


@torch.no_grad()
def sample_video(
    model, processor, video_tokenizer, text_tokenizer, first_frames: torch.Tensor, actions: torch.Tensor,
    states: torch.Tensor | None, num_steps: int, shift: float, guidance: float = 1.0,
    guidance_interval: Sequence[float] = (0.0, 1.0), generator: torch.Generator | list[torch.Generator] | None = None,
    fps: float = 10.0, solver: str = "euler", prompts: Sequence[str] | None = None, domain_id: int = 0,
    uncond_prompt: str = "", return_latents: bool = False, cache_text: bool = True, video_residual: bool = False,
    video_prediction: str = "velocity", reuse_text_kv: bool = False,
):
    """Generate T future frames per sample; returns decoded uint8 video [B, T+1, H, W, 3] (frame 0 is
    the tokenizer's reconstruction of the observed frame), or (video, latents) with `return_latents`.

    first_frames: uint8 [B, H, W, 3] (cameras tiled along W); actions: normalized, padded
    [B, T, max_action_dim]; states: normalized, padded [B, max_action_dim] or None (no state row);
    prompts: the text exactly as the model sees it (default: empty prompts). `generator`: one
    generator (noise drawn sample after sample) or one per sample. `cache_text`: the text pathway
    runs once per layout instead of once per step (exact; wamkit.model.denoise); with `reuse_text_kv`
    once for every later call with the same prompts (the weights must not change). `video_residual`:
    the model generates frames 1.. as differences from frame 0 (the run's `diffusion.video_residual`);
    they are added back before decoding, and the returned latents are absolute. `video_prediction`:
    what the network outputs (the run's `diffusion.video_prediction`, wamkit.diffusion.flow.as_velocity)."""
    max_action_dim = int(model.config.action_dim)
    b = int(first_frames.shape[0]) if first_frames.ndim == 4 else 0
    prompts = list(prompts) if prompts is not None else [""] * b
    _check(first_frames, actions, states, max_action_dim, prompts, solver)
    lo, hi = (float(x) for x in guidance_interval)
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"guidance_interval is {tuple(guidance_interval)}; use (low, high) with 0 <= low <= high <= 1")
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    gens = _generators(generator if generator is not None else torch.Generator().manual_seed(0), b)
    sigmas = sigma_schedule(num_steps, shift).tolist()
    t = actions.shape[1]

    first_latent = video_tokenizer.encode(first_frames.unsqueeze(1).cpu())  # [B, C, 1, h, w]
    first_latent = first_latent.float().cpu()
    c, _, h, w = first_latent.shape[1:]
    shape = (c, 1 + t // TEMPORAL_FACTOR, h, w)
    x0_frames, videos, rows, clean_rows = [], [], [], []
    for i, gen in enumerate(gens):
        video = torch.randn(shape, generator=gen)
        video[:, 0] = first_latent[i, :, 0]
        x0_frames.append(first_latent[i, :, 0].to(device, non_blocking=True))
        videos.append(video.to(device, non_blocking=True))
        r = actions[i].float().cpu()
        if states is not None:
            r = torch.cat([states[i].float().cpu().unsqueeze(0), r])
        rows.append(r.to(device, non_blocking=True))
        clean_rows.append(list(range(r.shape[0])))

    texts = [text_tokenizer.encode(p) for p in prompts]
    uncond_text = text_tokenizer.encode(uncond_prompt)
    scheduler = _unipc_scheduler(sigmas) if solver == "unipc" else None
    step_sigmas = [float(s) for s in scheduler.sigmas] if scheduler is not None else sigmas

    seqs = [_sequence(texts[i], videos[i], rows[i], clean_rows[i], 1.0, domain_id, fps, dtype, states is not None) for i in range(b)]
    uncond = [_sequence(uncond_text, videos[i], rows[i], clean_rows[i], 1.0, domain_id, fps, dtype, states is not None) for i in range(b)]
    plain = DenoisingForward(model, processor, seqs, cache_text, reuse_text_kv)
    guided = DenoisingForward(model, processor, seqs + uncond, cache_text, reuse_text_kv) if float(guidance) != 1.0 else None
    # One tensor for the whole batch (every sample has one shape), and one solver over it: UniPC's
    # update is elementwise with the same sigmas for every sample, so a step costs the same few kernels
    # for 1 clip or 16, where a per-sample loop launched them once per clip.
    videos_t, x0_t = torch.stack(videos), torch.stack(x0_frames)
    for k, (sigma, sigma_next) in enumerate(zip(step_sigmas[:-1], step_sigmas[1:])):
        use_cfg = guided is not None and lo <= sigma <= hi
        with guided if use_cfg else plain as forward:  # the two layouts take turns on the text K/V cache
            out = forward(list(videos_t.unbind(0)) * (2 if use_cfg else 1), rows * (2 if use_cfg else 1), sigma)
        sample = torch.stack([o[0] for o in out.sample]).float()
        v = guided_velocity(sample, videos_t, sigma, video_prediction, guidance if use_cfg else None)
        if scheduler is None:
            videos_t = videos_t + (sigma_next - sigma) * v
        else:
            videos_t = scheduler.step(v, scheduler.timesteps[k], videos_t, return_dict=False)[0].float()
        videos_t[:, :, 0] = x0_t  # frame 0 is conditioning: elementwise solvers never mix frames

    latents = videos_t
    if video_residual:
        latents = from_video_residual(latents)
    decoded = video_tokenizer.decode(latents)
    return (decoded, latents) if return_latents else decoded


def _sequence(text_ids, video, rows, clean_rows, sigma, domain_id, fps, dtype, has_state) -> SequenceSample:
    return SequenceSample(
        text_ids=text_ids, video=video.to(dtype), actions=rows.to(dtype), clean_video_frames=[0],
        clean_action_rows=clean_rows, sigma=float(sigma), domain_id=int(domain_id), fps=float(fps),
        action_start_frame=0 if has_state else 1,
    )
