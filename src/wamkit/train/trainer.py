"""The training loop, top to bottom: set up, resume if this run name has a checkpoint, step, log,
validate, save. Every source of randomness in a step is derived from (seed, step), and the data
position from the step count, so a resumed run reproduces the uninterrupted one exactly."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch
from torch._dynamo.exc import FailOnRecompileLimitHit
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from wamkit.config import ExperimentConfig, config_to_dict, format_config
from wamkit.config.env import expand_env
from wamkit.data.order import EpisodeShuffleOrder
from wamkit.diffusion.objective import PolicyObjective
from wamkit.errors import CheckpointError, ConfigError
from wamkit.model.lora import prepare_trainable
from wamkit.model.attention_backends import attention_backend, training_text_multiple
from wamkit.storage import download, is_remote, upload
from wamkit.train import checkpoint as ckpt
from wamkit.train.base_identity import (BASE_KEY, base_identity, check_same_base, check_trainable_only_build, saves_trainable_only,
                                        trainable_state)
from wamkit.train import memory, step_profile, sync_check
from wamkit.train.disk import extra_save_steps, fraction_step, saves_at
from wamkit.train.ema import EMA
from wamkit.train.faults import KILL_AFTER_SAVE, maybe_kill
from wamkit.train.metrics import MetricsLogger, read_metrics
from wamkit.train.optim import build_optimizer, clip_gradients
from wamkit.train.recovery import resume_point
from wamkit.train.context_parallel import context_parallel_backend, enable_context_parallel
from wamkit.train.parallel import all_reduce_mean_tensor, all_reduce_min, init_distributed, parallel_dims, parallelize, run_mesh
from wamkit.config.schedule import build_schedule
from wamkit.train.datasets import build_run_data
from wamkit.train.setup import (build_model, build_tokenizers, builds_on_meta, check_placement, check_vocab, load_base_weights,
                                materialize_run_model)
from wamkit.train.step_timer import StepTimer
from wamkit.train.stream import SampleOrder, batch_stream
from wamkit.train.throughput import StartupTimeline, StepInterval, Throughput, seconds_since_launch
from wamkit.train.time_budget import TimeBudget
from wamkit.train.tracking import check_wandb, start_wandb
from wamkit.train.warmup import EncoderWarmup, warmup_clip_shape


FITTED_KEY = "fitted_max_iter"  # checkpoint metadata: the last step trainer.time_budget_s chose

# Knobs that may change when a run name is relaunched: how long, how often, how loud, and how the
# ranks are arranged. A run relaunched on fewer nodes after one died sets the replicate degree to the
# nodes it has and may raise grad_accum_iter to keep its global batch (the data position and the
# noise are keyed by global sample position, so the steps are the same); the DCP checkpoint
# reshards (docs/cluster.md).
RESUMABLE_KNOBS = {
    "trainer.max_iter", "trainer.log_every", "trainer.val_every", "trainer.val_samples", "trainer.progress_bar",
    "checkpoint.save_iter", "checkpoint.save_steps", "checkpoint.save_fractions", "checkpoint.keep_last", "data.num_workers",
    "trainer.time_budget_s",
    "checkpoint.verify", "checkpoint.on_damage", "checkpoint.resume_step",  # how checkpoints are checked and chosen
    "parallel.context_parallel_degree",  # how a step is split across GPUs, not what it computes
    "logging.wandb", "logging.project", "logging.group", "logging.run_name",
    "parallel.data_parallel_replicate_degree", "trainer.grad_accum_iter",
}


def sample_generator(seed: int, position: int) -> torch.Generator:
    """Noise of the sample at global stream `position`: independent of rank count and batching."""
    return torch.Generator().manual_seed(seed * 1_000_003 + position)


VALIDATION_OFFSET = 1 << 40  # validation noise never collides with training positions


class Trainer:
    """`device`: see wamkit.device.resolve_device (auto = the rank's GPU when there is one). Every
    module of the run -- transformer, tokenizer, EMA, noise, loss targets -- lives there."""

    def __init__(self, cfg, device: str = "auto", started: float | None = None):
        """`started`: the time.perf_counter() value trainer.time_budget_s counts from (`wamkit train`
        passes its process's launch; by default, this construction)."""
        self.cfg = cfg
        self.timeline = StartupTimeline()
        self.started = time.perf_counter() if started is None else started
        self.ctx = init_distributed(device)
        if self.ctx.is_main:
            check_wandb(cfg)  # a missing package or login fails now, not after the model is built
        self.device = self.ctx.device
        self.run_dir = cfg.job.run_dir()  # a Path, or a UPath in an object store (wamkit.storage)
        self.local_dir = cfg.job.local_dir()  # metrics.jsonl, TensorBoard, W&B: local, uploaded with each checkpoint
        self.checkpoints_dir = self.run_dir / "checkpoints"
        torch.manual_seed(cfg.job.seed)
        t0 = time.perf_counter()
        self.timeline.mark("distributed init")
        self.data = build_run_data(cfg)
        self.timeline.mark("data")
        self.video_tokenizer, self.text_tokenizer = build_tokenizers(cfg, self.device)
        self.timeline.mark("tokenizers")
        self.encoder_warmup = self._start_encoder_warmup()  # compiles beside the build; joined before the loader forks
        # On a GPU the transformer is built on the meta device and materialised shard by shard on the
        # GPU after sharding (wamkit.model.materialize): no host init of billions of parameters.
        check_trainable_only_build(cfg)
        self.materialize = builds_on_meta(cfg, self.device)
        self.model = build_model(cfg, self.video_tokenizer.latent_channels, "meta" if self.materialize else self.device)
        check_vocab(self.model, self.text_tokenizer)
        self.latest = resume_point(self.checkpoints_dir, cfg.checkpoint, self.ctx)  # verified (wamkit.train.recovery)
        # A LoRA run's checkpoints hold only what trains: its frozen weights come from the base on resume too.
        self.trainable_only = saves_trainable_only(cfg)
        self.init_note = "" if self.materialize else self._load_base_if_fresh()
        self.parameter_counts = prepare_trainable(self.model, cfg)  # LoRA after base weights, before optimizer/EMA/resume
        self.gate_plan = self._check_memory()  # before anything of the model is on the GPU
        self.dims = dims = parallel_dims(cfg, self.ctx.world_size)
        self.dp_rank, self.dp_size = dims.dp_rank(self.ctx.rank), dims.dp_size  # a cp group shares its samples
        self.mesh = run_mesh(self.ctx, dims)
        self.model = parallelize(self.model, self.mesh, cfg, self.checkpointing)
        if self.materialize:
            note = materialize_run_model(self.model, cfg, self.device, load_base=self.latest is None or self.trainable_only)
            self.init_note = "" if self.latest is not None else note
        self.base = base_identity(cfg, self.model, self.ctx) if self.trainable_only else None  # frozen: computed once
        check_placement(self.device, self.model, self.video_tokenizer)
        self.build_seconds = time.perf_counter() - t0
        self.timeline.mark("model")
        backend = attention_backend(cfg.model.attention, self.device, cfg.parallel.param_dtype)
        backend = context_parallel_backend(cfg.model.attention, backend, dims.cp)
        self.objective = PolicyObjective(
            self.model, self.video_tokenizer, self.text_tokenizer, cfg.diffusion, cfg.data.prompt_template, self.data.dataset.fps,
            backend, mode=cfg.model.mode, mode_weights=cfg.model.mode_weights, text_multiple=training_text_multiple(cfg.parallel.compile, backend, cfg.trainer.samples_per_step),
            random_shift_px=cfg.data.random_shift_px,
        )
        if dims.cp > 1:
            self.objective.processor = enable_context_parallel(self.model, self.objective.processor, self.mesh["cp"].get_group())
        if cfg.trainer.max_tokens_per_batch:
            cfg.trainer.samples_per_step = self._samples_for_token_budget(cfg.trainer.max_tokens_per_batch)
        self.optimizer = build_optimizer(self.model, cfg.optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, build_schedule(cfg.scheduler, cfg.trainer.max_iter))
        self.ema = EMA(self.model, cfg.ema.beta, cfg.ema.warmup) if cfg.ema.enabled else None
        self.order = (EpisodeShuffleOrder.from_windows(self.data.train_windows, cfg.job.seed)
                      if cfg.data.shuffle == "episodes" else SampleOrder(len(self.data.train_windows), cfg.job.seed))
        self.step = 0
        self.consumed = 0  # samples consumed by all ranks: the data position
        self.timer = StepTimer(self.device)
        self.fitted = False  # trainer.max_iter fitted to trainer.time_budget_s (kept in the checkpoints)

    def _start_encoder_warmup(self) -> EncoderWarmup | None:
        """On a GPU, compile the VAE encoder (model.compile_vae) and start its warm-up on the clip
        shape of one micro-batch (wamkit.train.warmup). Not with trainer.max_tokens_per_batch, whose
        micro-batch is known only after the build."""
        cfg = self.cfg
        if not (cfg.model.compile_vae and not cfg.data.latent_cache and self.device.type == "cuda"
                and hasattr(self.video_tokenizer, "compile_encoder")):
            return None
        self.video_tokenizer.compile_encoder()
        shape = None if cfg.trainer.max_tokens_per_batch else warmup_clip_shape(self.data.samples("train", cfg), cfg.trainer.samples_per_step)
        return EncoderWarmup(self.video_tokenizer, shape).start() if shape else None

    def _join_encoder_warmup(self) -> None:
        if self.encoder_warmup is not None:
            note = self.encoder_warmup.join()
            if self.ctx.is_main:
                print(f"[wamkit] {note}", flush=True)

    def _check_memory(self) -> dict | None:
        """On a GPU: the per-GPU estimate (wamkit.train.memory) against the memory this process can
        use, and a GPUMemoryError naming what fits when it exceeds it. Resolves
        `parallel.activation_checkpointing = "auto"` into `self.checkpointing` (on the CPU: none).
        Returns the plan the out-of-memory report needs; None on the CPU."""
        asked = self.cfg.parallel.activation_checkpointing
        if self.device.type != "cuda":
            self.checkpointing = "none" if asked == "auto" else asked
            return None
        usable, total = memory.usable_bytes(self.device)
        usable = all_reduce_min(usable, self.ctx)  # every rank must pick the same "auto" layout
        plan = self.memory_plan(usable)
        # without an estimate (no camera sizes before the first batch) "auto" takes the mode that needs least
        self.checkpointing = plan["knobs"].checkpointing if plan else ("full" if asked == "auto" else asked)
        if self.ctx.is_main and (plan or asked == "auto"):
            print(f"[wamkit] {self._memory_line(plan, usable, total)}", flush=True)
        if plan is not None and plan["estimate"] > usable:
            raise memory.GPUMemoryError(
                f"{self.cfg.job.name}: memory", f"the run needs an estimated {plan['estimate'] / memory.GIB:.1f} GiB per GPU on "
                f"{self.ctx.world_size} GPU(s), {usable / memory.GIB:.1f} GiB is usable", self._fit_advice(plan))
        return plan

    def _memory_line(self, plan: dict | None, usable: float, total: float) -> str:
        auto = f"activation checkpointing auto -> {self.checkpointing}; " if self.cfg.parallel.activation_checkpointing == "auto" else ""
        if plan is None:
            return f"{auto}no memory estimate before the first batch (the data contract names no camera sizes)"
        return (f"{auto}memory estimate {plan['estimate'] / memory.GIB:.1f} GiB per GPU of {usable / memory.GIB:.1f} GiB usable "
                f"({torch.cuda.get_device_name(self.device)}, {total / memory.GIB:.1f} GiB): {plan['breakdown']}")

    def memory_plan(self, usable: float) -> dict | None:
        """What the estimate of this run is made of, judged against `usable` bytes per GPU; None when
        a sample's token count is not known before the first batch (no camera sizes in the contract)."""
        sample = self._sample_token_counts()
        if sample is None:
            return None
        cfg, tokens = self.cfg, sample["total"]
        counts, vae = memory.model_counts(self.model, cfg.lora.enabled), memory.vae_parameter_count(cfg)
        knobs = memory.Knobs.from_config(cfg, self.ctx.world_size, sample)
        knobs = memory.resolve_checkpointing(counts, knobs, tokens, vae, usable)
        plan = {"counts": counts, "knobs": knobs, "tokens": tokens, "vae": vae, "usable": usable,
                "lora_counts": memory.lora_counts_for(self.model, cfg) if self.materialize else None}
        est = memory.estimate(plan["counts"], plan["knobs"], tokens, plan["vae"])
        return {**plan, "estimate": est["total"], "breakdown": memory.format_estimate(est)}

    def _fit_advice(self, plan: dict) -> str:
        return memory.fit_report(plan["counts"], plan["lora_counts"], plan["knobs"], plan["tokens"], plan["vae"], plan["usable"])

    def _sample_token_counts(self) -> dict[str, int] | None:
        """memory.token_counts of one training sample: the frame the transformer sees (a LeRobot
        dataset's canvas, a bundle's frames) and a training task's prompt."""
        return memory.run_token_counts(self.cfg, self.model.config, self.data, self.text_tokenizer)

    def _out_of_memory(self, exc: Exception) -> memory.GPUMemoryError:
        """An out-of-memory error that the gate did not foresee, in a few lines with the same advice."""
        peak = torch.cuda.max_memory_allocated(self.device) / memory.GIB
        plan = self.gate_plan
        said = f"; the estimate was {plan['estimate'] / memory.GIB:.1f} GiB" if plan else ""
        if plan and plan["estimate"] <= plan["usable"]:
            said += (", which fits: what failed is outside it, e.g. a kernel that fell back to materialising attention scores "
                     "(see the warnings above)")
        return memory.GPUMemoryError(
            f"{self.cfg.job.name}: step {self.step + 1}", f"ran out of GPU memory (peak {peak:.1f} GiB allocated{said}): "
            f"{str(exc).splitlines()[0]}", self._fit_advice(plan) if plan else "lower trainer.samples_per_step or turn on "
            "parallel.activation_checkpointing")

    @property
    def parallel_degree(self) -> int:
        return self.ctx.world_size

    def _samples_for_token_budget(self, budget: int) -> int:
        """Samples per packed sequence under a token budget. Every window of a dataset has the same
        canvas and chunk, so its token count is fixed (text counted at its maximum length)."""
        sample = self.data.samples("train", self.cfg)[0]
        _, t, h, w = self.objective.latents_of([sample])[0].shape
        p = self.model.config.latent_patch_size
        tokens = self.cfg.model.max_text_tokens + t * -(-h // p) * -(-w // p) + sample.actions.shape[0] + (sample.state is not None)
        if budget < tokens:
            raise ConfigError("trainer.max_tokens_per_batch", f"{budget} is below one sample's {tokens} tokens",
                              f"raise it to at least {tokens}, or set it to 0 and use trainer.samples_per_step")
        return budget // tokens

    @property
    def global_micro_batch(self) -> int:
        return self.cfg.trainer.samples_per_step * self.dp_size

    # ---- state -------------------------------------------------------------------------------
    def state(self) -> dict:
        state = {
            "model": trainable_state(self.model) if self.trainable_only else self.model.state_dict(),
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "trainer": {"step": self.step, "consumed_samples": self.consumed},
            "rng": {"torch": torch.get_rng_state()},
        }
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def _load_base_if_fresh(self) -> str:
        """Base weights load into the plain model, before sharding; a resume loads later, sharded."""
        if self.latest is not None:
            return ""
        if self.cfg.checkpoint.load_path:
            kind = load_base_weights(self.model, self.cfg)
            return f"fresh run from base weights ({kind}) {self.cfg.checkpoint.load_path}"
        return "fresh run from random initialisation"

    def resume_or_init(self) -> str:
        latest = self.latest
        if latest is None:
            return self.init_note
        self._check_same_recipe(latest)
        state = self.state()
        saved_base = ckpt.read_marker(latest).get(BASE_KEY)
        if saved_base is not None:
            check_same_base(saved_base, self.base, latest)
        elif self.trainable_only:  # written before LoRA checkpoints left the base out: it holds every weight
            state["model"] = self.model.state_dict()
        ckpt.load_checkpoint(latest, state, verify=None)  # verified by resume_point
        fitted = ckpt.read_marker(latest).get(FITTED_KEY)
        if fitted is not None and self.cfg.trainer.time_budget_s > 0:  # the first launch's fit (its schedule came back with the scheduler)
            self.cfg.trainer.max_iter, self.fitted = min(int(fitted), self.cfg.trainer.max_iter), True
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        torch.set_rng_state(state["rng"]["torch"])
        self.step = int(state["trainer"]["step"])
        self.consumed = int(state["trainer"]["consumed_samples"])
        return f"resumed {latest} at step {self.step}"

    def _check_same_recipe(self, latest: Path) -> None:
        """Resuming under a changed recipe would silently mix two experiments; only run-length and
        logging knobs may change between launches of one run name."""
        saved = self.run_dir / "resolved_config.json"
        if not saved.exists():
            return
        before, now = json.loads(saved.read_text()), config_to_dict(self.cfg)
        defaults = config_to_dict(ExperimentConfig())  # a knob added since the run started had its default
        changed = [
            f"{section}.{key}" for section, values in now.items() for key, value in values.items()
            if f"{section}.{key}" not in RESUMABLE_KNOBS
            and _as_recorded(before.get(section, {}).get(key, defaults[section][key]), f"{section}.{key}") != value
        ]
        if changed:
            raise CheckpointError(
                str(saved), f"run '{self.cfg.job.name}' was started with a different recipe (changed: {', '.join(changed)})",
                "use a new job.name for a new experiment, or restore the recipe/overrides it was started with",
            )

    def save(self) -> Path:
        metadata = {"data_contract": self.data.contract, "world_size": self.ctx.world_size,
                    **({BASE_KEY: self.base} if self.trainable_only else {}),
                    **({FITTED_KEY: self.cfg.trainer.max_iter} if self.fitted else {})}
        path = ckpt.save_checkpoint(self.checkpoints_dir, self.step, self.state(), metadata, self.ctx, self.cfg.checkpoint.verify)
        if self.ctx.is_main:
            ckpt.prune_checkpoints(self.checkpoints_dir, self.cfg.checkpoint.keep_last)
        return path

    # ---- loop --------------------------------------------------------------------------------
    def train(self) -> dict:
        cfg = self.cfg.trainer
        main = self.ctx.is_main
        how = self.resume_or_init()
        if main:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            if is_remote(self.run_dir):  # the logs up to the checkpoint this launch resumes from
                download(self.run_dir, self.local_dir, "metrics.jsonl")
            (self.run_dir / "config.toml").write_text(format_config(self.cfg))
            (self.run_dir / "resolved_config.json").write_text(json.dumps(config_to_dict(self.cfg), indent=2))
            (self.run_dir / "data_contract.json").write_text(json.dumps(self.data.contract, indent=2))
            print(f"[wamkit] run dir: {self.run_dir}\n[wamkit] {how}\n[wamkit] world size {self.ctx.world_size}"
                  f"{f' (context parallel {self.dims.cp})' if self.dims.cp > 1 else ''}, "
                  f"global batch {self.global_micro_batch * cfg.grad_accum_iter} samples/step", flush=True)
        if self.step >= cfg.max_iter:
            if main:
                print(f"[wamkit] run already at max_iter={cfg.max_iter}; nothing to do")
            return self.summary()
        logger = None
        if main:
            tracker = start_wandb(self.cfg, self.run_dir, self.local_dir, config_to_dict(self.cfg), self.data.contract)
            logger = MetricsLogger(self.local_dir, self.step, tracker)
        self._join_encoder_warmup()  # before the loader's workers fork from this process
        stream = batch_stream(
            self.data.samples("train", self.cfg), self.order, self.consumed, cfg.samples_per_step,
            self.cfg.data.num_workers, self.dp_rank, self.dp_size,
        )
        bar = _progress(cfg.max_iter, self.step, cfg.progress_bar and main)
        self.model.train()
        throughput = Throughput(self.device, self.parallel_degree)
        if self.device.type == "cuda":  # the steps' peak apart from the build's and a resume's transients
            self.setup_peak_gib = memory.reset_peak(self.device)
            if main:
                print(f"[wamkit] device {self.device} ({torch.cuda.get_device_name(self.device)}); model built in {self.build_seconds:.1f} s", flush=True)
        try:
            self._train_loop(stream, bar, logger, throughput)
        except torch.OutOfMemoryError as exc:
            raise self._out_of_memory(exc) from None
        except FailOnRecompileLimitHit as exc:  # wamkit.train.parallel.refuse_silent_recompile_fallback
            raise ConfigError("parallel.compile", f"the compiled decoder layers recompiled past dynamo's limit at step {self.step + 1} "
                              f"(eager layers would run flex attention unfused, N x N in memory): {str(exc).splitlines()[0]}",
                              "report it with the log (TORCH_LOGS=recompiles shows each reason); meanwhile "
                              "--set parallel.compile=false trains eagerly, slower") from None
        finally:
            bar.close()
            if logger is not None:
                logger.close()
        return self.summary()

    def _compile_note(self) -> str:
        """Where a first step's time went to torch.compile (the cold-start cost a warm cache saves)."""
        from wamkit.model.cuda_graphs import dynamo_compile_seconds

        background = self.encoder_warmup.compile_seconds if self.encoder_warmup is not None else 0.0  # off the step
        total = dynamo_compile_seconds() - background
        if total < 0.05:
            return ""
        vae = getattr(self.video_tokenizer, "compile_seconds", 0.0) - background
        return f"; torch.compile {total:.1f} s" + (f", {vae:.1f} s of it the VAE encoder" if vae >= 0.05 else "")

    def _memory_note(self) -> str:
        """The first step's measured peak beside the estimate the gate used (memory.measured_line)."""
        return memory.first_step_line(self.device, self.gate_plan["estimate"] if self.gate_plan else None, self.setup_peak_gib)

    def _train_loop(self, stream, bar, logger, throughput) -> None:
        """Step until max_iter: log, validate and save on their schedules."""
        cfg, main = self.cfg.trainer, self.ctx.is_main
        self.timeline.mark("optimizer/EMA/resume/loader")
        first = True
        check_syncs = bool(os.environ.get(sync_check.ENV)) and self.device.type == "cuda"
        # WAMKIT_PROFILE_STEPS: warm steps under torch.profiler, after the first (compile) and the sync check's
        profiler = step_profile.StepProfile(step_profile.requested_steps() if main else 0, self.device, self.local_dir)
        interval = StepInterval()  # the steps since the last synchronised one: their rates are measured together
        budget = self._time_budget()
        # the fractions not yet saved; a resumed run's are behind it when its last launch saved them
        self._fractions_left, self._last_saved_step = list(self.cfg.checkpoint.save_fractions), self.step
        extra_saves = self._extra_saves()  # again whenever the budget refits max_iter, and after every save
        while self.step < cfg.max_iter:
            if not interval.steps:  # logging, validation and saves between intervals are not training time
                interval.restart()
            upcoming = self.step + 1
            out_of_time = budget is not None and upcoming < cfg.max_iter and budget.spent_before(upcoming, cfg.log_every)
            saving = out_of_time or saves_at(upcoming, cfg.max_iter, self.cfg.checkpoint.save_iter, extra_saves)
            logged = saving or upcoming % cfg.log_every == 0
            synced = first or logged  # steps in between never wait for the GPU
            if check_syncs and not first:  # this process's second step: compiled, warm, not a log step's read-back
                with sync_check.counting_syncs(self.device) as found:
                    record = self.train_step(stream, read_timer=synced)
                check_syncs = False
                if main:
                    print(f"[wamkit] {sync_check.sync_line(self.step + 1, found)}", flush=True)
            else:
                if not first:
                    profiler.begin(upcoming)
                record = self.train_step(stream, read_timer=synced)
                profiler.end(upcoming, last=upcoming == cfg.max_iter)
            self.step += 1
            fitted = budget.after_step(self.step) if budget is not None else None
            if fitted is not None:
                self._fit_to_budget(fitted, bar, budget)
                extra_saves = self._extra_saves()
            interval.add(record)
            if synced:  # the step timer's read waited for the GPU: the wall clock covers the interval's work
                record.update(throughput.measure(interval.work(), interval.seconds(),
                                                 interval.steps * cfg.samples_per_step * cfg.grad_accum_iter / self.dims.cp, interval.steps))
                interval.steps = 0
            if first and main:  # this process's first step (a resumed run's too: relaunch cost)
                self.timeline.mark("first step")
                print(f"[wamkit] first step done {seconds_since_launch():.1f} s after launch "
                      f"({record['step_s']:.1f} s in the step itself{self._compile_note()})", flush=True)
                print(f"[wamkit] {self.timeline.line()}", flush=True)
                if self.device.type == "cuda":
                    print(f"[wamkit] {self._memory_note()}", flush=True)
            first = False
            if logged:  # every rank: the losses' all-reduce, the finite check
                record = self._read_back(record)
                if main:
                    logger.log({"step": self.step, **record})
                    bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}", sps=f"{record['samples_per_s']:.1f}",
                                    **({"mfu": f"{record['mfu']:.3f}"} if "mfu" in record else {}))
            if cfg.val_every and self.step % cfg.val_every == 0 and self.data.val_windows is not None:
                val_losses = self.validate()
                if main:
                    logger.log({"step": self.step, **val_losses})
            if saving:
                self.save()
                self._last_saved_step = self.step
                extra_saves = self._extra_saves()
                self._publish_logs(logger)
                maybe_kill(KILL_AFTER_SAVE, self.step)
            bar.update(1)
            if out_of_time:
                if main:
                    print(f"[wamkit] trainer.time_budget_s {cfg.time_budget_s:g} s spent at step {self.step}, before the "
                          f"planned {cfg.max_iter} (steps slower than when timed, or a startup that ate the budget before "
                          "the fit); saved and stopped", flush=True)
                break

    def _extra_saves(self) -> set[int]:
        """checkpoint.save_steps and the save_fractions still to save, as steps of the run's current max_iter.
        A refit that shortens the run can move a fraction's step behind it before it was saved (2026-12-04: a run
        refitted from 995 to 611 steps at step 463 lost its 0.5 checkpoint): it is saved at the next step instead,
        unless a save since that step already stands for it."""
        max_iter = self.cfg.trainer.max_iter
        self._fractions_left = [f for f in self._fractions_left if fraction_step(f, max_iter) > self._last_saved_step]
        due = {max(self.step + 1, fraction_step(f, max_iter)) for f in self._fractions_left}
        return extra_save_steps(max_iter, self.cfg.checkpoint.save_steps) | due

    def _time_budget(self) -> TimeBudget | None:
        """trainer.time_budget_s's clock for this launch (a resumed run keeps the first launch's fit)."""
        if self.cfg.trainer.time_budget_s <= 0:
            return None
        agree = lambda value: -all_reduce_min(-value, self.ctx)  # noqa: E731  (the largest over the ranks)
        clock = lambda: time.perf_counter() - self.started  # noqa: E731
        return TimeBudget(self.cfg.trainer.time_budget_s, self.cfg.trainer.max_iter, self.step, clock, agree, self.device,
                          distributed=self.ctx.distributed, calibrate=not self.fitted)  # a resumed run keeps its fit

    def _fit_to_budget(self, last_step: int, bar, budget: TimeBudget) -> None:
        """End the run at `last_step` and stretch or shrink the learning-rate schedule to it."""
        cfg = self.cfg.trainer
        ceiling, cfg.max_iter, self.fitted = budget.ceiling, last_step, True
        schedule = build_schedule(self.cfg.scheduler, last_step)
        self.scheduler.lr_lambdas = [schedule] * len(self.scheduler.lr_lambdas)
        if hasattr(bar, "total"):
            bar.total = last_step
        if self.ctx.is_main:
            print(f"[wamkit] trainer.time_budget_s {cfg.time_budget_s:g} s: {budget.seconds_per_step:.3f} s a step at step {self.step}, "
                  f"{budget.elapsed_s:.0f} s into the budget, so training to step {last_step} (trainer.max_iter {ceiling} "
                  "is the ceiling), the learning-rate schedule fitted to it", flush=True)

    def _publish_logs(self, logger) -> None:
        """A run in an object store gets its metrics.jsonl and TensorBoard files beside each
        checkpoint (rank 0), so a resume on another machine continues the logs."""
        if logger is not None and is_remote(self.run_dir):
            logger.flush()
            upload(self.local_dir, self.run_dir, ("metrics.jsonl", "tensorboard"))

    def train_step(self, stream, read_timer: bool = True) -> dict:
        """One optimizer step. `read_timer` reads its phase split, which waits for the GPU: only the
        steps that are logged do, so the host runs ahead of the GPU in between."""
        cfg = self.cfg.trainer
        timer = self.objective.timer = self.timer
        timer.start()
        self.optimizer.zero_grad(set_to_none=True)
        losses = torch.zeros(4, device=self.device)  # loss, video_loss, action_loss, goal_state_loss: on the device until a log step
        data_wait, flops, tokens, encode = 0.0, 0.0, 0, 0.0  # data_wait: seconds blocked on the loader, near 0 unless decoding limits the step
        for _ in range(cfg.grad_accum_iter):
            t0 = time.perf_counter()
            samples = next(stream)
            data_wait += time.perf_counter() - t0
            timer.mark("data")
            first = self.consumed + self.dp_rank * cfg.samples_per_step
            generators = [sample_generator(self.cfg.job.seed, first + j) for j in range(len(samples))]
            step_losses = self.objective(samples, generators)
            (step_losses.total / cfg.grad_accum_iter).backward()
            timer.mark("forward_backward")
            # this rank's useful work: under context parallelism it computes 1/cp of each sequence
            flops, tokens = flops + self.objective.last_flops / self.dims.cp, tokens + self.objective.last_tokens // self.dims.cp
            encode += self.objective.last_encode_flops  # every rank of a cp group encodes its samples' clips whole
            self.consumed += self.global_micro_batch
            losses += loss_parts(step_losses).float() / cfg.grad_accum_iter
        grad_norm = clip_gradients(self.model, self.cfg.optimizer.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        timer.mark("optimizer")
        if self.ema is not None:
            self.ema.update(self.model, self.step)
            timer.mark("ema")
        record = {"losses": losses, "grad_norm": grad_norm.detach(), "lr": float(self.optimizer.param_groups[0]["lr"]), "data_wait_s": data_wait}
        timer.mark("other")
        times = {f"time_{k}_s": v for k, v in timer.read().items()} if read_timer else {}
        return {**record, "flops": flops, "tokens": tokens, "encode_flops": encode, **times}

    def _read_back(self, record: dict) -> dict:
        """A step's device values as numbers, read once (log and save steps): the losses averaged over
        the ranks, and refused when not finite, before anything is logged or saved."""
        losses = all_reduce_mean_tensor(record.pop("losses"), self.ctx)
        loss, video, action, goal, grad_norm = torch.cat([losses, record.pop("grad_norm").reshape(1).float()]).tolist()
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {self.step} (checked every trainer.log_every steps and before each "
                                     "save); check the data stats and the learning rate")
        goal_part = {"goal_state_loss": goal} if self.objective.goal_state_loss_weight else {}
        return {"loss": loss, "video_loss": video, "action_loss": action, **goal_part, "grad_norm": grad_norm, **record}

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Held-out episodes, fixed windows and fixed noise: comparable across steps. `val_loss` is the weighted
        total, `val_action_loss` / `val_video_loss` its unweighted parts (a policy overfits in its actions first)."""
        windows = self.data.val_windows
        count = min(self.cfg.trainer.val_samples, len(windows))
        stride = max(1, len(windows) // count)
        val_set = self.data.samples("val", self.cfg)
        samples = [val_set[i * stride] for i in range(count)]
        self.model.eval()
        rows = []
        chunk = self.cfg.trainer.samples_per_step
        for start in range(0, count, chunk):
            batch = samples[start : start + chunk]
            generators = [sample_generator(self.cfg.job.seed, VALIDATION_OFFSET + start + j) for j in range(len(batch))]
            losses = self.objective(batch, generators)
            row = {"val_loss": float(losses.total), "val_video_loss": float(losses.video), "val_action_loss": float(losses.action)}
            rows.append(row if losses.goal_state is None else {**row, "val_goal_state_loss": float(losses.goal_state)})
        self.model.train()
        return {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}

    def summary(self) -> dict:
        metrics = self.local_dir / "metrics.jsonl"
        records = [r for r in read_metrics(metrics) if "loss" in r] if metrics.exists() else []
        window = min(50, max(1, len(records) // 4))
        first = [r["loss"] for r in records[:window]]
        last = [r["loss"] for r in records[-window:]]
        return {
            "run_dir": str(self.run_dir),
            "step": self.step,
            "latest_checkpoint": str(ckpt.latest_checkpoint(self.checkpoints_dir)),
            "metrics": str(metrics),
            "tensorboard": str(self.local_dir / "tensorboard"),
            "loss_window": window,
            "first_loss_mean": sum(first) / len(first) if first else float("nan"),
            "last_loss_mean": sum(last) / len(last) if last else float("nan"),
        }


def _as_recorded(saved, field: str):
    """A value from an earlier launch's resolved_config.json. Runs started before variables were
    expanded at load recorded `${VAR}` as written: compare what it expands to now."""
    if isinstance(saved, str) and "${" in saved:
        try:
            return expand_env(saved, field)
        except ConfigError:
            return saved
    return saved


class _NoBar:
    def update(self, n):
        pass

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="train", dynamic_ncols=True)


def loss_parts(losses) -> torch.Tensor:
    """[total, video, action, goal_state] of one micro-batch's StepLosses (goal_state 0 when the run has no goal head)."""
    goal = losses.goal_state if losses.goal_state is not None else torch.zeros_like(losses.action)
    return torch.stack([losses.total.detach(), losses.video, losses.action, goal])
