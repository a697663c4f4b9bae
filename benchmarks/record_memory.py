"""Peak memory of `wamkit sim record` against the number of episodes recorded.

    python benchmarks/record_memory.py --episodes 50 [--resolution 64] [--steps 60]

Records `--episodes` episodes through `wamkit.sim.record.record` (rollout, the LeRobot writer, H.264 encode,
parquet) into a temporary directory and prints the process's peak resident memory (ru_maxrss). The env is
a stand-in registered for the run (`bench/noise`: `--steps` steps of random uint8 frames, a constant
expert that always succeeds), so the number measures the recorder and the writer, not MuJoCo. Run it once
per episode count, each in a fresh process: peak RSS never goes down within one.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from wamkit.sim import envs  # noqa: E402
from wamkit.sim.record import record  # noqa: E402

try:
    from wamkit.sim.base import SimEnv, StepResult  # noqa: E402
except ImportError:  # before the env base types had their own module
    from wamkit.sim.envs import SimEnv, StepResult  # noqa: E402


class NoiseEnv(SimEnv):
    def __init__(self, spec, resolution=64, camera=None, max_episode_steps=None):
        self.spec, self.resolution = spec, resolution
        self.max_episode_steps = max_episode_steps or spec.max_episode_steps
        self.rng, self.t = np.random.default_rng(0), 0

    def _obs(self):
        image = self.rng.integers(0, 256, (self.resolution, self.resolution, 3), dtype=np.uint8)
        return {"image": image, "state": np.full(4, self.t, np.float32), "prompt": self.spec.task}

    def reset(self, seed):
        self.rng, self.t = np.random.default_rng(seed), 0
        return self._obs()

    def step(self, action):
        self.t += 1
        done = self.t >= self.max_episode_steps
        return StepResult(self._obs(), done, done, {})

    def expert_action(self):
        return np.zeros(4, np.float32)

    def close(self):
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, required=True)
    p.add_argument("--resolution", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    base = envs.get_spec("metaworld/reach-v3")
    envs.REGISTRY["bench/noise"] = replace(base, name="bench/noise", max_episode_steps=args.steps, factory=NoiseEnv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary = record("bench/noise", args.episodes, Path(tmp) / "out", resolution=args.resolution,
                         post_success_steps=0)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    raw_mib = summary.total_frames * args.resolution ** 2 * 3 / 2**20
    print(f"episodes {summary.kept}, frames {summary.total_frames} ({raw_mib:.0f} MiB of raw frames), "
          f"peak RSS {peak_mib:.0f} MiB, {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
