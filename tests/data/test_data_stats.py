"""Dataset statistics: streaming computation matches numpy, atomic write, no silent overwrite."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from wamkit.data import LeRobotV3Dataset
from wamkit.data.stats import HIST_BINS, compute_dataset_stats, stats_main, write_stats
from wamkit.errors import DataError

KEYS = ["action", "observation.state"]


def _all_rows(root, key):
    ds = LeRobotV3Dataset(root)
    return np.concatenate([ds.episode_columns(e, [key])[key] for e in ds.episode_indices]).astype(np.float64)


def test_matches_numpy(demo_root):
    stats = compute_dataset_stats(demo_root, KEYS)
    for key in KEYS:
        x = _all_rows(demo_root, key)
        s = stats[key]
        np.testing.assert_array_equal(s["min"], x.min(0))
        np.testing.assert_array_equal(s["max"], x.max(0))
        np.testing.assert_allclose(s["mean"], x.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s["std"], x.std(0), rtol=1e-10, atol=1e-12)
        tol = (x.max(0) - x.min(0)) / HIST_BINS  # histogram quantiles: within one bin
        for name, q in (("q01", 0.01), ("q99", 0.99)):
            assert np.all(np.abs(s[name] - np.quantile(x, q, axis=0)) <= tol + 1e-12), name
        assert s["count"].tolist() == [len(x)]


def test_default_keys_are_numeric_features(demo_root):
    assert set(compute_dataset_stats(demo_root)) == set(KEYS)


def test_write_is_atomic_and_refuses_overwrite(demo_copy, monkeypatch):
    target = demo_copy / "meta" / "stats.json"
    before = target.read_text()
    with pytest.raises(DataError, match="already exists"):
        write_stats(demo_copy, KEYS)
    assert target.read_text() == before

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_stats(demo_copy, KEYS, overwrite=True)
    assert target.read_text() == before  # the old file is intact
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".stats")] == []  # temp cleaned
    monkeypatch.undo()

    target.unlink()
    assert write_stats(demo_copy, ["action"]) == target
    written = json.loads(target.read_text())
    assert set(written) == {"action"} and len(written["action"]["q99"]) == 3


def test_nan_and_missing_columns_are_errors(demo_copy):
    with pytest.raises(DataError, match="'nope'|nope"):
        compute_dataset_stats(demo_copy, ["nope"])
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = sorted((demo_copy / "data").glob("*/*.parquet"))[0]
    table = pq.read_table(path)
    cols = table.to_pydict()
    cols["action"][4] = [float("nan"), 0.0, 0.0]
    pq.write_table(pa.Table.from_pydict(cols, schema=table.schema), path)
    with pytest.raises(DataError, match="NaN"):
        compute_dataset_stats(demo_copy, ["action"])


def test_stats_main(demo_copy, capsys):
    assert stats_main(str(demo_copy), ["action"], overwrite=False) == 1
    assert "already exists" in capsys.readouterr().err
    assert stats_main(str(demo_copy), [], overwrite=True) == 0
    assert "wrote" in capsys.readouterr().out
