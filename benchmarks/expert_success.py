"""Scripted-expert success rate of each registered simulator task (no dataset written).

    python benchmarks/expert_success.py [--episodes 5] [--seed 0] [--resolution 64]

Rolls out each env's expert exactly as `wamkit sim record` does (same episode seeds, same step
budget, rendering included so the timing is the recording cost) and prints success rate, mean
episode length and wall time per task.
"""

from __future__ import annotations

import argparse
import time

import wamkit.sim  # noqa: F401 - sets MUJOCO_GL before mujoco is imported
from wamkit.eval import wilson_interval
from wamkit.sim import env_names, make_env
from wamkit.sim.record import episode_seed, rollout_expert


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resolution", type=int, default=64)
    p.add_argument("--envs", nargs="*", default=env_names())
    args = p.parse_args()
    print(f"{'env':28s} {'success':>9s} {'95% CI':>13s} {'mean len':>9s} {'steps/s':>8s} {'wall s':>7s}")
    for name in args.envs:
        t0 = time.perf_counter()
        ok, lengths = 0, []
        with make_env(name, resolution=args.resolution) as env:
            for i in range(args.episodes):
                ep, success = rollout_expert(env, episode_seed(args.seed, i), env.max_episode_steps)
                ok += success
                lengths.append(len(ep.states))
        wall = time.perf_counter() - t0
        lo, hi = wilson_interval(ok, args.episodes)
        print(f"{name:28s} {ok:>4d}/{args.episodes:<4d} {lo:>6.2f}-{hi:<6.2f} {sum(lengths) / len(lengths):>9.1f} "
              f"{sum(lengths) / wall:>8.1f} {wall:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
