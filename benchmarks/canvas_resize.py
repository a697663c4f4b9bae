"""Canvas composition cost per window in a worker (one thread): wamkit's uint8 resize against the same
composition through float interpolation (`resize_through_float`, the previous path), with the largest
pixel difference.

    python benchmarks/canvas_resize.py [--frames 33] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import wamkit.data.canvas as canvas  # noqa: E402

CASES = [("concat_view", 480, 3), ("side_by_side", 480, 2), ("side_by_side", 256, 2)]  # layout, tier, 480x640 cameras


def best_of(repeats: int, fn) -> tuple[float, torch.Tensor]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=33)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print("| layout | tier | cameras | canvas | float path ms | wamkit ms | speed-up | max diff |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for layout, tier, n in CASES:
        views = [torch.randint(0, 256, (args.frames, 480, 640, 3), generator=gen, dtype=torch.uint8) for _ in range(n)]
        ours, a = best_of(args.repeats, lambda: canvas.compose_frames(views, layout, tier))
        kept, canvas._resize = canvas._resize, canvas.resize_through_float
        try:
            ref, b = best_of(args.repeats, lambda: canvas.compose_frames(views, layout, tier))
        finally:
            canvas._resize = kept
        diff = int((a.int() - b.int()).abs().max())
        print(f"| {layout} | {tier} | {n} x 480x640 | {a.shape[1]}x{a.shape[2]} | {ref * 1e3:.0f} | {ours * 1e3:.0f} | "
              f"{ref / ours:.1f}x | {diff} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
