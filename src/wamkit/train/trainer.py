"""The training loop, top to bottom: set up, resume if this run name has a checkpoint, step, log,
validate, save. Every source of randomness in a step is derived from (seed, step), and the data
position from the step count, so a resumed run reproduces the uninterrupted one exactly."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
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
from wamkit.train.ema import EMA
from wamkit.train.faults import KILL_AFTER_SAVE, maybe_kill
from wamkit.train.metrics import MetricsLogger, read_metrics
from wamkit.train.optim import build_optimizer
from wamkit.train.context_parallel import context_parallel_backend, enable_context_parallel
from wamkit.train.parallel import all_reduce_mean, build_mesh, compute_precision, init_distributed, parallel_dims, parallelize
from wamkit.config.schedule import build_schedule
from wamkit.train.setup import (build_model, build_run_data, build_tokenizers, builds_on_meta, check_placement, check_vocab,
                                load_base_weights, materialize_run_model)
from wamkit.train.step_timer import StepTimer
from wamkit.train.stream import SampleOrder, batch_stream
from wamkit.train.throughput import Throughput, seconds_since_launch
from wamkit.train.tracking import check_wandb, start_wandb


# Knobs that may change when a run name is relaunched: how long, how often, how loud, and how the
# ranks are arranged. A run relaunched on fewer nodes after one died sets the replicate degree to the
# nodes it has and may raise grad_accum_iter to keep its global batch (the data position and the
# noise are keyed by global sample position, so the steps are the same); the DCP checkpoint
# reshards (docs/cluster.md).
RESUMABLE_KNOBS = {
    "trainer.max_iter", "trainer.log_every", "trainer.val_every", "trainer.val_samples", "trainer.progress_bar",
    "checkpoint.save_iter", "checkpoint.keep_last", "data.num_workers",
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

    def __init__(self, cfg, device: str = "auto"):
        self.cfg = cfg
        self.ctx = init_distributed(device)
        if self.ctx.is_main:
            check_wandb(cfg)  # a missing package or login fails now, not after the model is built
        self.device = self.ctx.device
        self.run_dir = cfg.job.run_dir()  # a Path, or a UPath in an object store (wamkit.storage)
        self.local_dir = cfg.job.local_dir()  # metrics.jsonl, TensorBoard, W&B: local, uploaded with each checkpoint
        self.checkpoints_dir = self.run_dir / "checkpoints"
        torch.manual_seed(cfg.job.seed)
        t0 = time.perf_counter()
        self.data = build_run_data(cfg)
        self.video_tokenizer, self.text_tokenizer = build_tokenizers(cfg, self.device)
        if cfg.model.compile_vae and not cfg.data.latent_cache and self.device.type == "cuda" and hasattr(self.video_tokenizer, "compile_encoder"):
            self.video_tokenizer.compile_encoder()
        # On a GPU the transformer is built on the meta device and materialised shard by shard on the
        # GPU after sharding (wamkit.model.materialize): no host init of billions of parameters.
        self.materialize = builds_on_meta(cfg, self.device)
        self.model = build_model(cfg, self.video_tokenizer.latent_channels, "meta" if self.materialize else self.device)
        check_vocab(self.model, self.text_tokenizer)
        self.latest = ckpt.find_latest(self.checkpoints_dir, self.ctx)
        self.init_note = "" if self.materialize else self._load_base_if_fresh()
        self.parameter_counts = prepare_trainable(self.model, cfg)  # LoRA after base weights, before optimizer/EMA/resume
        self.dims = dims = parallel_dims(cfg, self.ctx.world_size)
        self.dp_rank, self.dp_size = dims.dp_rank(self.ctx.rank), dims.dp_size  # a cp group shares its samples
        self.mesh = build_mesh(dims, self.device) if self.ctx.distributed else None
        self.model = parallelize(self.model, self.mesh, cfg)
        if self.materialize:
            note = materialize_run_model(self.model, cfg, self.device, load_base=self.latest is None)
            self.init_note = "" if self.latest is not None else note
        check_placement(self.device, self.model, self.video_tokenizer)
        self.build_seconds = time.perf_counter() - t0
        backend = attention_backend(cfg.model.attention, self.device, cfg.parallel.param_dtype)
        backend = context_parallel_backend(cfg.model.attention, backend, dims.cp)
        self.objective = PolicyObjective(
            self.model, self.video_tokenizer, self.text_tokenizer, cfg.diffusion, cfg.data.prompt_template, self.data.dataset.fps,
            backend, mode=cfg.model.mode, mode_weights=cfg.model.mode_weights, text_multiple=training_text_multiple(cfg.parallel.compile, backend),
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

    def compute_precision(self):
        """parallel.param_dtype compute (wamkit.train.parallel.compute_precision): wrap forward and backward."""
        return compute_precision(self.cfg, self.mesh, [self.model])

    @property
    def global_micro_batch(self) -> int:
        return self.cfg.trainer.samples_per_step * self.dp_size

    # ---- state -------------------------------------------------------------------------------
    def state(self) -> dict:
        state = {
            "model": self.model.state_dict(),
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
        ckpt.load_checkpoint(latest, state)
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
        metadata = {"data_contract": self.data.contract, "world_size": self.ctx.world_size}
        path = ckpt.save_checkpoint(self.checkpoints_dir, self.step, self.state(), metadata, self.ctx)
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
        stream = batch_stream(
            self.data.samples("train", self.cfg), self.order, self.consumed, cfg.samples_per_step,
            self.cfg.data.num_workers, self.dp_rank, self.dp_size,
        )
        bar = _progress(cfg.max_iter, self.step, cfg.progress_bar and main)
        self.model.train()
        throughput = Throughput(self.device, self.parallel_degree)
        if main and self.device.type == "cuda":
            print(f"[wamkit] device {self.device} ({torch.cuda.get_device_name(self.device)}); model built in {self.build_seconds:.1f} s", flush=True)
        try:
            while self.step < cfg.max_iter:
                t0 = time.perf_counter()
                record = self.train_step(stream)
                self.step += 1
                record.update(throughput.measure(record, time.perf_counter() - t0, cfg.samples_per_step * cfg.grad_accum_iter / self.dims.cp))
                if self.step == 1 and main:
                    print(f"[wamkit] first step done {seconds_since_launch():.1f} s after launch "
                          f"({record['step_s']:.1f} s in the step itself)", flush=True)
                if main and (self.step % cfg.log_every == 0 or self.step == cfg.max_iter):
                    logger.log({"step": self.step, **record})
                if cfg.val_every and self.step % cfg.val_every == 0 and self.data.val_windows is not None:
                    val_loss = self.validate()
                    if main:
                        logger.log({"step": self.step, "val_loss": val_loss})
                if self.step % self.cfg.checkpoint.save_iter == 0 or self.step == cfg.max_iter:
                    self.save()
                    self._publish_logs(logger)
                    maybe_kill(KILL_AFTER_SAVE, self.step)
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}", sps=f"{record['samples_per_s']:.1f}",
                                **({"mfu": f"{record['mfu']:.3f}"} if "mfu" in record else {}))
        finally:
            bar.close()
            if logger is not None:
                logger.close()
        return self.summary()

    def _publish_logs(self, logger) -> None:
        """A run in an object store gets its metrics.jsonl and TensorBoard files beside each
        checkpoint (rank 0), so a resume on another machine continues the logs."""
        if logger is not None and is_remote(self.run_dir):
            logger.flush()
            upload(self.local_dir, self.run_dir, ("metrics.jsonl", "tensorboard"))

    def train_step(self, stream) -> dict:
        cfg = self.cfg.trainer
        timer = self.objective.timer = self.timer
        timer.start()
        self.optimizer.zero_grad(set_to_none=True)
        totals = {"loss": 0.0, "video_loss": 0.0, "action_loss": 0.0}
        data_wait, flops, tokens = 0.0, 0.0, 0  # data_wait: seconds blocked on the loader, near 0 unless decoding limits the step
        for _ in range(cfg.grad_accum_iter):
            t0 = time.perf_counter()
            samples = next(stream)
            data_wait += time.perf_counter() - t0
            timer.mark("data")
            first = self.consumed + self.dp_rank * cfg.samples_per_step
            generators = [sample_generator(self.cfg.job.seed, first + j) for j in range(len(samples))]
            with self.compute_precision():
                losses = self.objective(samples, generators)
                (losses.total / cfg.grad_accum_iter).backward()
            timer.mark("forward_backward")
            # this rank's useful work: under context parallelism it computes 1/cp of each sequence
            flops, tokens = flops + self.objective.last_flops / self.dims.cp, tokens + self.objective.last_tokens // self.dims.cp
            self.consumed += self.global_micro_batch
            totals["loss"] += losses.total.item() / cfg.grad_accum_iter
            totals["video_loss"] += losses.video / cfg.grad_accum_iter
            totals["action_loss"] += losses.action / cfg.grad_accum_iter
        totals = {k: all_reduce_mean(v, self.ctx) for k, v in totals.items()}
        if not math.isfinite(totals["loss"]):
            raise FloatingPointError(f"loss is {totals['loss']} at step {self.step}; check the data stats and learning rate")
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:  # a head unused this step (no noisy action rows / video frames: forward / inverse dynamics)
            if p.grad is None:  # gets a zero gradient, so every trainable parameter has optimizer state and resume stays exact
                p.grad = torch.zeros_like(p)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.optimizer.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.scheduler.step()
        timer.mark("optimizer")
        if self.ema is not None:
            self.ema.update(self.model, self.step)
            timer.mark("ema")
        record = {**totals, "grad_norm": grad_norm.item(), "lr": self.optimizer.param_groups[0]["lr"], "data_wait_s": data_wait}
        timer.mark("other")
        return {**record, "flops": flops, "tokens": tokens, **{f"time_{k}_s": v for k, v in timer.read().items()}}

    @torch.no_grad()
    def validate(self) -> float:
        """Held-out episodes, fixed windows and fixed noise: comparable across steps."""
        windows = self.data.val_windows
        count = min(self.cfg.trainer.val_samples, len(windows))
        stride = max(1, len(windows) // count)
        val_set = self.data.samples("val", self.cfg)
        samples = [val_set[i * stride] for i in range(count)]
        self.model.eval()
        losses = []
        chunk = self.cfg.trainer.samples_per_step
        for start in range(0, count, chunk):
            batch = samples[start : start + chunk]
            generators = [sample_generator(self.cfg.job.seed, VALIDATION_OFFSET + start + j) for j in range(len(batch))]
            with self.compute_precision():
                losses.append(self.objective(batch, generators).total.item())
        self.model.train()
        return sum(losses) / len(losses)

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
