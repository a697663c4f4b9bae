"""DistillTrainer: stage 2 (TF-dCM) and stage 3 (SF-DMD) of the sim-bimanual chain.

Both reuse the Trainer's building blocks (build_run_data / build_model / load_base_weights, AdamW
groups, LambdaLR, EMA, atomic DCP checkpoints, MetricsLogger, the step-derived data order) and its
resume-by-run-name contract: a run with a `latest` checkpoint restores student (+ critic) weights, both
optimizers and schedulers, EMA, counters, RNG and data position. Frozen models (teacher / reference)
are loaded from their paths at every start and never saved.

Notation: rectified flow x_s = s*eps + (1-s)*x0, network v(x, s) ~ eps - x0, so the x0 prediction
("consistency function") is f(x, s) = x - s * v(x, s). Every model works on the forward-dynamics
layout: latent frame 0 and every action row clean; chunks of `diffusion.causal_chunk_frames` latent
frames; block-causal attention for the student/teacher, bidirectional for the stage-0 reference/critic.

TF-dCM (stage 2, discrete consistency distillation with teacher forcing), per sample:
    fine grid s_0 = 1 > s_1 > ... > s_M = 0  (sigma_schedule(teacher_steps, shift)); n ~ U{0..M-1};
    target chunk k ~ U{1..C}; every other chunk clean ground truth (teacher forcing, block-causal).
    x_n   = s_n eps + (1 - s_n) x0                              on chunk k
    x^    = x_n + (s_{n+1} - s_n) v_teacher(x_n, s_n)            one Euler ODE step of the FROZEN teacher
    y     = x^  if s_{n+1} = 0  else  f_ema(x^, s_{n+1})        the student's EMA at the next sigma (no grad)
    loss  = mean over chunk-k latents of (f_student(x_n, s_n) - y)^2
TF-dCM student sampling (student_steps = 4): x = eps; for i: x0^ = f(x, s_i); x = s_{i+1} eps_i + (1 - s_{i+1}) x0^.

SF-DMD (stage 3, self-forcing distribution matching distillation):
    rollout: chunk by chunk the student samples its chunk with its 4-step ladder, conditioned on its OWN
      earlier chunks (clean, detached) -> x_gen; the chunk's last step is a random exit step j ~ U{0..3}
      (steps before j without grad, step j with grad, as in Self Forcing).
    critic iterations (critic_updates_per_student = 5 of every 6): flow-matching loss of the critic
      (fake score, init stage 0, bidirectional) on the detached rollout: s ~ logit-normal(shift),
      || v_fake(s eps + (1-s) x_gen, s) - (eps - x_gen) ||^2 over the generated frames.
    student iterations (every 6th): s, eps as above; x_s = s eps + (1-s) x_gen;
      g = (f_fake(x_s, s) - f_real(x_s, s)) / mean|x_gen - f_real(x_s, s)|   (both no grad; f_real from
      the FROZEN stage-0 reference). In x0 form this is the DMD score difference: s_fake - s_real =
      (1-s)/s^2 (f_fake - f_real). loss = 0.5 * || x_gen - stopgrad(x_gen - g) ||^2 (mean), whose
      gradient w.r.t. x_gen is g: it moves the student's samples towards the real score and away from
      the fake one."""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from wamkit.config import config_to_dict, format_config
from wamkit.config.env import resolved
from wamkit.diffusion.chunked import chunk_ids
from wamkit.diffusion.flow import sample_sigmas
from wamkit.diffusion.sampling import sigma_schedule
from wamkit.distill.config import DistillConfig, distill_to_dict
from wamkit.errors import CheckpointError, ConfigError
from wamkit.model.attention import packed_layout
from wamkit.model.attention_backends import attention_backend, install_packed_attention
from wamkit.model.packing import SequenceSample, pack_samples
from wamkit.storage import is_remote
from wamkit.train import checkpoint as ckpt
from wamkit.train import memory
from wamkit.train.ema import EMA
from wamkit.train.metrics import MetricsLogger
from wamkit.train.optim import build_optimizer, clip_gradients
from wamkit.train.recovery import resume_point
from wamkit.train.parallel import all_reduce_mean, init_distributed, parallel_dims, parallelize, run_mesh
from wamkit.train.base_identity import require_full_weights
from wamkit.config.schedule import build_schedule
from wamkit.model.materialize import materialize
from wamkit.train.datasets import build_run_data
from wamkit.train.setup import (build_model, build_tokenizers, builds_on_meta, check_placement, check_vocab, load_base_weights,
                                materialize_run_model)
from wamkit.train.stream import SampleOrder, batch_stream
from wamkit.train.trainer import RESUMABLE_KNOBS, sample_generator

DISTILL_CONFIG = "distill_config.json"
EXIT_STEP_OFFSET = 1 << 41  # stream positions of the shared exit-step draws: apart from every sample's and validation's


def frozen_source(dcfg, what: str) -> Path:
    """A teacher / reference / critic path (`distill.<what>_path`): a completed wamkit iteration directory."""
    where = Path(resolved(dcfg, f"{what}_path")).expanduser()
    if not (where / ckpt.COMPLETE_MARKER).is_file():
        raise ConfigError(f"distill.{what}_path", f"{where} is not a completed wamkit iteration directory", "point at runs/<name>/checkpoints/iter_<N>")
    require_full_weights(where, ckpt.read_marker(where), what)
    return where


def load_model_weights(model, where: Path, verify: str = "hash") -> None:
    """An iteration directory's regular weights ("model") into `model`, plain or sharded (DCP reads
    only each rank's shards), its files checked first (checkpoint.verify)."""
    ckpt.load_checkpoint(where, {"model": model.state_dict()}, verify)


class DistillTrainer:
    """One process, or N under torchrun: every model (student, its EMA, teacher / reference, critic) is
    sharded with the Trainer's FSDP2 `parallelize`, each rank takes its slice of the global batch, and
    everything random that decides how many forwards a step runs is drawn identically on every rank,
    so N processes reproduce one process with the same global batch."""

    def __init__(self, cfg, dcfg: DistillConfig, device: str = "auto"):
        self.cfg, self.dcfg = cfg, dcfg
        self.ctx = init_distributed(device)
        self.device = self.ctx.device
        self.run_dir = cfg.job.run_dir()
        if is_remote(self.run_dir):
            raise ConfigError("job.output_root", f"is an object-store URL ({self.run_dir}); distillation writes its run to a "
                              "local or shared filesystem only (object storage is supported by `wamkit train`)",
                              "use a shared-filesystem path for the distillation stages; checkpoint.load_path may still "
                              "name a wamkit checkpoint in the bucket")
        self.checkpoints_dir = self.run_dir / "checkpoints"
        torch.manual_seed(cfg.job.seed)
        self.data = build_run_data(cfg)
        self.video_tokenizer, self.text_tokenizer = build_tokenizers(cfg, self.device)
        self.channels = self.video_tokenizer.latent_channels
        if cfg.parallel.activation_checkpointing == "full":
            raise ConfigError("parallel.activation_checkpointing", "is 'full'; a distillation step runs several forwards of a "
                              "model before one backward, and full recomputation would replay attention with the last "
                              "forward's sample layout", "use 'selective' (recomputes only the MLPs) or 'none' for `wamkit distill`")
        if parallel_dims(cfg, self.ctx.world_size).cp > 1:
            raise ConfigError("parallel.context_parallel_degree", f"is {cfg.parallel.context_parallel_degree}; the distillation "
                              "stages (2, 3) have no context-parallel path yet", "set it to 1 for `wamkit distill`")
        self.mesh = run_mesh(self.ctx, parallel_dims(cfg, self.ctx.world_size))
        # On a GPU every model is built on the meta device and materialised shard by shard there, its
        # weights read into the shards (wamkit.model.materialize): no host copy of any of them.
        self.on_meta = builds_on_meta(cfg, self.device)
        self.latest = resume_point(self.checkpoints_dir, cfg.checkpoint, self.ctx)  # verified (wamkit.train.recovery)
        if self.latest is None and not cfg.checkpoint.load_path:
            raise ConfigError("checkpoint.load_path", "is empty for a distillation stage", "point it at the previous stage's completed iteration dir (the student's initial weights)")
        self.chunk_frames = cfg.diffusion.causal_chunk_frames
        self.fps = float(self.data.dataset.fps)
        self.procs, self.models = {}, {}  # per role: its packed-attention processor, its model
        # The run's model.attention; resolved as for fp32, so `auto` never picks flex (the block-causal
        # flex path is not tested for distillation).
        self.attention = attention_backend(cfg.model.attention, self.device, torch.float32)
        self.gate_estimate = self._check_memory()  # before any model is on the GPU
        self.student = self._place("student", self._load_student)
        self.optimizer = build_optimizer(self.student, cfg.optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, build_schedule(cfg.scheduler, cfg.trainer.max_iter))
        self.ema = EMA(self.student, cfg.ema.beta, cfg.ema.warmup)
        # Same build and sharding as the student, so the EMA (sharded like the student) copies in place.
        self.ema_model = self._place("ema", None, frozen=True)
        self.critic = self.critic_optimizer = self.critic_scheduler = None
        if dcfg.method == "tf_dcm":
            self.teacher = self._place("teacher", self._from(dcfg, "teacher"), frozen=True)
        else:
            self.reference = self._place("reference", self._from(dcfg, "reference"), frozen=True)
            self.critic = self._place("critic", self._from(dcfg, "critic"))
            critic_opt_cfg = copy.copy(cfg.optimizer)
            if dcfg.critic_lr > 0:
                critic_opt_cfg.lr = dcfg.critic_lr
            self.critic_optimizer = build_optimizer(self.critic, critic_opt_cfg)
            self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(self.critic_optimizer, build_schedule(cfg.scheduler, cfg.trainer.max_iter))
        self.student_sigmas = sigma_schedule(dcfg.student_steps, dcfg.student_shift).tolist()
        self.order = SampleOrder(len(self.data.train_windows), cfg.job.seed)
        self.step = self.consumed = self.student_updates = self.critic_updates = 0

    def _check_memory(self) -> float | None:
        """On a GPU: the distillation's estimate (every model its method holds, memory.distill_total)
        against the memory this process can use, logged; a run that cannot fit is refused with the
        smallest GPU count that fits. None on the CPU, or when a sample's token count is unknown."""
        from wamkit.train.parallel import all_reduce_min

        if self.device.type != "cuda" or self.cfg.parallel.activation_checkpointing not in memory.CHECKPOINTING_BY_SPEED:
            return None
        model = build_model(self.cfg, self.channels, "meta")  # counts only
        sample = memory.run_token_counts(self.cfg, model.config, self.data, self.text_tokenizer)
        if sample is None:
            return None
        counts, vae, method = memory.model_counts(model, self.cfg.lora.enabled), memory.vae_parameter_count(self.cfg), self.dcfg.method
        usable = all_reduce_min(memory.usable_bytes(self.device)[0], self.ctx)
        est = memory.distill_total(counts, self.cfg, self.ctx.world_size, sample, vae, method)
        if self.ctx.is_main:
            print(f"[wamkit] memory estimate {est['total'] / memory.GIB:.1f} GiB per GPU of {usable / memory.GIB:.1f} GiB usable "
                  f"(distillation, {method}): {memory.format_estimate(est)}", flush=True)
        if est["total"] > usable:
            smallest = memory.smallest_distill_world(counts, self.cfg, sample, vae, method, usable)
            raise memory.GPUMemoryError(
                f"{self.cfg.job.name}: memory", f"the distillation ({method}) needs an estimated {est['total'] / memory.GIB:.1f} GiB per "
                f"GPU on {self.ctx.world_size} GPU(s), {usable / memory.GIB:.1f} GiB is usable",
                f"run it on {smallest} GPUs (torchrun --nproc-per-node={smallest}, or nodes that add up to it)" if smallest else
                f"no GPU count up to {memory.WORLD_SIZES[-1]} fits: fewer trainer.samples_per_step or a shorter data.chunk_length")
        return est["total"]

    @property
    def global_batch(self) -> int:
        """Samples per step over all ranks (trainer.samples_per_step is per rank)."""
        return self.cfg.trainer.samples_per_step * self.ctx.world_size

    def _from(self, dcfg, what: str):
        """The loader of a frozen or critic model's weights (checked before anything is built)."""
        where = frozen_source(dcfg, what)
        return lambda model: load_model_weights(model, where, self.cfg.checkpoint.verify)

    def _load_student(self, model) -> None:
        """A fresh run's eagerly built student starts from checkpoint.load_path; a resume loads its own
        checkpoint later."""
        if self.latest is None:
            load_base_weights(model, self.cfg)

    def _fill(self, role: str, model, load) -> None:
        """Values for a meta-built model on the device: the student as `wamkit train` fills a fresh or
        resumed run (materialised once, base weights read into its shards); the others random values
        (their buffers), then `load`."""
        if role == "student":
            materialize_run_model(model, self.cfg, self.device, load_base=self.latest is None)
            return
        materialize(model, self.device, self.cfg.job.seed)
        if load is not None:
            load(model)

    def _place(self, role: str, load, frozen: bool = False):
        """Build one model, fill it (`load(model)`, or random values for None) and place it on the
        device through the Trainer's `parallelize` (activation checkpointing, compile, FSDP2 under
        torchrun), with this run's attention processor. Frozen models keep the trainable flags of their
        build while being sharded, so they shard exactly like the student."""
        if self.on_meta:
            model = parallelize(build_model(self.cfg, self.channels, "meta"), self.mesh, self.cfg)
            self._fill(role, model, load)
        else:
            model = build_model(self.cfg, self.channels, "cpu")
            if load is not None:
                load(model)
            model = parallelize(model.to(self.device), self.mesh, self.cfg)
        if role == "student":
            check_vocab(model, self.text_tokenizer)
        check_placement(self.device, model, self.video_tokenizer)
        if frozen:
            model.eval().requires_grad_(False)
        self.procs[role] = install_packed_attention(model, self.attention)
        self.models[role] = model
        return model

    # ---- state -------------------------------------------------------------------------------
    def state(self) -> dict:
        self.optimizer.zero_grad(set_to_none=True)
        state = {
            "model": self.student.state_dict(),
            "optimizer": get_optimizer_state_dict(self.student, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict(),
            "trainer": {"step": self.step, "consumed_samples": self.consumed, "student_updates": self.student_updates,
                        "critic_updates": self.critic_updates},
            "rng": {"torch": torch.get_rng_state()},
        }
        if self.critic is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)
            state["critic"] = self.critic.state_dict()
            state["critic_optimizer"] = get_optimizer_state_dict(self.critic, self.critic_optimizer)
            state["critic_scheduler"] = self.critic_scheduler.state_dict()
        return state

    def resume(self) -> str:
        if self.latest is None:
            return f"fresh {self.dcfg.method} run; student from {self.cfg.checkpoint.load_path}"
        self._check_same_recipe()
        state = self.state()
        ckpt.load_checkpoint(self.latest, state, verify=None)  # verified by resume_point
        set_optimizer_state_dict(self.student, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.ema.load_state_dict(state["ema"])
        if self.critic is not None:
            set_optimizer_state_dict(self.critic, self.critic_optimizer, state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        t = state["trainer"]
        self.step, self.consumed = int(t["step"]), int(t["consumed_samples"])
        self.student_updates, self.critic_updates = int(t["student_updates"]), int(t["critic_updates"])
        return f"resumed {self.latest} at step {self.step}"

    def _check_same_recipe(self) -> None:
        before_file, distill_file = self.run_dir / "resolved_config.json", self.run_dir / DISTILL_CONFIG
        if not before_file.exists():
            return
        before, now = json.loads(before_file.read_text()), config_to_dict(self.cfg)
        changed = [f"{s}.{k}" for s, values in now.items() for k, v in values.items()
                   if f"{s}.{k}" not in RESUMABLE_KNOBS and before.get(s, {}).get(k) != v]
        if distill_file.exists() and json.loads(distill_file.read_text()) != distill_to_dict(self.dcfg):
            changed.append("distill")
        if changed:
            raise CheckpointError(str(before_file), f"run '{self.cfg.job.name}' was started with a different recipe (changed: {', '.join(changed)})",
                                  "use a new job.name for a new experiment, or restore the recipe it was started with")

    def save(self) -> Path:
        metadata = {"data_contract": self.data.contract, "world_size": self.ctx.world_size, "distill": distill_to_dict(self.dcfg),
                    "student_sigmas": self.student_sigmas, "student_updates": self.student_updates,
                    "critic_updates": self.critic_updates}
        path = ckpt.save_checkpoint(self.checkpoints_dir, self.step, self.state(), metadata, self.ctx, self.cfg.checkpoint.verify)
        if self.ctx.is_main:
            ckpt.prune_checkpoints(self.checkpoints_dir, self.cfg.checkpoint.keep_last)
        return path

    # ---- sequences ---------------------------------------------------------------------------
    def chunk_of(self, num_frames: int) -> list[int]:
        return chunk_ids(num_frames, self.chunk_frames)  # the cut evaluation uses too (wamkit.diffusion.chunked)

    def _sequence(self, sample, video: torch.Tensor, noisy_frames: list[int], sigma: float, causal: bool) -> SequenceSample:
        rows = sample.actions.to(self.device)
        return SequenceSample(
            text_ids=self.text_tokenizer.encode(self.cfg.data.prompt_template.format(task=sample.task)), video=video,
            actions=rows, clean_video_frames=[f for f in range(video.shape[1]) if f not in noisy_frames],
            clean_action_rows=list(range(rows.shape[0])), sigma=float(sigma), domain_id=sample.domain_id, fps=self.fps,
            action_start_frame=1, causal_chunk_frames=self.chunk_frames if causal else 0,
        )

    def velocity(self, which: str, seqs: list[SequenceSample]) -> list[torch.Tensor]:
        model = self.models[which]
        batch = pack_samples(seqs, model.config)
        with packed_layout(self.procs[which], batch):
            out = model(**batch.forward_kwargs)
        return [out.sample[i][0].float() for i in range(len(seqs))]

    def f(self, which: str, seqs: list[SequenceSample]) -> list[torch.Tensor]:
        """x0 predictions f(x, s) = x - s v(x, s) (clean frames are returned as given)."""
        v = self.velocity(which, seqs)
        return [s.video.float() - s.sigma * vi for s, vi in zip(seqs, v)]

    # ---- TF-dCM ------------------------------------------------------------------------------
    def dcm_loss(self, samples, latents, gens) -> torch.Tensor:
        grid = sigma_schedule(self.dcfg.teacher_steps, self.dcfg.student_shift).tolist()
        xn_seqs, frames, sig = [], [], []
        for sample, x0, g in zip(samples, latents, gens):
            chunk_of = self.chunk_of(x0.shape[1])
            target = int(torch.randint(1, max(chunk_of) + 1, (1,), generator=g))
            n = int(torch.randint(0, len(grid) - 1, (1,), generator=g))
            noisy = [f for f, c in enumerate(chunk_of) if c == target]
            eps = torch.randn(x0.shape, generator=g).to(self.device)
            x = x0.clone()
            x[:, noisy] = grid[n] * eps[:, noisy] + (1 - grid[n]) * x0[:, noisy]
            xn_seqs.append(self._sequence(sample, x, noisy, grid[n], causal=True))
            frames.append(noisy)
            sig.append((grid[n], grid[n + 1]))
        with torch.no_grad():
            v_teacher = self.velocity("teacher", xn_seqs)
            hat_seqs = []
            for seq, v, (s, s_next), noisy in zip(xn_seqs, v_teacher, sig, frames):
                x_hat = seq.video.clone()
                x_hat[:, noisy] = seq.video[:, noisy] + (s_next - s) * v[:, noisy]
                hat_seqs.append(self._sequence_like(seq, x_hat, s_next))
            targets = [h.video if h.sigma == 0 else fe for h, fe in zip(hat_seqs, self.f("ema", hat_seqs))]
        preds = self.f("student", xn_seqs)
        terms = [(p[:, noisy] - t[:, noisy].detach()).pow(2).mean() for p, t, noisy in zip(preds, targets, frames)]
        return torch.stack(terms).mean()

    def _sequence_like(self, seq: SequenceSample, video: torch.Tensor, sigma: float) -> SequenceSample:
        return SequenceSample(seq.text_ids, video, seq.actions, seq.clean_video_frames, seq.clean_action_rows, float(sigma),
                              seq.domain_id, seq.fps, seq.action_start_frame, seq.causal_chunk_frames)

    # ---- student rollout (stage 3; also used by sampling) -----------------------------------------
    def rollout(self, samples, latents, gens, with_grad: bool) -> list[torch.Tensor]:
        """Chunk-autoregressive 4-step student sampling on its own context. Frame 0 is the real
        first latent frame; every later chunk is generated. Returns [C, t, h, w] per sample."""
        sigmas = self.student_sigmas
        videos = [torch.zeros_like(x0) for x0 in latents]
        for v, x0 in zip(videos, latents):
            v[:, 0] = x0[:, 0]
        chunk_of = self.chunk_of(latents[0].shape[1])
        generated = [[None] * len(chunk_of) for _ in samples]
        for c in range(1, max(chunk_of) + 1):
            frames = [f for f, cc in enumerate(chunk_of) if cc == c]
            exit_step = self.exit_step(c)
            x = [torch.randn(v[:, frames].shape, generator=g).to(self.device) for v, g in zip(videos, gens)]
            for i in range(exit_step + 1):
                grad = with_grad and i == exit_step
                seqs = []
                for sample, v, xi in zip(samples, videos, x):
                    video = v.detach().clone()
                    video[:, frames] = xi
                    seqs.append(self._sequence(sample, video, frames, sigmas[i], causal=True))
                with torch.set_grad_enabled(grad):
                    x0_hat = [fh[:, frames] for fh in self.f("student", seqs)]
                if i < exit_step:
                    x = [sigmas[i + 1] * torch.randn(h.shape, generator=g).to(self.device) + (1 - sigmas[i + 1]) * h.detach()
                         for h, g in zip(x0_hat, gens)]
            for j, (v, h) in enumerate(zip(videos, x0_hat)):
                v[:, frames] = h.detach()
                for k, f in enumerate(frames):
                    generated[j][f] = h[:, k]
        out = []
        for j, v in enumerate(videos):
            out.append(torch.stack([v[:, 0]] + [generated[j][f] for f in range(1, v.shape[1])], dim=1))
        return out

    def exit_step(self, chunk: int) -> int:
        """The ladder step at which chunk `chunk` of this step's rollout leaves with grad. One draw
        for the whole step, keyed by (seed, step, chunk), never by a sample: every rank must run the
        same number of student forwards, or the sharded forwards' collectives would not pair up."""
        g = sample_generator(self.cfg.job.seed, EXIT_STEP_OFFSET + self.step * 4096 + chunk)
        return int(torch.randint(0, len(self.student_sigmas) - 1, (1,), generator=g))

    def _noised(self, samples, videos, gens):
        seqs, eps = [], []
        for sample, x, g in zip(samples, videos, gens):
            s = sample_sigmas(1, g, self.cfg.diffusion.shift or 1.0, self.cfg.diffusion.logit_mean, self.cfg.diffusion.logit_std).item()
            e = torch.randn(x.shape, generator=g).to(self.device)
            noisy = list(range(1, x.shape[1]))
            xs = x.detach().clone()
            xs[:, noisy] = s * e[:, noisy] + (1 - s) * x.detach()[:, noisy]
            seqs.append(self._sequence(sample, xs, noisy, s, causal=False))
            eps.append(e)
        return seqs, eps

    def critic_loss(self, samples, latents, gens) -> torch.Tensor:
        with torch.no_grad():
            fake = self.rollout(samples, latents, gens, with_grad=False)
        seqs, eps = self._noised(samples, fake, gens)
        v = self.velocity("critic", seqs)
        return torch.stack([(vi[:, 1:] - (e[:, 1:] - x[:, 1:])).pow(2).mean() for vi, e, x in zip(v, eps, fake)]).mean()

    def dmd_loss(self, samples, latents, gens) -> torch.Tensor:
        fake = self.rollout(samples, latents, gens, with_grad=True)
        seqs, _ = self._noised(samples, fake, gens)
        with torch.no_grad():
            real_x0, fake_x0 = self.f("reference", seqs), self.f("critic", seqs)
        terms = []
        for x, r, fk in zip(fake, real_x0, fake_x0):
            norm = (x.detach()[:, 1:] - r[:, 1:]).abs().mean().clamp_min(1e-6)
            g = (fk[:, 1:] - r[:, 1:]) / norm
            terms.append(0.5 * (x[:, 1:] - (x[:, 1:] - g).detach()).pow(2).mean())
        return torch.stack(terms).mean()

    def is_student_turn(self, step: int) -> bool:
        r = self.dcfg.critic_updates_per_student
        return self.dcfg.method == "tf_dcm" or step % (r + 1) == r

    # ---- loop --------------------------------------------------------------------------------
    def _apply(self, model, optimizer, scheduler) -> float:
        """One optimizer step on the gradients the step's backward left (FSDP2 reduced them into the
        fp32 master shards)."""
        norm = clip_gradients(model, self.cfg.optimizer.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def train_step(self, stream) -> dict:
        samples = next(stream)
        first = self.consumed + self.ctx.rank * self.cfg.trainer.samples_per_step  # this rank's slice of the global batch
        gens = [sample_generator(self.cfg.job.seed, first + j) for j in range(len(samples))]
        with torch.no_grad():
            latents = [self.video_tokenizer.encode(s.video.unsqueeze(0))[0].float().to(self.device) for s in samples]
        self.consumed += self.global_batch
        role = "student" if self.is_student_turn(self.step) else "critic"
        model, optimizer, scheduler = ((self.student, self.optimizer, self.scheduler) if role == "student"
                                       else (self.critic, self.critic_optimizer, self.critic_scheduler))
        optimizer.zero_grad(set_to_none=True)
        if self.dcfg.method == "tf_dcm":
            loss = self.dcm_loss(samples, latents, gens)
        elif role == "student":
            loss = self.dmd_loss(samples, latents, gens)
        else:
            loss = self.critic_loss(samples, latents, gens)
        loss.backward()
        value = all_reduce_mean(loss.item(), self.ctx)
        if not math.isfinite(value):
            raise FloatingPointError(f"{role} loss is {value} at step {self.step}")
        norm = self._apply(model, optimizer, scheduler)
        if role == "student":
            self.student_updates += 1
            self.ema.update(self.student, self.student_updates)
            self.ema.copy_to(self.ema_model)
        else:
            self.critic_updates += 1
        return {"loss": value, f"{role}_loss": value, "role": role, "grad_norm": norm,
                "lr": self.optimizer.param_groups[0]["lr"], "student_updates": self.student_updates,
                "critic_updates": self.critic_updates}

    @torch.no_grad()
    def refresh_ema_model(self) -> None:
        """The EMA model is the student with the EMA's averaged weights: the weights the EMA does not
        average (the frozen text pathway) are the student's own, which after a resume come from the
        checkpoint, not from the build."""
        ema_params = dict(self.ema_model.named_parameters())
        for name, param in self.student.named_parameters():
            if name not in self.ema.shadow:
                ema_params[name].copy_(param)
        self.ema.copy_to(self.ema_model)

    def train(self) -> dict:
        how = self.resume()
        self.refresh_ema_model()
        main = self.ctx.is_main
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.toml").write_text(format_config(self.cfg) + "[distill]\n" + "".join(
                f"{k} = {json.dumps(v)}\n" for k, v in distill_to_dict(self.dcfg).items()))
            (self.run_dir / "resolved_config.json").write_text(json.dumps(config_to_dict(self.cfg), indent=2))
            (self.run_dir / DISTILL_CONFIG).write_text(json.dumps(distill_to_dict(self.dcfg), indent=2))
            (self.run_dir / "data_contract.json").write_text(json.dumps(self.data.contract, indent=2))
            print(f"[wamkit] run dir: {self.run_dir}\n[wamkit] {how}\n[wamkit] world size {self.ctx.world_size}, "
                  f"global batch {self.global_batch} samples/step", flush=True)
        cfg = self.cfg.trainer
        if self.step >= cfg.max_iter:
            return self.summary()
        logger = MetricsLogger(self.run_dir, self.step) if main else None
        stream = batch_stream(self.data.samples("train", self.cfg), self.order, self.consumed, cfg.samples_per_step,
                              self.cfg.data.num_workers, self.ctx.rank, self.ctx.world_size)
        self.student.train()
        setup_peak = memory.reset_peak(self.device) if self.device.type == "cuda" else None  # the steps' peak apart from the build's
        first_step, student_updates = self.step, self.student_updates
        try:
            while self.step < cfg.max_iter:
                t0 = time.perf_counter()
                record = self.train_step(stream)
                self.step += 1
                # This process's peak beside the gate's estimate once the student has stepped: SF-DMD's first
                # five steps are critic turns, before the student's gradients and AdamW moments exist.
                if setup_peak is not None and self.student_updates > student_updates:
                    self._print_peak(main, setup_peak, first_step)
                    setup_peak = None
                record["samples_per_s"] = self.global_batch / (time.perf_counter() - t0)
                if main and (self.step % cfg.log_every == 0 or self.step == cfg.max_iter):
                    logger.log({"step": self.step, **record})
                if self.step % self.cfg.checkpoint.save_iter == 0 or self.step == cfg.max_iter:
                    self.save()
        finally:
            if logger is not None:
                logger.close()
        if setup_peak is not None and self.step > first_step:  # ended before the student's first update
            self._print_peak(main, setup_peak, first_step, "before the student's first update")
        return self.summary()

    def _print_peak(self, main: bool, setup_peak: float, first_step: int, why: str = "through the first student update") -> None:
        steps = self.step - first_step
        where = "in the first step" if steps == 1 else f"in the first {steps} steps ({why})"
        if main:
            print(f"[wamkit] {memory.first_step_line(self.device, self.gate_estimate, setup_peak, where)}", flush=True)

    def summary(self) -> dict:
        return {"run_dir": str(self.run_dir), "step": self.step, "method": self.dcfg.method,
                "student_updates": self.student_updates, "critic_updates": self.critic_updates,
                "latest_checkpoint": str(ckpt.latest_checkpoint(self.checkpoints_dir))}
