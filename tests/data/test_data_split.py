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


def test_per_task_split_holds_out_each_tasks_share():
    """`data.val_split = "per_task"`: every task keeps round(n_task * fraction) validation episodes (at least one),
    where one random draw over all episodes can leave a task out entirely."""
    eps = list(range(60))
    tasks = ["reach"] * 25 + ["push"] * 25 + ["drawer"] * 10
    train, val = split_episodes(eps, 0.1, seed=3, groups=tasks)
    assert sorted(train + val) == eps and not set(train) & set(val) and val == sorted(val)
    by_task = {t: [e for e in val if tasks[e] == t] for t in set(tasks)}
    assert {t: len(v) for t, v in by_task.items()} == {"reach": 2, "push": 2, "drawer": 1}
    assert (train, val) == split_episodes(eps, 0.1, seed=3, groups=tasks)  # seeded ...
    assert len({tuple(split_episodes(eps, 0.1, seed=s, groups=tasks)[1]) for s in range(6)}) > 1  # ... by the seed
    # a random split of the same size misses a task for some seed; the per-task split never does
    misses = [s for s in range(40) if len({tasks[e] for e in split_episodes(eps, 0.05, seed=s)[1]}) < 3]
    assert misses and all(len({tasks[e] for e in split_episodes(eps, 0.05, seed=s, groups=tasks)[1]}) == 3 for s in misses)
    with pytest.raises(DataError, match="groups"):
        split_episodes(eps, 0.1, seed=0, groups=tasks[:-1])


def test_a_run_validates_every_task_with_the_per_task_split():
    from tests.helpers import DEMO_RECIPE
    from wamkit.config import load_experiment
    from wamkit.errors import ConfigError
    from wamkit.train.datasets import build_run_data

    cfg = load_experiment(DEMO_RECIPE, ['data.val_split="per_task"', "data.val_fraction=0.05"])
    run = build_run_data(cfg)  # the bundled 4-task demo recording, 16 episodes a task: one of each held out
    val = run.contract["val_episodes"]
    assert len(val) == 4 and {run.dataset.episode_task(e) for e in val} == set(run.dataset.tasks.values())
    with pytest.raises(ConfigError, match="data.val_split"):
        load_experiment(DEMO_RECIPE, ['data.val_split="stratified"'])
