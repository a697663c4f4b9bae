"""Demo dataset writer: v3.0 layout, stats, determinism, atomicity."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from wamkit.data import compute_stats, write_demo_dataset
from wamkit.errors import DataError


def test_layout_and_info(demo_root, demo_truth):
    info = json.loads((demo_root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 10
    assert info["total_episodes"] == 8 and info["total_frames"] == sum(len(t.states) for t in demo_truth)
    assert info["features"]["observation.images.front"]["shape"] == [64, 64, 3]
    assert info["features"]["observation.images.front"]["dtype"] == "video"
    assert sorted(p.name for p in (demo_root / "data/chunk-000").iterdir()) == [f"file-00{i}.parquet" for i in range(3)]
    episodes = pq.read_table(demo_root / "meta/episodes/chunk-000/file-001.parquet").to_pylist()
    assert [e["episode_index"] for e in episodes] == [3, 4, 5]
    cam = "videos/observation.images.front"
    assert episodes[0][f"{cam}/from_timestamp"] == 0.0
    assert episodes[1][f"{cam}/from_timestamp"] == episodes[0][f"{cam}/to_timestamp"] == len(demo_truth[3].states) / 10
    assert episodes[1]["dataset_from_index"] == sum(len(t.states) for t in demo_truth[:4])
    data = pq.read_table(demo_root / "data/chunk-000/file-001.parquet")
    assert data.column("index").to_pylist()[0] == episodes[0]["dataset_from_index"]


def test_stats_match_data(demo_root, demo_truth):
    stats = json.loads((demo_root / "meta/stats.json").read_text())
    actions = np.concatenate([t.actions for t in demo_truth])
    np.testing.assert_allclose(stats["action"]["min"], actions.min(0), rtol=1e-6)
    np.testing.assert_allclose(stats["action"]["q99"], np.quantile(actions.astype(np.float64), 0.99, axis=0))
    assert stats["action"]["count"] == [len(actions)]
    for key in ("action", "observation.state"):
        assert set(stats[key]) == {"min", "max", "mean", "std", "q01", "q99", "count"}
        assert np.all(np.array(stats[key]["q99"]) > np.array(stats[key]["q01"]))
        assert np.all(np.array(stats[key]["std"]) > 0)


def test_expert_reaches_and_grips(demo_truth):
    for t in demo_truth:
        assert 40 <= len(t.states) <= 60
        target = t.green if t.task_index == 0 else t.blue
        assert np.hypot(*(t.states[-1, :2] - target)) < 0.08  # reached the right target
        assert t.actions[-1, 2] == 1.0 and t.actions[0, 2] == 0.0  # gripper closes on arrival


def test_compute_stats():
    s = compute_stats({"x": np.array([[0.0, 1.0], [2.0, 3.0]]), "y": np.arange(5.0)})
    np.testing.assert_allclose(s["x"]["mean"], [1.0, 2.0])
    np.testing.assert_allclose(s["y"]["max"], [4.0])
    with pytest.raises(DataError, match="no rows"):
        compute_stats({"z": np.zeros((0, 2))})


def test_deterministic(tmp_path, demo_root):
    again = write_demo_dataset(tmp_path / "again", num_episodes=8, episodes_per_file=3, seed=3)
    for rel in ("data/chunk-000/file-002.parquet", "meta/episodes/chunk-000/file-000.parquet"):
        assert pq.read_table(again / rel).equals(pq.read_table(demo_root / rel))
    assert (again / "meta/stats.json").read_text() == (demo_root / "meta/stats.json").read_text()


def test_failure_leaves_nothing(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    from wamkit.data import writer

    monkeypatch.setattr(writer, "compute_stats", boom)  # fails after data and video files are written
    with pytest.raises(RuntimeError, match="disk full"):
        write_demo_dataset(tmp_path / "demo", num_episodes=2)
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite(tmp_path):
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "keep.txt").write_text("x")
    with pytest.raises(DataError, match="already exists"):
        write_demo_dataset(tmp_path / "demo", num_episodes=2)
    with pytest.raises(DataError, match="'mpeg2' is not supported"):
        write_demo_dataset(tmp_path / "other", num_episodes=2, codec="mpeg2")
