"""The training objective of one step: tokenize, noise, pack, run the network, weigh the losses.

Policy mode (the reference's `wam` mode): the first latent frame and the state row are clean;
future video latents and the action chunk are noisy. Padded action channels carry neither noise
nor loss."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from wamkit.diffusion.flow import add_noise, resolution_shift, sample_sigmas
from wamkit.model.packing import SequenceSample, install_packed_attention, pack_samples, packed_layout


@dataclass
class StepLosses:
    total: torch.Tensor
    video: float
    action: float


class PolicyObjective:
    def __init__(self, model, video_tokenizer, text_tokenizer, diffusion_cfg, prompt_template: str, fps: float, attention: str = "sdpa"):
        self.model = model
        self.video_tokenizer = video_tokenizer
        self.text_tokenizer = text_tokenizer
        self.cfg = diffusion_cfg
        self.prompt_template = prompt_template
        self.fps = fps
        self.processor = install_packed_attention(model, attention)

    def encode_videos(self, videos: list[torch.Tensor]) -> list[torch.Tensor]:
        """Tokenize uint8 clips, batching clips of equal shape into one encoder call."""
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, v in enumerate(videos):
            groups[tuple(v.shape)].append(i)
        latents: list[torch.Tensor | None] = [None] * len(videos)
        with torch.no_grad():
            for indices in groups.values():
                encoded = self.video_tokenizer.encode(torch.stack([videos[i] for i in indices]))
                for j, i in enumerate(indices):
                    latents[i] = encoded[j]
        return latents

    def shift_for(self, video: torch.Tensor) -> float:
        if self.cfg.shift > 0:
            return self.cfg.shift
        return resolution_shift(video.shape[1], video.shape[2], self.cfg.base_shift, self.cfg.base_resolution)

    def __call__(self, samples, generator: torch.Generator) -> StepLosses:
        device = next(self.model.parameters()).device
        latents = self.encode_videos([s.video for s in samples])
        sigmas = sample_sigmas(len(samples), generator, self.shift_for(samples[0].video), self.cfg.logit_mean, self.cfg.logit_std)
        sequence, targets = [], []
        for sample, x0, sigma in zip(samples, latents, sigmas.tolist()):
            seq, target = self._noised_sequence(sample, x0, sigma, generator)
            sequence.append(_to_device(seq, device))
            targets.append({k: v.to(device) for k, v in target.items()})
        batch = pack_samples(sequence, self.model.config)
        with packed_layout(self.processor, batch):
            out = self.model(**batch.forward_kwargs)
        return self._losses(out, targets, batch, [s.action_mask.to(device) for s in samples])

    def _noised_sequence(self, sample, x0: torch.Tensor, sigma: float, generator: torch.Generator):
        video_noise = torch.randn(x0.shape, generator=generator)
        noisy_video, video_target = add_noise(x0, sigma, video_noise)
        noisy_video[:, 0] = x0[:, 0]  # the conditioning frame stays clean
        rows = sample.actions
        clean_rows: list[int] = []
        if sample.state is not None:
            rows = torch.cat([sample.state.unsqueeze(0), rows])
            clean_rows = [0]
        mask = sample.action_mask.to(rows.dtype)
        action_noise = torch.randn(rows.shape, generator=generator) * mask
        noisy_rows, action_target = add_noise(rows, sigma, action_noise)
        noisy_rows[clean_rows] = rows[clean_rows]
        text = self.text_tokenizer.encode(self.prompt_template.format(task=sample.task))
        seq = SequenceSample(
            text_ids=text, video=noisy_video, actions=noisy_rows, clean_video_frames=[0],
            clean_action_rows=clean_rows, sigma=sigma, domain_id=sample.domain_id, fps=self.fps,
            action_start_frame=0 if clean_rows else 1,
        )
        return seq, {"video": video_target, "action": action_target}

    def _losses(self, out, targets, batch, masks) -> StepLosses:
        video_terms, action_terms = [], []
        for i, target in enumerate(targets):
            frames = batch.vision_noisy_frames[i]
            pred = out.sample[i][0][:, frames]
            video_terms.append((pred.float() - target["video"][:, frames]).pow(2).mean())
            rows = batch.action_noisy_rows[i]
            err = (out.action[i][rows].float() - target["action"][rows]).pow(2) * masks[i]
            action_terms.append(err.sum() / (len(rows) * masks[i].sum()).clamp_min(1))
        video = torch.stack(video_terms).mean()
        action = torch.stack(action_terms).mean()
        total = self.cfg.video_loss_weight * video + self.cfg.action_loss_weight * action
        return StepLosses(total=total, video=video.item(), action=action.item())


def _to_device(seq: SequenceSample, device) -> SequenceSample:
    seq.video = seq.video.to(device)
    seq.actions = seq.actions.to(device) if seq.actions is not None else None
    return seq
