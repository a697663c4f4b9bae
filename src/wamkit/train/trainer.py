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

from wamkit.config import config_to_dict, format_config
from wamkit.diffusion.objective import PolicyObjective
from wamkit.errors import CheckpointError
from wamkit.train import checkpoint as ckpt
from wamkit.train.ema import EMA
from wamkit.train.faults import KILL_AFTER_SAVE, maybe_kill
from wamkit.train.metrics import MetricsLogger, read_metrics
from wamkit.train.optim import build_optimizer
from wamkit.train.schedule import build_schedule
from wamkit.train.setup import build_model, build_run_data, build_tokenizers, check_vocab, load_base_weights
from wamkit.train.stream import SampleOrder, batch_stream


# Knobs that may change when a run name is relaunched: how long, how often, how loud.
RESUMABLE_KNOBS = {
    "trainer.max_iter", "trainer.log_every", "trainer.val_every", "trainer.val_samples", "trainer.progress_bar",
    "checkpoint.save_iter", "checkpoint.keep_last", "data.num_workers",
}


def attention_backend(choice: str, device: torch.device) -> str:
    if choice == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    return choice


def step_generator(seed: int, step: int, micro: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 64 + micro)


class Trainer:
    def __init__(self, cfg, device: str = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.run_dir = cfg.job.run_dir()
        self.checkpoints_dir = self.run_dir / "checkpoints"
        torch.manual_seed(cfg.job.seed)
        self.data = build_run_data(cfg)
        self.video_tokenizer, self.text_tokenizer = build_tokenizers(cfg)
        self.model = build_model(cfg, self.video_tokenizer.latent_channels, self.device)
        check_vocab(self.model, self.text_tokenizer)
        self.objective = PolicyObjective(
            self.model, self.video_tokenizer, self.text_tokenizer, cfg.diffusion, cfg.data.prompt_template, self.data.dataset.fps,
            attention_backend(cfg.model.attention, self.device),
        )
        self.optimizer = build_optimizer(self.model, cfg.optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, build_schedule(cfg.scheduler, cfg.trainer.max_iter))
        self.ema = EMA(self.model, cfg.ema.beta, cfg.ema.warmup) if cfg.ema.enabled else None
        self.order = SampleOrder(len(self.data.train_windows), cfg.job.seed)
        self.step = 0

    # ---- state -------------------------------------------------------------------------------
    def state(self) -> dict:
        state = {
            "model": self.model.state_dict(),
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "trainer": {"step": self.step, "consumed_samples": self.consumed_samples()},
            "rng": {"torch": torch.get_rng_state()},
        }
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def consumed_samples(self) -> int:
        return self.step * self.cfg.trainer.samples_per_step * self.cfg.trainer.grad_accum_iter

    def resume_or_init(self) -> str:
        ckpt.remove_stale_temporaries(self.checkpoints_dir)
        latest = ckpt.latest_checkpoint(self.checkpoints_dir)
        if latest is None:
            if self.cfg.checkpoint.load_path:
                kind = load_base_weights(self.model, self.cfg)
                if self.ema is not None:  # the average starts from the loaded weights
                    self.ema = EMA(self.model, self.cfg.ema.beta, self.cfg.ema.warmup)
                return f"fresh run from base weights ({kind}) {self.cfg.checkpoint.load_path}"
            return "fresh run from random initialisation"
        self._check_same_recipe(latest)
        state = self.state()
        ckpt.load_checkpoint(latest, state)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        torch.set_rng_state(state["rng"]["torch"])
        self.step = int(state["trainer"]["step"])
        return f"resumed {latest} at step {self.step}"

    def _check_same_recipe(self, latest: Path) -> None:
        """Resuming under a changed recipe would silently mix two experiments; only run-length and
        logging knobs may change between launches of one run name."""
        saved = self.run_dir / "resolved_config.json"
        if not saved.exists():
            return
        before, now = json.loads(saved.read_text()), config_to_dict(self.cfg)
        changed = [
            f"{section}.{key}" for section, values in now.items() for key, value in values.items()
            if f"{section}.{key}" not in RESUMABLE_KNOBS and before.get(section, {}).get(key) != value
        ]
        if changed:
            raise CheckpointError(
                str(saved), f"run '{self.cfg.job.name}' was started with a different recipe (changed: {', '.join(changed)})",
                "use a new job.name for a new experiment, or restore the recipe/overrides it was started with",
            )

    def save(self) -> Path:
        path = ckpt.save_checkpoint(self.checkpoints_dir, self.step, self.state(), {"data_contract": self.data.contract})
        ckpt.prune_checkpoints(self.checkpoints_dir, self.cfg.checkpoint.keep_last)
        return path

    # ---- loop --------------------------------------------------------------------------------
    def train(self) -> dict:
        cfg = self.cfg.trainer
        self.run_dir.mkdir(parents=True, exist_ok=True)
        how = self.resume_or_init()
        (self.run_dir / "config.toml").write_text(format_config(self.cfg))
        (self.run_dir / "resolved_config.json").write_text(json.dumps(config_to_dict(self.cfg), indent=2))
        (self.run_dir / "data_contract.json").write_text(json.dumps(self.data.contract, indent=2))
        print(f"[wamkit] run dir: {self.run_dir}\n[wamkit] {how}", flush=True)
        if self.step >= cfg.max_iter:
            print(f"[wamkit] run already at max_iter={cfg.max_iter}; nothing to do")
            return self.summary()
        logger = MetricsLogger(self.run_dir, self.step)
        stream = batch_stream(self.data.train_windows, self.data.transform, self.order, self.consumed_samples(), cfg.samples_per_step, self.cfg.data.num_workers)
        bar = _progress(cfg.max_iter, self.step, cfg.progress_bar)
        self.model.train()
        try:
            while self.step < cfg.max_iter:
                t0 = time.perf_counter()
                record = self.train_step(stream)
                self.step += 1
                record["samples_per_s"] = cfg.samples_per_step * cfg.grad_accum_iter / (time.perf_counter() - t0)
                if self.step % cfg.log_every == 0 or self.step == cfg.max_iter:
                    logger.log({"step": self.step, **record})
                if cfg.val_every and self.step % cfg.val_every == 0 and self.data.val_windows is not None:
                    logger.log({"step": self.step, "val_loss": self.validate()})
                if self.step % self.cfg.checkpoint.save_iter == 0 or self.step == cfg.max_iter:
                    self.save()
                    maybe_kill(KILL_AFTER_SAVE, self.step)
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}", sps=f"{record['samples_per_s']:.1f}")
        finally:
            bar.close()
            logger.close()
        return self.summary()

    def train_step(self, stream) -> dict:
        cfg = self.cfg.trainer
        self.optimizer.zero_grad(set_to_none=True)
        totals = {"loss": 0.0, "video_loss": 0.0, "action_loss": 0.0}
        for micro in range(cfg.grad_accum_iter):
            samples = next(stream)
            losses = self.objective(samples, step_generator(self.cfg.job.seed, self.step, micro))
            (losses.total / cfg.grad_accum_iter).backward()
            totals["loss"] += losses.total.item() / cfg.grad_accum_iter
            totals["video_loss"] += losses.video / cfg.grad_accum_iter
            totals["action_loss"] += losses.action / cfg.grad_accum_iter
        if not math.isfinite(totals["loss"]):
            raise FloatingPointError(f"loss is {totals['loss']} at step {self.step}; check the data stats and learning rate")
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.optimizer.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model, self.step)
        return {**totals, "grad_norm": grad_norm.item(), "lr": self.optimizer.param_groups[0]["lr"]}

    @torch.no_grad()
    def validate(self) -> float:
        """Held-out episodes, fixed windows and fixed noise: comparable across steps."""
        windows = self.data.val_windows
        count = min(self.cfg.trainer.val_samples, len(windows))
        stride = max(1, len(windows) // count)
        samples = [self.data.transform(windows[i * stride]) for i in range(count)]
        self.model.eval()
        losses = []
        chunk = self.cfg.trainer.samples_per_step
        for start in range(0, count, chunk):
            losses.append(self.objective(samples[start : start + chunk], step_generator(self.cfg.job.seed, -1, start)).total.item())
        self.model.train()
        return sum(losses) / len(losses)

    def summary(self) -> dict:
        records = [r for r in read_metrics(self.run_dir / "metrics.jsonl") if "loss" in r] if (self.run_dir / "metrics.jsonl").exists() else []
        window = min(50, max(1, len(records) // 4))
        first = [r["loss"] for r in records[:window]]
        last = [r["loss"] for r in records[-window:]]
        return {
            "run_dir": str(self.run_dir),
            "step": self.step,
            "latest_checkpoint": str(ckpt.latest_checkpoint(self.checkpoints_dir)),
            "metrics": str(self.run_dir / "metrics.jsonl"),
            "tensorboard": str(self.run_dir / "tensorboard"),
            "loss_window": window,
            "first_loss_mean": sum(first) / len(first) if first else float("nan"),
            "last_loss_mean": sum(last) / len(last) if last else float("nan"),
        }


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
