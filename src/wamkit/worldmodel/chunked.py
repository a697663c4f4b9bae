"""Chunk-autoregressive sampling of block-causal world models (stages 1-3 of the sim-bimanual chain).

A run trained with `diffusion.causal_chunk_frames = K` never saw all future frames noisy at once: each
chunk of K latent frames was denoised while the earlier chunks were clean and attention was
block-causal. Sampling it the bidirectional way (`sampling.sample_video`) would ask for a layout it was
never trained on, so it generates chunk after chunk here, each on its own ladder, conditioned on its
own earlier chunks: exactly the SF-DMD rollout of `wamkit.distill` without gradients. The stage-1
teacher takes Euler steps; a distilled student takes consistency steps on its saved few-step ladder
(wamkit.diffusion.chunked). Later chunks sit in the sequence as zeros: block-causal attention hides
them from the chunk being sampled, as in training."""

from __future__ import annotations

import torch

from wamkit.diffusion.chunked import chunk_frames_of, chunk_ids, chunk_step
from wamkit.diffusion.flow import as_velocity
from wamkit.model.denoise import DenoisingForward
from wamkit.model.packing import SequenceSample
from wamkit.model.tokenizer import TEMPORAL_FACTOR


@torch.no_grad()
def sample_video_chunked(model, processor, video_tokenizer, text_tokenizer, first_frames: torch.Tensor, actions: torch.Tensor,
                         sigmas: list[float], chunk_frames: int, sampler: str, generators: list[torch.Generator],
                         fps: float, prompts: list[str], domain_id: int = 0, video_prediction: str = "velocity",
                         cache_text: bool = True, reuse_text_kv: bool = False) -> torch.Tensor:
    """uint8 video [B, T+1, H, W, 3] (frame 0: the tokenizer's reconstruction of the observed frame).
    first_frames uint8 [B, H, W, 3]; actions normalized, padded [B, T, max_action_dim]; `sigmas` the
    per-chunk ladder from 1 to 0; one generator per sample (initial noise, then consistency re-noise).

    Each chunk's layout is packed once for its whole ladder, and the text pathway runs once per chunk
    (`cache_text`), or once for every later chunk and call with the same prompts (`reuse_text_kv`: the
    weights must not change); both are exact (wamkit.model.denoise)."""
    device = next(model.parameters()).device
    first = video_tokenizer.encode(first_frames.unsqueeze(1).cpu()).float()  # [B, C, 1, h, w]
    c, _, h, w = first.shape[1:]
    num_frames = 1 + actions.shape[1] // TEMPORAL_FACTOR
    ids = chunk_ids(num_frames, chunk_frames)
    videos = torch.zeros(len(first), c, num_frames, h, w, device=device)
    videos[:, :, 0] = first[:, :, 0].to(device, non_blocking=True)
    rows = [a.float().to(device, non_blocking=True) for a in actions]
    texts = [text_tokenizer.encode(p) for p in prompts]
    for chunk in range(1, max(ids) + 1):
        frames = chunk_frames_of(ids, chunk)
        at = slice(frames[0], frames[-1] + 1)  # a chunk is one run of frames
        x = torch.stack([torch.randn((c, len(frames), h, w), generator=g) for g in generators]).to(device, non_blocking=True)
        clean = [f for f in range(num_frames) if f not in frames]
        layout = [SequenceSample(text_ids=text, video=videos[i], actions=rows[i], clean_video_frames=clean,
                                 clean_action_rows=list(range(len(rows[i]))), sigma=1.0, domain_id=int(domain_id), fps=float(fps),
                                 action_start_frame=1, causal_chunk_frames=chunk_frames) for i, text in enumerate(texts)]
        with DenoisingForward(model, processor, layout, cache_text=cache_text, reuse_text=reuse_text_kv) as forward:
            for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
                current = videos.clone()
                current[:, :, at] = x
                out = forward(list(current.unbind(0)), rows, float(sigma))
                v = as_velocity(torch.stack([o[0] for o in out.sample]).float(), current, sigma, video_prediction)[:, :, at]
                x = chunk_step(sampler, x, v, float(sigma), float(sigma_next), generators)
        videos[:, :, at] = x
    return video_tokenizer.decode(videos)
