"""The training objective of one step: tokenize, noise, pack, run the network, weigh the losses.

Modes (which tokens are clean conditioning and which are noisy targets), per sample:
  policy            (the reference's `wam` mode) first latent frame + state row clean; future video
                    latents and the action chunk noisy.
  forward_dynamics  first latent frame + every action row clean; future video noisy; no action loss.
  inverse_dynamics  every video latent frame + the state row clean; the action chunk noisy; no video loss.
  mixed             one of the three per sample, drawn with the mode weights from that sample's generator.
Clean tokens get no noise, no timestep embedding and no loss. Each loss averages over the samples
that have that modality noisy (0 when none has), over all ranks' samples in mixed mode. Padded action
channels carry neither noise nor loss."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from wamkit.data.augment import draw_shifts, shift_clips
from wamkit.diffusion.flow import add_noise, resolution_shift, sigmas_from_normals, to_video_residual, x0_loss_weight
from wamkit.diffusion.keyed_noise import ACTION_STREAM, VIDEO_STREAM, sample_normals
from wamkit.model.attention import hold_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.flops import encode_flops, generation_weights_train, sequence_flops
from wamkit.model.goal_head import GOAL_HEAD, goal_state_predictions
from wamkit.model.packing import SequenceSample, pack_samples


@dataclass
class StepLosses:
    """Device tensors: a training step reads them back only when it logs (no host sync per micro-batch)."""

    total: torch.Tensor
    video: torch.Tensor  # detached
    action: torch.Tensor  # detached
    goal_state: torch.Tensor | None = None  # detached; None without diffusion.goal_state_loss_weight


SAMPLE_MODES = ("policy", "forward_dynamics", "inverse_dynamics")


class ModeObjective:
    def __init__(
        self, model, video_tokenizer, text_tokenizer, diffusion_cfg, prompt_template: str, fps: float, attention: str = "sdpa",
        mode: str = "policy", mode_weights=None, text_multiple: int = 0, random_shift_px: int = 0,
    ):
        if mode not in (*SAMPLE_MODES, "mixed"):
            raise ValueError(f"unknown mode {mode!r}: use one of {[*SAMPLE_MODES, 'mixed']}")
        self.mode = mode
        if mode_weights is None:
            mode_weights = {"policy": 1.0, "forward_dynamics": 1.0, "inverse_dynamics": 0.0}
        elif not isinstance(mode_weights, dict):  # the schema's ModeWeights dataclass
            mode_weights = {m: float(getattr(mode_weights, m)) for m in SAMPLE_MODES}
        self.mode_weights = torch.tensor([float(mode_weights.get(m, 0.0)) for m in SAMPLE_MODES], dtype=torch.float64)
        if mode == "mixed" and ((self.mode_weights < 0).any() or self.mode_weights.sum() <= 0):
            raise ValueError(f"mode weights {mode_weights} must be >= 0 with a positive sum")
        self.last_modes: list[str] = []  # the modes of the latest call, for logging and tests
        self.last_flops, self.last_tokens = 0.0, 0  # useful work of the latest call (wamkit.model.flops)
        self.last_encode_flops = 0.0  # the video encode's share of the latest call (0 from a latent cache)
        self.timer = None  # a wamkit.train.step_timer.StepTimer: the encode phase ends inside a call
        self.model = model
        self.weight_grads = generation_weights_train(model)  # MFU counts a LoRA run's frozen generation weights at 2x
        self.video_tokenizer = video_tokenizer
        self.text_tokenizer = text_tokenizer
        self.cfg = diffusion_cfg
        self.prompt_template = prompt_template
        self.fps = fps
        self.processor = install_packed_attention(model, attention)
        self.goal_state_loss_weight = float(getattr(diffusion_cfg, "goal_state_loss_weight", 0.0))
        self._record_head_outputs(model)
        self.text_multiple = int(text_multiple)  # pack_samples' filler: a few pack lengths for compiled code
        self.causal_chunk_frames = int(getattr(diffusion_cfg, "causal_chunk_frames", 0) or 0)
        self.video_residual = bool(getattr(diffusion_cfg, "video_residual", False))
        self.video_prediction = str(getattr(diffusion_cfg, "video_prediction", "velocity"))
        self.action_prediction = str(getattr(diffusion_cfg, "action_prediction", "velocity"))
        self.x0_loss_weighting = str(getattr(diffusion_cfg, "x0_loss_weighting", "velocity"))
        self.action_loss = str(getattr(diffusion_cfg, "action_loss", "mse"))
        self.random_shift_px = int(random_shift_px)  # data.random_shift_px: train-time shift of each clip (wamkit.data.augment)
        self.action_sigma = str(getattr(diffusion_cfg, "action_sigma", "shared"))
        self.action_shift = float(getattr(diffusion_cfg, "action_shift", 0.0))

    def encode_videos(self, videos: list[torch.Tensor], shifts: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Tokenize uint8 clips, batching clips of equal shape into one encoder call; with `shifts` [B, 2]
        each clip is first moved by its offset on the model's device (wamkit.data.augment)."""
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, v in enumerate(videos):
            groups[tuple(v.shape)].append(i)
        latents: list[torch.Tensor | None] = [None] * len(videos)
        self.last_encode_flops = 0.0
        device = next(self.model.parameters()).device
        with torch.no_grad():
            for indices in groups.values():
                clips = stacked_clips([videos[i] for i in indices], device)
                if shifts is not None:
                    clips = shift_clips(clips.to(device, non_blocking=True), shifts[indices])
                self.last_encode_flops += encode_flops(self.video_tokenizer, tuple(clips.shape))
                encoded = self.video_tokenizer.encode(clips)
                for j, i in enumerate(indices):
                    latents[i] = encoded[j]
        return latents

    def shift_for(self, sample) -> float:
        if self.cfg.shift > 0:
            return self.cfg.shift
        height, width = self.frame_size(sample)
        return resolution_shift(height, width, self.cfg.base_shift, self.cfg.base_resolution)

    def frame_size(self, sample) -> tuple[int, int]:
        if sample.video is not None:
            return sample.video.shape[1], sample.video.shape[2]
        factor = self.video_tokenizer.spatial_factor  # cached latents: the canvas they were encoded from
        return sample.latents.shape[-2] * factor, sample.latents.shape[-1] * factor

    def latents_of(self, samples, generators: list[torch.Generator] | None = None) -> list[torch.Tensor]:
        """Cached latents where the samples carry them, else tokenize the videos now (shifted first by
        `data.random_shift_px` when the samples' generators are given: training steps, not probes); as
        residuals from latent frame 0 with `diffusion.video_residual`."""
        if all(s.latents is not None for s in samples):
            latents = [s.latents for s in samples]
            self.last_encode_flops = 0.0
        else:
            shifts = draw_shifts(self.random_shift_px, generators) if generators is not None and self.random_shift_px > 0 else None
            latents = self.encode_videos([s.video for s in samples], shifts)
        return [to_video_residual(x) for x in latents] if self.video_residual else latents

    def sample_mode(self, generator: torch.Generator) -> str:
        """A fixed mode draws nothing (the generator stream stays the policy-only one); mixed draws
        one mode from the sample's own generator, so a resumed run draws the same modes."""
        if self.mode != "mixed":
            return self.mode
        return SAMPLE_MODES[int(torch.multinomial(self.mode_weights, 1, generator=generator))]

    def __call__(self, samples, generators: list[torch.Generator]) -> StepLosses:
        """One generator per sample, keyed by the sample's global position in the data stream, so
        the noise a sample gets does not depend on how samples are split across ranks."""
        if len(generators) != len(samples):
            raise ValueError(f"{len(samples)} samples but {len(generators)} generators")
        device = next(self.model.parameters()).device
        latents = [x.to(device, non_blocking=True) for x in self.latents_of(samples, generators)]  # cached latents come from the host
        if self.timer is not None:
            self.timer.mark("encode")
        shift = self.shift_for(samples[0])
        if self._uniform(samples, latents):
            return self._uniform_step(samples, latents, generators, shift, device)
        sequence, targets = [], []
        self.last_modes = []
        for sample, x0, generator in zip(samples, latents, generators):
            mode = self.sample_mode(generator)
            self.last_modes.append(mode)
            (sigma,), (action_sigma,) = self._noise_levels([generator], shift)
            seq, target = self._noised_sequence(sample, x0, sigma, generator, mode, action_sigma)
            sequence.append(seq)
            targets.append(target)
        self.last_flops, self.last_tokens = sequence_flops(self.model.config, sequence, self.weight_grads)  # MFU, tokens/s
        batch = pack_samples(sequence, self.model.config, text_multiple=self.text_multiple)
        hold_layout(self.processor, batch)  # kept through backward: activation checkpointing recomputes the layers
        out = self.model(**batch.forward_kwargs)
        return self._losses(out, targets, batch, [s.action_mask.to(device, non_blocking=True) for s in samples])

    def _uniform(self, samples, latents) -> bool:
        """One fixed mode, bidirectional, and every sample of one shape: the step can run on stacked
        tensors (a few kernels a step instead of ~100 a sample, which bound small models by the host)."""
        if self.mode == "mixed" or self.causal_chunk_frames > 0:
            return False
        first = samples[0]
        key = lambda s, x: (tuple(x.shape), tuple(s.actions.shape), s.state is None, s.domain_id)  # noqa: E731
        return all(key(s, x) == key(first, latents[0]) for s, x in zip(samples, latents))

    def _uniform_step(self, samples, latents, generators, shift: float, device) -> StepLosses:
        """The per-sample step of __call__ on stacked tensors: the same noise levels and noise (each
        sample still draws from its own generator, in the same order), one pack merged into one
        vision and one action item (pack_samples' `merge`), the losses as one batched expression."""
        mode = self.mode
        self.last_modes = [mode] * len(samples)
        sigmas, action_sigmas = self._noise_levels(generators, shift)
        x0 = torch.stack(latents)  # [B, C, T, h, w]
        rows = _stacked_rows(samples).to(device, non_blocking=True)  # [B, L, D]: state row first when there is one
        video_noise = sample_normals(generators, tuple(x0.shape[1:]), VIDEO_STREAM, device)
        action_noise = sample_normals(generators, tuple(rows.shape[1:]), ACTION_STREAM, device)
        masks = torch.stack([s.action_mask for s in samples]).to(device=device, dtype=rows.dtype, non_blocking=True)  # [B, D]
        sigma = torch.tensor(sigmas, dtype=torch.float32).to(device, non_blocking=True)
        action_sigma = sigma if action_sigmas == sigmas else torch.tensor(action_sigmas, dtype=torch.float32).to(device, non_blocking=True)
        noisy_video, video_velocity = add_noise(x0, sigma.view(-1, 1, 1, 1, 1), video_noise)
        noisy_rows, action_velocity = add_noise(rows, action_sigma.view(-1, 1, 1), action_noise * masks[:, None])
        has_state = samples[0].state is not None
        clean_frames = list(range(x0.shape[2])) if mode == "inverse_dynamics" else [0]
        clean_rows = list(range(rows.shape[1])) if mode == "forward_dynamics" else ([0] if has_state else [])
        at = index_of(clean_frames, device)
        noisy_video[:, :, at] = x0[:, :, at]
        at = index_of(clean_rows, device)
        noisy_rows[:, at] = rows[:, at]
        sequence = [
            SequenceSample(
                text_ids=self.text_tokenizer.encode(self.prompt_template.format(task=sample.task)), video=noisy_video[b],
                actions=noisy_rows[b], clean_video_frames=clean_frames, clean_action_rows=clean_rows, sigma=sigmas[b],
                domain_id=sample.domain_id, fps=self.fps, action_start_frame=0 if has_state else 1, action_sigma=action_sigmas[b],
            )
            for b, sample in enumerate(samples)
        ]
        self.last_flops, self.last_tokens = sequence_flops(self.model.config, sequence, self.weight_grads)
        batch = pack_samples(sequence, self.model.config, text_multiple=self.text_multiple, merge=True)
        hold_layout(self.processor, batch)
        out = self.model(**batch.forward_kwargs)
        targets = {
            "video": self._batched_target(self.video_prediction, x0, video_velocity, sigmas, device),
            "action": self._batched_target(self.action_prediction, rows, action_velocity, action_sigmas, device),
        }
        losses = self._batched_losses(out, batch, targets, masks)
        if not self.goal_state_loss_weight:
            return losses
        noisy = bool(batch.action_noisy_rows[0])
        goal = self._goal_state_loss(batch, [s.goal_state for s in samples] if noisy else [],
                                     [s.state_mask for s in samples] if noisy else [])
        return StepLosses(total=losses.total + self.goal_state_loss_weight * goal, video=losses.video, action=losses.action,
                          goal_state=goal.detach())

    def _batched_target(self, prediction: str, clean: torch.Tensor, velocity: torch.Tensor, sigmas: list[float], device):
        """(target, per-sample loss weights [B]) of one output for stacked samples (see _target)."""
        if prediction != "x0":
            return velocity, torch.ones(len(sigmas), device=device)
        weights = torch.tensor([x0_loss_weight(s, self.x0_loss_weighting) for s in sigmas], dtype=torch.float32)
        return clean, weights.to(device, non_blocking=True)

    def _batched_losses(self, out, batch, targets: dict, masks: torch.Tensor) -> StepLosses:
        """_losses for a merged pack of one layout: every sample's mean squared error at once."""
        frames, rows = batch.vision_noisy_frames[0], batch.action_noisy_rows[0]
        if frames:
            target, weights = targets["video"]
            at = index_of(frames, target.device)
            err = (batch.video_outputs(out)[:, :, at].float() - target[:, :, at]).pow(2)
            video = (err.mean(dim=(1, 2, 3, 4)) * weights).mean()
        else:
            video = self._head_anchor("proj_out")
        if rows:
            target, weights = targets["action"]
            at = index_of(rows, target.device)
            err = self._action_error(batch.action_outputs(out)[:, at].float() - target[:, at]) * masks[:, None]
            action = (err.sum(dim=(1, 2)) / (len(rows) * masks.sum(dim=1)).clamp_min(1) * weights).mean()
        else:
            action = self._head_anchor("action_proj_out")
        total = self.cfg.video_loss_weight * video + self.cfg.action_loss_weight * action
        return StepLosses(total=total, video=video.detach(), action=action.detach())

    def _noise_levels(self, generators: list[torch.Generator], shift: float) -> tuple[list[float], list[float]]:
        """Each sample's noise level and its action chunk's: one normal from the sample's generator, then
        with action_sigma = "independent" the action chunk's own (shared runs draw nothing more, so their
        random stream is the one they always had), transformed for the whole batch at once (a few host ops
        a step instead of ~8 a sample; elementwise, so each value is what a lone draw gives)."""
        independent = self.action_sigma == "independent"
        normals, action_normals = [], []
        for generator in generators:
            normals.append(torch.randn(1, generator=generator))
            if independent:
                action_normals.append(torch.randn(1, generator=generator))
        mean, std = self.cfg.logit_mean, self.cfg.logit_std
        sigmas = sigmas_from_normals(torch.cat(normals), shift, mean, std).tolist()
        if not independent:
            return sigmas, sigmas
        action_shift = self.action_shift if self.action_shift > 0 else shift
        return sigmas, sigmas_from_normals(torch.cat(action_normals), action_shift, mean, std).tolist()

    def _noised_sequence(self, sample, x0: torch.Tensor, sigma: float, generator: torch.Generator, mode: str = "policy",
                         action_sigma: float | None = None):
        # Noise is drawn for every token whatever the mode, so a sample consumes the same random
        # numbers in every mode; clean positions are then overwritten with their clean values.
        action_sigma = sigma if action_sigma is None else action_sigma
        device = x0.device
        video_noise = sample_normals([generator], tuple(x0.shape), VIDEO_STREAM, device)[0]
        noisy_video, video_velocity = add_noise(x0, sigma, video_noise)
        video_target, video_weight = self._target(self.video_prediction, x0, video_velocity, sigma)
        clean_frames = list(range(x0.shape[1])) if mode == "inverse_dynamics" else [0]
        at = index_of(clean_frames, device)
        noisy_video[:, at] = x0[:, at]
        rows = sample.actions.to(device, non_blocking=True)
        has_state = sample.state is not None
        if has_state:
            rows = torch.cat([sample.state.to(device, non_blocking=True).unsqueeze(0), rows])
        mask = sample.action_mask.to(device=device, dtype=rows.dtype, non_blocking=True)
        action_noise = sample_normals([generator], tuple(rows.shape), ACTION_STREAM, device)[0] * mask
        noisy_rows, action_velocity = add_noise(rows, action_sigma, action_noise)
        action_target, action_weight = self._target(self.action_prediction, rows, action_velocity, action_sigma)
        clean_rows = list(range(rows.shape[0])) if mode == "forward_dynamics" else ([0] if has_state else [])
        at = index_of(clean_rows, device)
        noisy_rows[at] = rows[at]
        if self.causal_chunk_frames > 0 and mode != "inverse_dynamics":
            # Teacher forcing: one target chunk (drawn after all noise, so bidirectional runs keep their
            # random stream) is noisy; every other chunk holds clean ground truth. Block-causal masks keep
            # later chunks from leaking into it, so its context is exactly the clean earlier chunks.
            k = self.causal_chunk_frames
            chunk_of = [0] + [1 + (f - 1) // k for f in range(1, x0.shape[1])]
            target = int(torch.randint(1, max(chunk_of) + 1, (1,), generator=generator)) if max(chunk_of) > 0 else 0
            clean_frames = [f for f in range(x0.shape[1]) if chunk_of[f] != target]
            noisy = index_of([f for f in range(x0.shape[1]) if chunk_of[f] == target], device)  # one run of frames
            kept = noisy_video[:, noisy]
            noisy_video = x0.clone()
            noisy_video[:, noisy] = kept
        text = self.text_tokenizer.encode(self.prompt_template.format(task=sample.task))
        seq = SequenceSample(
            text_ids=text, video=noisy_video, actions=noisy_rows, clean_video_frames=clean_frames,
            clean_action_rows=clean_rows, sigma=sigma, domain_id=sample.domain_id, fps=self.fps,
            action_start_frame=0 if has_state else 1, causal_chunk_frames=self.causal_chunk_frames, action_sigma=action_sigma,
        )
        return seq, {"video": video_target, "action": action_target, "video_weight": video_weight, "action_weight": action_weight,
                     "goal_state": sample.goal_state, "state_mask": sample.state_mask}

    def _target(self, prediction: str, clean: torch.Tensor, velocity: torch.Tensor, sigma: float):
        """(target, loss weight) of one output: the velocity with weight 1, or for an x0 prediction
        the clean values with the weight of `diffusion.x0_loss_weighting` (x0_loss_weight)."""
        if prediction == "x0":
            return clean, x0_loss_weight(sigma, self.x0_loss_weighting)
        return velocity, 1.0

    def _losses(self, out, targets, batch, masks) -> StepLosses:
        video_terms, action_terms = [], []
        for i, target in enumerate(targets):
            frames = batch.vision_noisy_frames[i]
            if frames:  # samples without noisy video (inverse dynamics) stay out of the video mean
                at = index_of(frames, target["video"].device)
                pred = out.sample[i][0][:, at]
                video_terms.append((pred.float() - target["video"][:, at]).pow(2).mean() * target["video_weight"])
            rows = batch.action_noisy_rows[i]
            if rows:  # samples without noisy actions (forward dynamics) stay out of the action mean
                at = index_of(rows, target["action"].device)
                err = self._action_error(out.action[i][at].float() - target["action"][at]) * masks[i]
                action_terms.append(err.sum() / (len(rows) * masks[i].sum()).clamp_min(1) * target["action_weight"])
        counts = self._world_counts(len(video_terms), len(action_terms), out.sample[0][0].device)
        # A modality no sample of this step predicts gets a loss of exactly 0 through its output head run on
        # no tokens, so the head still has a (zero) gradient: under FSDP2 a rank whose samples leave a head
        # unused would reduce fewer gradients than the others, and the collectives disagree (gloo aborts).
        video = self._mean(video_terms, counts, 1) if video_terms else self._head_anchor("proj_out")
        action = self._mean(action_terms, counts, 2) if action_terms else self._head_anchor("action_proj_out")
        total = self.cfg.video_loss_weight * video + self.cfg.action_loss_weight * action
        if not self.goal_state_loss_weight:
            return StepLosses(total=total, video=video.detach(), action=action.detach())
        with_rows = [i for i, rows in enumerate(batch.action_noisy_rows) if rows]
        goal = self._goal_state_loss(batch, [targets[i]["goal_state"] for i in with_rows],
                                     [targets[i]["state_mask"] for i in with_rows], counts)
        return StepLosses(total=total + self.goal_state_loss_weight * goal, video=video.detach(), action=action.detach(),
                          goal_state=goal.detach())

    def _goal_state_loss(self, batch, goals: list, masks: list, counts: tuple[int, int, int] | None = None) -> torch.Tensor:
        """The goal head's error (`diffusion.goal_state_loss_weight`, wamkit.model.goal_head): each sample with noisy
        action rows predicts its episode's last state from those rows, scored with the action loss's error over the
        state's channels; `goals` / `masks` are those samples' targets, in order. 0 with a zero gradient for the
        head when no sample has noisy rows (forward dynamics), as _head_anchor."""
        if not goals:
            return self._head_anchor(GOAL_HEAD)
        if any(g is None for g in goals):
            raise ValueError("diffusion.goal_state_loss_weight needs every sample's goal_state: train with data.use_state "
                             "on a dataset whose windows carry their episode's last state")
        rows = self._head_outputs[GOAL_HEAD]
        noisy = [len(r) for r in batch.action_noisy_rows]
        predicted = goal_state_predictions(rows, noisy, batch.num_samples if batch.merged else 0).float()
        device = predicted.device
        target = torch.stack(goals).to(device, non_blocking=True)
        mask = torch.stack(masks).to(device=device, dtype=target.dtype, non_blocking=True)
        per_sample = (self._action_error(predicted - target) * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)
        return self._mean(list(per_sample), counts, 2)

    def _action_error(self, diff: torch.Tensor) -> torch.Tensor:
        """Each action value's error (`diffusion.action_loss`): squared, or absolute as ACT trains."""
        return diff.abs() if self.action_loss == "l1" else diff.pow(2)

    @staticmethod
    def _mean(terms: list[torch.Tensor], counts: tuple[int, int, int] | None, which: int) -> torch.Tensor:
        """The mean of this rank's terms, or with `counts` (world, n_video, n_action) its share of the mean
        over every rank's terms (mixed mode under FSDP, see _world_counts)."""
        if counts is None:
            return torch.stack(terms).mean()
        return torch.stack(terms).sum() * (counts[0] / max(counts[which], 1))

    def _head_anchor(self, name: str) -> torch.Tensor:
        """0, with a zero gradient for every parameter of head `name`: the head's output of this forward
        (rows of noisy tokens only, none here) times 0, recorded by _record_head_outputs."""
        return self._head_outputs[name].float().sum() * 0.0

    def _record_head_outputs(self, model) -> None:
        """Keep the latest output of each output head (inside the forward: under FSDP2 the heads'
        weights exist whole only there)."""
        self._head_outputs: dict[str, torch.Tensor] = {}
        for name in ("proj_out", "action_proj_out"):
            head = getattr(model, name, None)
            if head is not None:
                head.register_forward_hook(lambda module, args, out, name=name: self._head_outputs.__setitem__(name, out))
        if self.goal_state_loss_weight:  # the goal head reads what action_proj_out reads: the noisy rows' hidden states
            goal_head = getattr(model, GOAL_HEAD, None)
            if goal_head is None:
                raise ValueError(f"diffusion.goal_state_loss_weight is {self.goal_state_loss_weight} but the model has no "
                                 f"{GOAL_HEAD}: build it with wamkit.train.setup.build_model from the same config")
            model.action_proj_out.register_forward_hook(
                lambda module, args, out: self._head_outputs.__setitem__(GOAL_HEAD, goal_head(args[0])))

    def _world_counts(self, n_video: int, n_action: int, device) -> tuple[int, int, int] | None:
        """In mixed mode ranks hold different mixes (one rank's samples may all be inverse dynamics), and
        FSDP averages the ranks' gradients: a mean per rank would weigh a sample by 1 / (its rank's count).
        So each rank's loss is its sum x world / (the count over all ranks), whose average over ranks is
        the one-process mean. (world, video count, action count) summed over the default group, or None
        in one process, for fixed modes (every rank's counts are its batch size) and unsharded models
        (a bundle's one-sample check runs on one rank)."""
        import torch.distributed as dist

        if self.mode != "mixed" or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return None
        if getattr(self, "_sharded", None) is None:  # FSDP2 parameters are DTensors (frozen ones may be replicated)
            self._sharded = any(hasattr(p, "device_mesh") for p in self.model.parameters())
        if not self._sharded:  # nothing averages gradients across ranks
            return None
        counts = torch.tensor([float(n_video), float(n_action)], dtype=torch.float64, device=device)
        dist.all_reduce(counts)  # context-parallel ranks count their (shared) samples k times, and world holds k x dp
        return dist.get_world_size(), int(counts[0].item()), int(counts[1].item())


def _stacked_rows(samples) -> torch.Tensor:
    """[B, L, D] action rows of same-shaped samples on the host, each sample's state row first when it has one."""
    actions = torch.stack([s.actions for s in samples])
    if samples[0].state is None:
        return actions
    return torch.cat([torch.stack([s.state for s in samples]).unsqueeze(1).to(actions.dtype), actions], dim=1)


def index_of(positions: list[int], device: torch.device) -> slice | torch.Tensor:
    """`positions` (ascending) as an index that costs the device no synchronisation. Indexing a CUDA
    tensor with a Python list copies the list to the GPU with a blocking copy, which waits for every
    kernel queued before it: several times per sample, that kept the host from running ahead of the
    GPU. One run of consecutive positions (every mode's clean and noisy sets are) becomes a slice;
    anything else an index tensor copied without blocking."""
    if not positions:
        return slice(0, 0)
    first = positions[0]
    if positions == list(range(first, first + len(positions))):
        return slice(first, first + len(positions))
    return torch.tensor(positions, dtype=torch.long).to(device, non_blocking=True)


def stacked_clips(clips: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The clips as one [B, ...] host tensor for the encoder. For a GPU it is stacked into page-locked memory
    from torch's caching host allocator, whose blocks stay mapped from step to step (a fresh 53 MB batch of
    MT10 clips page-faults: 19 ms to stack against 4 ms into mapped memory on the dev box) and whose copy to
    the GPU runs asynchronously (a pageable copy holds the host: 6.9 ms a step on an H100, 2026-12-05).
    The allocator reuses a block only once the copy that read it is done."""
    if device.type != "cuda":
        return torch.stack(clips)
    out = torch.empty((len(clips), *clips[0].shape), dtype=clips[0].dtype, pin_memory=True)
    return torch.stack(clips, out=out)


# The original name: a ModeObjective in its default policy mode.
PolicyObjective = ModeObjective
