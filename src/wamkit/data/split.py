"""Train/validation split by episode.

Windows of one episode overlap heavily, so splitting windows would leak validation frames into
training; we permute whole episodes with a seeded generator instead.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from wamkit.errors import DataError


def split_episodes(episode_indices: Sequence[int], val_fraction: float, seed: int,
                   groups: Sequence[str] | None = None) -> tuple[list[int], list[int]]:
    """(train, val) sorted episode lists; val has round(n*val_fraction) episodes, >= 1 if fraction > 0 and n >= 2.
    `groups` (one label per episode, e.g. its task): split each group so, every group keeps its share in val
    (`data.val_split = "per_task"`: a multi-task validation set, and the episodes a world-model judge imagines,
    then cover every task instead of whichever a random draw picked)."""
    if groups is not None:
        return _split_per_group(episode_indices, val_fraction, seed, groups)
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


def _split_per_group(episode_indices: Sequence[int], val_fraction: float, seed: int, groups: Sequence[str]):
    episodes = [int(e) for e in episode_indices]
    if len(groups) != len(episodes):
        raise DataError("split_episodes: groups", f"has {len(groups)} labels for {len(episodes)} episodes", "pass one label per episode")
    members: dict[str, list[int]] = {}
    for episode, group in zip(episodes, groups):
        members.setdefault(str(group), []).append(episode)
    train, val = [], []
    for i, group in enumerate(sorted(members)):  # the seed varies by group, so equal groups are not split alike
        t, v = split_episodes(members[group], val_fraction, seed * 1_000_003 + i)
        train += t
        val += v
    return sorted(train), sorted(val)
