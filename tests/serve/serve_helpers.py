"""Helpers shared by the serve tests (a uniquely named module: `conftest` is ambiguous across test dirs)."""

import numpy as np

from tests.helpers import train_tiny_run  # noqa: F401  (the serve fixtures train through it)

NUM_STEPS = 3
SEED = 17


def make_obs(seed: int = 0, prompt: str = "move to the green target") -> dict:
    rng = np.random.default_rng(seed)
    return {"observation/image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            "observation/state": rng.uniform(0.2, 0.8, 4), "prompt": prompt}


def as_policy_obs(request: dict) -> dict:
    return {"image": request["observation/image"], "state": request["observation/state"], "prompt": request["prompt"]}
