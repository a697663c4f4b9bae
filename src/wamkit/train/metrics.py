"""Metrics sinks: one JSON object per logged step in metrics.jsonl, mirrored to TensorBoard and,
when the recipe asks for it, to a W&B run (wamkit.train.tracking)."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLogger:
    def __init__(self, run_dir: Path, resume_step: int, wandb_run=None):
        self.wandb = wandb_run
        self.path = run_dir / "metrics.jsonl"
        _truncate_after(self.path, resume_step)  # a killed run may have logged past its last checkpoint
        self.file = open(self.path, "a")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        except ImportError:  # tensorboard is a declared dependency; keep metrics.jsonl regardless
            self.tb = None

    def log(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if "val_loss" in record:  # rare and the number a user watches for overfitting: on the console too
            from tqdm import tqdm

            parts = ", ".join(f"{name} {record[key]:.4f}" for name, key in (("action", "val_action_loss"), ("video", "val_video_loss"),
                                                                            ("goal state", "val_goal_state_loss"))
                              if key in record)
            tqdm.write(f"[wamkit] step {record['step']}: val_loss {record['val_loss']:.4f}" + (f" ({parts})" if parts else "")
                       + " (held-out episodes)")
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])
        if self.wandb is not None:
            from wamkit.train.tracking import log_wandb

            log_wandb(self.wandb, record)

    def flush(self) -> None:
        """Everything logged so far on disk (before the files are uploaded beside a checkpoint)."""
        self.file.flush()
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _truncate_after(path: Path, step: int) -> None:
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in kept))


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
