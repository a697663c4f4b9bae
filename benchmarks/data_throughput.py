"""Windows/s of wamkit's data path vs LeRobot's own LeRobotDataset on the same datasets.

    python benchmarks/data_throughput.py [--workers 2] [--num 48] [--chunk 8] [--tiers 256 480] [--repeats 3]
        [--resolution native|tier] [--layouts single multi]

For each tier and layout a synthetic dataset (2 cameras, AV1) is written with LeRobot's own writer
(lerobot-dataset==0.4.4, in the separate venv of tests/interop, built on first use): `single` puts the
episodes in one data parquet and one mp4 per camera; `multi` gives LeRobot's writer tiny file-size
limits and 2 files per chunk dir, so its size rotation spreads the episodes over several data/mp4
files and chunk dirs (`from_timestamp` offsets), as a long recording ends up. Then, with the same
number of DataLoader workers and random windows of chunk+1 frames per camera:

* wamkit: WindowDataset + SampleTransform (normalize, pad, side-by-side canvas) through a DataLoader;
  `--resolution tier` (the default) composes the canvas at the tier (`data.resolution`: resize into the
  tier's bucket, reflect-pad), `native` leaves the cameras side by side at their size;
* LeRobot: LeRobotDataset with equivalent delta_timestamps (state/cameras chunk+1, actions chunk),
  its default decoder (torchcodec), run inside the LeRobot venv. It returns the native frames (no
  resize), i.e. less work than wamkit at a tier.

The two readers run alternately `--repeats` times per tier (shared cores are noisy); the table shows
the median windows/s of each and the ratio of the medians, wamkit / LeRobot.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.interop import lerobot_venv  # noqa: E402
from wamkit.data import LeRobotV3Dataset, Normalizer, SampleTransform, WindowDataset  # noqa: E402
from wamkit.data.canvas import CanvasTransform  # noqa: E402
from wamkit.data.run_data import TransformedWindows  # noqa: E402

SIZES = {256: (256, 256), 480: (480, 640), 720: (720, 1280)}
# LeRobot writer flags per layout: one file per camera, or size-rotated files over chunk dirs of 2 files
LAYOUTS = {"single": ["--data-mb", "1", "--video-mb", "2"],
           "multi": ["--data-mb", "0.002", "--video-mb", "0.02", "--chunks-size", "2"]}


def bench_wamkit(root: Path, chunk: int, workers: int, num: int, warmup: int, tier: int) -> float:
    ds = LeRobotV3Dataset(root)
    windows = WindowDataset(ds, ds.episode_indices, chunk)
    transform = SampleTransform(Normalizer.from_stats(ds.stats, "action", "minmax"),
                                Normalizer.from_stats(ds.stats, "observation.state", "minmax"), 36, True, 0,
                                CanvasTransform(tier=tier))
    order = np.random.default_rng(0).permutation(len(windows))[: num + warmup].tolist()
    loader = torch.utils.data.DataLoader(TransformedWindows(windows, transform), batch_size=1, sampler=order,
                                         num_workers=workers, collate_fn=lambda b: b,
                                         prefetch_factor=2 if workers else None)
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    n = sum(1 for _ in it)
    return n / (time.perf_counter() - t0)


def file_counts(root: Path) -> str:
    """'data files / mp4 files / chunk dirs' of a written dataset, for the table."""
    data = sorted((root / "data").glob("*/*.parquet"))
    mp4 = sorted((root / "videos").glob("*/*/*.mp4"))
    return f"{len(data)} / {len(mp4)} / {len({p.parent.name for p in data})}"


def measure(root: Path, args, tier: int, label: str) -> tuple[float, float]:
    """Median windows/s of wamkit and of LeRobot over `args.repeats` alternating runs."""
    ours, theirs = [], []
    for _ in range(args.repeats):
        ours.append(bench_wamkit(root, args.chunk, args.workers, args.num, args.warmup, tier))
        out = lerobot_venv.run_writer("bench", str(root), "--chunk", str(args.chunk), "--workers",
                                      str(args.workers), "--num", str(args.num), "--warmup", str(args.warmup))
        theirs.append(json.loads(out.strip().splitlines()[-1])["windows_per_s"])
        print(f"{label} run {len(ours)}: wamkit {ours[-1]:.1f}, LeRobot {theirs[-1]:.1f} windows/s", flush=True)
    return float(np.median(ours)), float(np.median(theirs))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--num", type=int, default=48)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--chunk", type=int, default=8)
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--length", type=int, default=40)
    p.add_argument("--tiers", type=int, nargs="+", default=[256, 480])
    p.add_argument("--resolution", choices=["tier", "native"], default="tier",
                   help="wamkit's canvas: data.resolution = the tier (default), or native side by side")
    p.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=["single", "multi"])
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each reader per tier (median)")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="wamkit-bench-") as tmp:
        for tier in args.tiers:
            h, w = SIZES[tier]
            canvas_tier = tier if args.resolution == "tier" else 0
            for layout in args.layouts:
                root = Path(tmp) / f"ds{tier}_{layout}"
                lerobot_venv.run_writer("write", str(root), "--episodes", str(args.episodes), "--length",
                                        str(args.length), "--height", str(h), "--width", str(w), *LAYOUTS[layout])
                canvas = CanvasTransform(tier=canvas_tier).size([(h, w), (h, w)])
                ours, theirs = measure(root, args, canvas_tier, f"{tier}p {layout}")
                rows.append((tier, layout, file_counts(root), f"{h}x{w}", f"{canvas[0]}x{canvas[1]}", ours, theirs))
    print(f"\n{args.workers} workers, chunk {args.chunk} (chunk+1 frames x 2 cameras per window), {args.num} windows, AV1, "
          f"{args.episodes} episodes, wamkit canvas {args.resolution}, median of {args.repeats} alternating runs\n")
    print("| tier | layout | data / mp4 files / chunk dirs | camera | wamkit canvas | wamkit windows/s | "
          "LeRobot windows/s | wamkit / LeRobot |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for tier, layout, files, size, canvas, ours, theirs in rows:
        print(f"| {tier}p | {layout} | {files} | {size} | {canvas} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
