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
from wamkit.model.attention import packed_layout
from wamkit.model.packing import SequenceSample, pack_samples
from wamkit.model.tokenizer import TEMPORAL_FACTOR


@torch.no_grad()
def sample_video_chunked(model, processor, video_tokenizer, text_tokenizer, first_frames: torch.Tensor, actions: torch.Tensor,
                         sigmas: list[float], chunk_frames: int, sampler: str, generators: list[torch.Generator],
                         fps: float, prompts: list[str], domain_id: int = 0, video_prediction: str = "velocity") -> torch.Tensor:
    """uint8 video [B, T+1, H, W, 3] (frame 0: the tokenizer's reconstruction of the observed frame).
    first_frames uint8 [B, H, W, 3]; actions normalized, padded [B, T, max_action_dim]; `sigmas` the
    per-chunk ladder from 1 to 0; one generator per sample (initial noise, then consistency re-noise)."""
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    first = video_tokenizer.encode(first_frames.unsqueeze(1).cpu()).float()  # [B, C, 1, h, w]
    c, _, h, w = first.shape[1:]
    num_frames = 1 + actions.shape[1] // TEMPORAL_FACTOR
    ids = chunk_ids(num_frames, chunk_frames)
    videos = [torch.zeros(c, num_frames, h, w, device=device) for _ in range(len(first))]
    for video, latent in zip(videos, first):
        video[:, 0] = latent[:, 0].to(device, non_blocking=True)
    rows = [a.float().to(device, non_blocking=True) for a in actions]
    texts = [text_tokenizer.encode(p) for p in prompts]
    for chunk in range(1, max(ids) + 1):
        frames = chunk_frames_of(ids, chunk)
        x = [torch.randn((c, len(frames), h, w), generator=g).to(device, non_blocking=True) for g in generators]
        for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
            seqs = []
            for text, video, xi, row in zip(texts, videos, x, rows):
                video = video.clone()
                video[:, frames] = xi
                seqs.append(SequenceSample(
                    text_ids=text, video=video.to(dtype), actions=row.to(dtype),
                    clean_video_frames=[f for f in range(num_frames) if f not in frames], clean_action_rows=list(range(len(row))),
                    sigma=float(sigma), domain_id=int(domain_id), fps=float(fps), action_start_frame=1,
                    causal_chunk_frames=chunk_frames))
            batch = pack_samples(seqs, model.config)
            with packed_layout(processor, batch):
                out = model(**batch.forward_kwargs)
            for i, seq in enumerate(seqs):
                v = as_velocity(out.sample[i][0].float(), seq.video.float(), sigma, video_prediction)[:, frames]
                x[i] = chunk_step(sampler, x[i], v, float(sigma), float(sigma_next), generators[i])
        for video, xi in zip(videos, x):
            video[:, frames] = xi
    return video_tokenizer.decode(torch.stack(videos))
