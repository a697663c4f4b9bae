"""Helpers shared by the serve tests (a uniquely named module: `conftest` is ambiguous across test dirs)."""

from pathlib import Path

import numpy as np

from wamkit.config import load_experiment
from wamkit.data import write_demo_dataset
from wamkit.train.trainer import Trainer

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo_tiny.toml"
NUM_STEPS = 3
SEED = 17


def train_tiny_run(tmp: Path, name: str = "serve_run") -> Path:
    root = write_demo_dataset(tmp / "reach", num_episodes=8)
    overrides = {
        "job.name": f'"{name}"', "job.output_root": f'"{tmp}"', "data.path": f'"{root}"', "data.generate_demo": "false",
        "trainer.max_iter": "4", "checkpoint.save_iter": "4", "trainer.samples_per_step": "2",
        "trainer.progress_bar": "false", "trainer.val_every": "0", "scheduler.warm_up_steps": "[1]",
    }
    Trainer(load_experiment(RECIPE, [f"{k}={v}" for k, v in overrides.items()])).train()
    return tmp / name


def make_obs(seed: int = 0, prompt: str = "move to the green target") -> dict:
    rng = np.random.default_rng(seed)
    return {"observation/image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            "observation/state": rng.uniform(0.2, 0.8, 4), "prompt": prompt}


def as_policy_obs(request: dict) -> dict:
    return {"image": request["observation/image"], "state": request["observation/state"], "prompt": request["prompt"]}
