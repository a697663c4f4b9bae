"""Recording time and dataset size per task of a suite, measured on a few episodes and extrapolated.

    python benchmarks/record_cost.py [--suite metaworld/mt10] [--episodes 3] [--target 50] [--resolution 64]

Records `--episodes` expert attempts of every task with `wamkit.sim.record` (the code path of `wamkit sim
record`: rollout, rendering, H.264 encode, parquet) into a temporary directory, one dataset per task, and
prints per task the wall time, the process's CPU time (what wall time would be on an idle core; on a
shared machine wall time also counts waiting), kept episodes, frames and bytes on disk. The last rows scale each task's
per-attempt time and per-kept-episode size linearly to `--target` attempts per task: an extrapolation, not
a measurement of the full recording (H.264 compresses a 16-episode file somewhat better than a short one,
so the size is an upper estimate).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import wamkit.sim  # noqa: F401 - sets MUJOCO_GL before mujoco is imported
from wamkit.sim import expand_env_names, record


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="metaworld/mt10", help="a suite or comma-separated env names")
    p.add_argument("--episodes", type=int, default=3, help="attempts measured per task")
    p.add_argument("--target", type=int, default=50, help="attempts per task to extrapolate to")
    p.add_argument("--resolution", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print("| task | kept/attempted | frames | wall s | CPU s | bytes | wall s/attempt | KB/episode |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    total_s = total_cpu = total_b = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name in expand_env_names(args.suite):
            out = Path(tmp) / name.replace("/", "_")
            t0, c0 = time.perf_counter(), time.process_time()
            summary = record(name, args.episodes, out, seed=args.seed, resolution=args.resolution)
            seconds, cpu, size = time.perf_counter() - t0, time.process_time() - c0, tree_bytes(out)
            per_attempt, per_episode = seconds / args.episodes, size / summary.kept
            total_s += per_attempt * args.target
            total_cpu += cpu / args.episodes * args.target
            total_b += per_episode * args.target * summary.expert_success_rate
            print(f"| {name} | {summary.kept}/{summary.attempted} | {summary.total_frames} | {seconds:.1f} | {cpu:.1f} | {size} | "
                  f"{per_attempt:.2f} | {per_episode / 1024:.1f} |", flush=True)
    print(f"\nextrapolated to {args.target} attempts per task: {total_s / 60:.1f} min wall ({total_cpu / 60:.1f} min "
          f"of CPU) in one process, {total_b / 2**20:.1f} MiB on disk")
    print(f"record_minutes={total_s / 60:.1f} record_cpu_minutes={total_cpu / 60:.1f} record_mib={total_b / 2**20:.1f}")


if __name__ == "__main__":
    main()
