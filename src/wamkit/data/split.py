"""Train/validation split by episode.

Windows of one episode overlap heavily, so splitting windows would leak validation frames into
training; we permute whole episodes with a seeded generator instead.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from wamkit.errors import DataError


def split_episodes(episode_indices: Sequence[int], val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) sorted episode lists; val has round(n*val_fraction) episodes, >= 1 if fraction > 0 and n >= 2."""
    episodes = sorted(int(e) for e in episode_indices)
    if len(set(episodes)) != len(episodes):
        raise DataError("split_episodes: episode_indices", "contains duplicates", "pass each episode once")
    if not 0.0 <= val_fraction < 1.0:
        raise DataError("data.val_fraction", f"is {val_fraction}, must be in [0, 1)", "use e.g. 0.1")
    n = len(episodes)
    n_val = int(round(n * val_fraction))
    if val_fraction > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)  # keep at least one training episode
    elif n < 2:
        n_val = 0
    order = np.random.default_rng(seed).permutation(n)
    val = sorted(episodes[i] for i in order[:n_val])
    train = sorted(episodes[i] for i in order[n_val:])
    return train, val
