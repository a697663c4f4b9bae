"""Keep-ranges filter, success/ + failure/ MultiDataset, episode-shuffle order, token-budget packing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wamkit.data import (EpisodeShuffleOrder, KeepRanges, LeRobotV3Dataset, MultiDataset, WindowDataset, open_lerobot,
                         pack_by_token_budget)
from wamkit.data.selection import NoWindowsKept
from wamkit.errors import DataError

T = 4


def write_ranges(tmp_path, ranges):
    path = tmp_path / "keep.json"
    path.write_text(json.dumps(ranges))
    return KeepRanges.load(path)


def test_keep_ranges_rule(demo_ds, tmp_path):
    keep = write_ranges(tmp_path, {"1": [[3, 12]], "2": [[0, 6], [20, 30]]})
    wd = WindowDataset(demo_ds, demo_ds.episode_indices, T, keep_ranges=keep)
    got = {}
    for ep, s in wd.index.tolist():
        got.setdefault(ep, []).append(s)
    assert sorted(got) == [1, 2]  # absent episodes are dropped
    assert got[1] == list(range(3, 12 - T))  # start in [start, end - chunk)
    assert got[2] == [0, 1] + list(range(20, min(30 - T, demo_ds.episode_length(2) - T)))


def test_keep_ranges_errors(demo_ds, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        KeepRanges.load(tmp_path / "missing.json")
    with pytest.raises(DataError, match="two integers"):
        write_ranges(tmp_path, {"1": [[0]]})
    with pytest.raises(NoWindowsKept, match="keeps no window"):
        WindowDataset(demo_ds, demo_ds.episode_indices, T, keep_ranges=write_ranges(tmp_path, {"x": [[0, 50]]}))


def test_trajectory_key_field(demo_copy, tmp_path):
    for path in (demo_copy / "meta" / "episodes").glob("*/*.parquet"):
        table = pq.read_table(path)
        eps = table.column("episode_index").to_pylist()
        pq.write_table(table.append_column("recording", pa.array([f"rec-{e}" for e in eps])), path)
    ds = LeRobotV3Dataset(demo_copy)
    first = 5
    keep = write_ranges(tmp_path, {f"rec-{first}": [[0, 10]]})
    wd = WindowDataset(ds, ds.episode_indices, T, keep_ranges=keep, trajectory_key_field="recording")
    assert set(wd.index[:, 0].tolist()) == {first} and wd.index[:, 1].tolist() == list(range(0, 10 - T))
    with pytest.raises(DataError, match="trajectory_key_field"):
        WindowDataset(ds, ds.episode_indices, T, keep_ranges=keep, trajectory_key_field="nope")


@pytest.fixture(scope="module")
def droid_root(demo_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("droid")
    shutil.copytree(demo_root, root / "success")
    shutil.copytree(demo_root, root / "failure")
    return root


def test_multi_dataset_success_only_and_with_failures(droid_root, demo_ds):
    only = open_lerobot(droid_root)
    assert isinstance(only, MultiDataset) and len(only.episode_indices) == len(demo_ds.episode_indices)
    both = open_lerobot(droid_root, include_failures=True)
    n = len(demo_ds.episode_indices)
    assert len(both.episode_indices) == 2 * n and both.source(n) == "failure/0" and both.source(0) == "success/0"
    assert both.stats is both.parts[0].stats  # stats from success/
    wd = WindowDataset(both, both.episode_indices, T)
    single = WindowDataset(demo_ds, demo_ds.episode_indices, T)
    assert len(wd) == 2 * len(single)
    a, b = wd[len(single) + 3], single[3]  # failure/ copy of the same window
    assert np.array_equal(a.action.numpy(), b.action.numpy()) and np.array_equal(a.video.numpy(), b.video.numpy())
    keep = KeepRanges({"failure/0": [[0, 8]]})
    assert WindowDataset(both, both.episode_indices, T, keep_ranges=keep).index.tolist() == \
        [[n, s] for s in range(0, 8 - T)]


def test_multi_dataset_frame_cache_covers_every_part_or_none(droid_root, demo_ds):
    both = open_lerobot(droid_root, include_failures=True)
    need_mb = both.decoded_video_bytes() / 2**20
    assert both.decoded_video_bytes() == 2 * demo_ds.decoded_video_bytes()
    assert not both.enable_frame_cache(need_mb * 0.9) and all(part._decoded is None for part in both.parts)
    assert both.enable_frame_cache(need_mb * 1.01) and all(part._decoded is not None for part in both.parts)
    single = WindowDataset(demo_ds, demo_ds.episode_indices, T)
    cached = WindowDataset(both, both.episode_indices, T)[len(single) + 3]  # failure/ copy of the same window
    assert np.array_equal(cached.video.numpy(), single[3].video.numpy())


def test_multi_dataset_errors(droid_root, demo_root, tmp_path):
    with pytest.raises(DataError, match="include_failures"):
        open_lerobot(demo_root, include_failures=True)
    shutil.copytree(droid_root / "success", tmp_path / "success")
    with pytest.raises(DataError, match="no failure/"):
        open_lerobot(tmp_path, include_failures=True)


def test_episode_shuffle_order(demo_ds):
    wd = WindowDataset(demo_ds, demo_ds.episode_indices, T)
    order = EpisodeShuffleOrder.from_windows(wd, seed=5)
    n = len(wd)
    epoch0 = [order.index(p) for p in range(n)]
    assert sorted(epoch0) == list(range(n))
    eps = [int(wd.index[i, 0]) for i in epoch0]
    runs = [e for k, e in enumerate(eps) if k == 0 or e != eps[k - 1]]
    assert len(runs) == len(set(eps))  # each episode read in one contiguous run
    for i, j in zip(epoch0, epoch0[1:]):
        if wd.index[i, 0] == wd.index[j, 0]:
            assert wd.index[j, 1] > wd.index[i, 1]  # windows in order inside an episode
    epoch1 = [order.index(p) for p in range(n, 2 * n)]
    assert epoch1 != epoch0 and sorted(epoch1) == list(range(n))
    # resume: a fresh order at position p continues exactly
    full = [order.index(p) for p in range(3 * n)]
    for p in (0, 7, n - 1, n + 5, 2 * n + 3):
        fresh = EpisodeShuffleOrder.from_windows(wd, seed=5)
        assert [fresh.index(q) for q in range(p, 3 * n)] == full[p:]


@pytest.mark.parametrize("counts,budget,groups", [
    ([3, 3, 3], 6, [[0, 1], [2]]),
    ([5, 1, 4, 2, 2], 6, [[0, 1], [2, 3], [4]]),
    ([6, 6], 6, [[0], [1]]),
    ([], 4, []),
    ([0, 4, 0], 4, [[0, 1, 2]]),
])
def test_pack_by_token_budget(counts, budget, groups):
    assert pack_by_token_budget(counts, budget) == groups


def test_pack_by_token_budget_errors():
    with pytest.raises(DataError, match=r"token_counts\[1\].*more than the budget"):
        pack_by_token_budget([2, 9, 1], 8)
    with pytest.raises(DataError, match="max_tokens"):
        pack_by_token_budget([1], 0)
