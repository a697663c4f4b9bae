"""Samples/s of a recipe's training loader alone (DataLoader workers, frame pool, SampleTransform): whether
the data path can feed a step, without the step. Variants are --set overrides, one per --variant.

    python benchmarks/loader_throughput.py recipes/metaworld_mt10.toml --set data.path=data/mt10 \
        --variant "" --variant diffusion.future_video_stride=2 [--workers 2 --batch 64 --seconds 20]
"""

from __future__ import annotations

import argparse
import time

from wamkit.config.loader import load_experiment
from wamkit.train.datasets import build_run_data
from wamkit.train.stream import SampleOrder, batch_stream


def samples_per_second(recipe: str, overrides: list[str], workers: int, batch: int, seconds: float) -> tuple[float, tuple]:
    cfg = load_experiment(recipe, overrides)
    run_data = build_run_data(cfg)
    stream = batch_stream(run_data.samples("train", cfg), SampleOrder(len(run_data.train_windows), 0), 0, batch, workers)
    for _ in range(3):  # workers started, pools grown
        next(stream)
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        samples = next(stream)
        count += len(samples)
    return count / (time.perf_counter() - start), tuple(samples[0].video.shape)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="applies to every variant")
    p.add_argument("--variant", action="append", default=None, help="space-separated overrides of one variant")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args(argv)
    print(f"| variant | samples/s ({args.workers} workers, batch {args.batch}) | sample video |\n| --- | ---: | --- |")
    for variant in args.variant or [""]:
        rate, shape = samples_per_second(args.recipe, args.overrides + variant.split(), args.workers, args.batch, args.seconds)
        print(f"| {variant or 'as written'} | {rate:,.0f} | {list(shape)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
