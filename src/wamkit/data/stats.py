"""Normalization statistics of a LeRobot v3.0 dataset, computed by streaming over its data parquets.

Two passes over the files, in record batches, so memory stays O(channels) whatever the dataset size:
pass 1 gives count/min/max/mean/std (Chan's parallel merge in float64), pass 2 a per-channel histogram
of ``HIST_BINS`` bins over [min, max] from which q01/q99 are interpolated. Quantiles are therefore
exact to within (max - min) / HIST_BINS of numpy's linear-interpolation quantile.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wamkit.data.lerobot_v3 import column_to_numpy, load_info
from wamkit.errors import DataError

HIST_BINS = 1 << 16
QUANTILES = {"q01": 0.01, "q99": 0.99}
_BATCH_ROWS = 65536


def data_files(root: Path) -> list[Path]:
    files = sorted((root / "data").glob("**/*.parquet"))
    if not files:
        raise DataError(str(root / "data"), "no data parquet files", "point at a LeRobot v3.0 dataset root")
    return files


def default_stat_keys(info: dict) -> list[str]:
    """Numeric non-video features except the bookkeeping columns (what LeRobot normalizes)."""
    skip = {"timestamp", "frame_index", "episode_index", "index", "task_index"}
    return [k for k, f in info["features"].items()
            if k not in skip and f.get("dtype") not in ("video", "image", "string")]


def _batches(files: Sequence[Path], keys: Sequence[str]) -> Iterator[tuple[Path, dict[str, np.ndarray]]]:
    for path in files:
        try:
            pf = pq.ParquetFile(path)
            missing = [k for k in keys if k not in pf.schema_arrow.names]
            if missing:
                raise DataError(str(path), f"columns {missing} are missing (have {pf.schema_arrow.names})",
                                "choose existing feature keys")
            for batch in pf.iter_batches(batch_size=_BATCH_ROWS, columns=list(keys)):
                table = pa.Table.from_batches([batch])
                cols = {}
                for key in keys:
                    x = np.asarray(column_to_numpy(table, key, str(path)), dtype=np.float64)
                    x = x.reshape(len(x), -1)
                    bad = np.argwhere(~np.isfinite(x))
                    if bad.size:
                        r, c = (int(v) for v in bad[0])
                        raise DataError(f"{path}[{key!r}]", f"{len(bad)} NaN/inf values (first at batch row {r}, "
                                        f"channel {c})", "drop or repair those rows before computing stats")
                    cols[key] = x
                yield path, cols
        except (pa.ArrowException, OSError) as exc:
            raise DataError(str(path), f"cannot read parquet: {exc}", "re-export the dataset") from exc


def compute_dataset_stats(path: str | Path, keys: Sequence[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Per-channel min/max/mean/std/q01/q99/count of each key's parquet column over the whole dataset.

    `keys` None or empty -> every numeric non-bookkeeping feature of info.json. Raises DataError on a
    missing column, NaN/inf values, ragged widths or an empty dataset."""
    root = Path(path)
    files = data_files(root)
    if not keys:
        keys = default_stat_keys(load_info(root))
    keys = list(keys)
    acc: dict[str, dict[str, np.ndarray]] = {}
    for file, cols in _batches(files, keys):
        for key, x in cols.items():
            n, mean = len(x), x.mean(0)
            m2 = ((x - mean) ** 2).sum(0)
            a = acc.get(key)
            if a is None:
                acc[key] = {"n": n, "mean": mean, "m2": m2, "min": x.min(0), "max": x.max(0)}
                continue
            if a["mean"].shape != mean.shape:
                raise DataError(f"{file}[{key!r}]", f"has {mean.shape[0]} channels, earlier files "
                                f"{a['mean'].shape[0]}", "store every row of a feature with the same width")
            total = a["n"] + n
            delta = mean - a["mean"]
            a["m2"] = a["m2"] + m2 + delta ** 2 * a["n"] * n / total
            a["mean"] = a["mean"] + delta * n / total
            a["n"] = total
            a["min"], a["max"] = np.minimum(a["min"], x.min(0)), np.maximum(a["max"], x.max(0))
    missing = [k for k in keys if k not in acc or acc[k]["n"] == 0]
    if missing:
        raise DataError(str(root / "data"), f"no rows for {missing}", "compute stats on a non-empty dataset")
    # pass 2: histograms over [min, max] for the quantiles
    hists = {k: np.zeros((acc[k]["min"].shape[0], HIST_BINS), np.int64) for k in keys}
    for _, cols in _batches(files, keys):
        for key, x in cols.items():
            lo, width = acc[key]["min"], acc[key]["max"] - acc[key]["min"]
            scaled = np.where(width > 0, (x - lo) / np.where(width > 0, width, 1.0), 0.0)
            bins = np.clip((scaled * HIST_BINS).astype(np.int64), 0, HIST_BINS - 1)
            for c in range(x.shape[1]):
                hists[key][c] += np.bincount(bins[:, c], minlength=HIST_BINS)
    out = {}
    for key in keys:
        a = acc[key]
        stats = {"min": a["min"], "max": a["max"], "mean": a["mean"], "std": np.sqrt(a["m2"] / a["n"])}
        for name, q in QUANTILES.items():
            stats[name] = _hist_quantile(hists[key], a["min"], a["max"], a["n"], q)
        stats["count"] = np.asarray([a["n"]])
        out[key] = stats
    return out


def _hist_quantile(hist: np.ndarray, lo: np.ndarray, hi: np.ndarray, n: int, q: float) -> np.ndarray:
    """numpy-style (linear) quantile from per-channel histograms: the order statistics k = floor(q*(n-1))
    and k+1 are placed at their bins' centres, then interpolated like numpy does."""
    rank = q * (n - 1)
    k = int(math.floor(rank))
    frac = rank - k
    out = np.empty(hist.shape[0])
    cum = np.cumsum(hist, axis=1)
    for c in range(hist.shape[0]):
        if hi[c] <= lo[c]:
            out[c] = lo[c]
            continue
        width = (hi[c] - lo[c]) / HIST_BINS

        def order_stat(j: int) -> float:
            b = min(int(np.searchsorted(cum[c], j, side="right")), HIST_BINS - 1)
            return float(np.clip(lo[c] + (b + 0.5) * width, lo[c], hi[c]))

        a = order_stat(k)
        b = order_stat(min(k + 1, n - 1))
        out[c] = a + frac * (b - a)
    return out


def stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    return {k: {f: np.asarray(v).tolist() for f, v in s.items()} for k, s in stats.items()}


def write_stats(path: str | Path, keys: Sequence[str] | None = None, overwrite: bool = False) -> Path:
    """Compute stats and write meta/stats.json atomically (temp file + os.replace).

    Refuses to replace an existing stats.json unless `overwrite`. Returns the written path."""
    root = Path(path)
    target = root / "meta" / "stats.json"
    if target.exists() and not overwrite:
        raise DataError(str(target), "already exists", "pass overwrite=True (CLI: --overwrite) to replace it")
    if not target.parent.is_dir():
        raise DataError(str(target.parent), "meta/ directory is missing", "point at a LeRobot v3.0 dataset root")
    stats = compute_dataset_stats(root, keys)
    tmp = target.parent / f".stats.json.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(stats_to_json(stats), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


def stats_main(path: str, keys: list[str], overwrite: bool) -> int:
    """CLI entry: write meta/stats.json; print what was written or the error. 0 on success, 1 on error."""
    try:
        target = write_stats(path, keys or None, overwrite)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    written = json.loads(target.read_text())
    for key, s in written.items():
        print(f"{key}: {len(s['mean'])} channels over {s['count'][0]} rows")
    print(f"wrote {target}")
    return 0
