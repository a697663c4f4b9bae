"""Episode-level train/val split."""

from __future__ import annotations

import pytest

from wamkit.data import split_episodes
from wamkit.errors import DataError


def test_split_by_episode_deterministic():
    eps = list(range(100, 140))
    train, val = split_episodes(eps, 0.2, seed=7)
    assert len(val) == 8 and len(train) == 32
    assert sorted(train + val) == eps and not set(train) & set(val)
    assert train == sorted(train) and val == sorted(val)
    assert (train, val) == split_episodes(list(reversed(eps)), 0.2, seed=7)
    others = {tuple(split_episodes(eps, 0.2, seed=s)[1]) for s in range(8)}
    assert len(others) > 1, "different seeds must give different splits"


def test_small_and_edge_cases():
    assert split_episodes([3, 9], 0.1, seed=0)[1] in ([3], [9])  # at least one val episode
    assert split_episodes([3, 9, 11], 0.0, seed=0) == ([3, 9, 11], [])
    assert split_episodes([5], 0.5, seed=0) == ([5], [])
    train, val = split_episodes(range(4), 0.9, seed=0)
    assert len(train) == 1 and len(val) == 3  # never an empty train set


def test_bad_inputs():
    with pytest.raises(DataError, match="data.val_fraction"):
        split_episodes([1, 2, 3], 1.0, seed=0)
    with pytest.raises(DataError, match="duplicates"):
        split_episodes([1, 1, 2], 0.5, seed=0)
