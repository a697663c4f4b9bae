"""Diagnostic (issue 26): how far a plain MLP gets on a sim recording from the state alone, in the same env and
with the same chunking as `wamkit eval sim`. With `benchmarks/privileged_state.patch` applied (the Meta-World state
then holds the puck's and the goal's true positions) it separates what the task and the harness allow from what
wamkit's policy reaches: the thirty-first session's MLP solved push 49/50 where the wamkit policy, told the same,
solved 5-7/50 (benchmarks/RESULTS.md). Prints the MLP's open-loop error (first `--execute` actions of each chunk
against the recorded ones, raw units, every `--execute` steps) and its closed-loop success.

    git worktree add /tmp/priv HEAD && git -C /tmp/priv apply benchmarks/privileged_state.patch && cd /tmp/priv
    PYTHONPATH=src wamkit sim record metaworld/push-v3 --episodes 50 --out /tmp/tb/pu50_priv --seed 0 --resolution 64 --camera corner@2x
    PYTHONPATH=src python benchmarks/privileged_mlp.py /tmp/tb/pu50_priv metaworld/push-v3 --steps 1000 --batch 16
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from wamkit.data import LeRobotV3Dataset
from wamkit.sim.envs import make_env


def episode_rows(ds: LeRobotV3Dataset, ep: int) -> tuple[np.ndarray, np.ndarray]:
    """One episode's states [n, S] and actions [n, A] (no video decoded)."""
    cols, n = ds.episode_columns(ep, ["observation.state", "action"]), ds.episode_length(ep)
    return cols["observation.state"].reshape(n, -1), cols["action"].reshape(n, -1)


def chunk_pairs(ds: LeRobotV3Dataset, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(state at t, the next `chunk` actions flattened) for every step of every episode; the last action repeats."""
    states, targets = [], []
    for ep in ds.episode_indices:
        s, a = episode_rows(ds, ep)
        n = len(a)
        for t in range(n):
            states.append(s[t])
            targets.append(a[np.minimum(np.arange(t, t + chunk), n - 1)].reshape(-1))
    return torch.tensor(np.array(states), dtype=torch.float32), torch.tensor(np.array(targets), dtype=torch.float32)


def train_mlp(x: torch.Tensor, y: torch.Tensor, steps: int, batch: int, seed: int) -> torch.nn.Module:
    """Two hidden layers of 512, inputs standardised, L1 on the whole chunk, AdamW 1e-3."""
    torch.manual_seed(seed)
    mean, std = x.mean(0), x.std(0) + 1e-6
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                              torch.nn.ReLU(), torch.nn.Linear(512, y.shape[1]))
    opt = torch.optim.AdamW(net.parameters(), 1e-3)
    for _ in range(steps):
        rows = torch.randint(0, len(x), (batch,))
        loss = (net((x[rows] - mean) / std) - y[rows]).abs().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.nn.Sequential(_Standardise(mean, std), net).eval()


class _Standardise(torch.nn.Module):
    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


@torch.no_grad()
def open_loop_error(net, ds: LeRobotV3Dataset, episodes: list[int], chunk: int, execute: int) -> np.ndarray:
    """Mean |first `execute` predicted - recorded actions| per action dimension."""
    errors = []
    for ep in episodes:
        s, a = episode_rows(ds, ep)
        for t in range(0, len(a) - execute, execute):
            pred = net(torch.tensor(s[t], dtype=torch.float32)).reshape(chunk, -1).numpy()
            errors.append(np.abs(pred[:execute] - a[t:t + execute]).mean(0))
    return np.mean(errors, 0)


@torch.no_grad()
def closed_loop(net, env_name: str, seeds: list[int], chunk: int, execute: int, camera: str) -> int:
    """Successes over `seeds`, `execute` actions of each chunk, then a new chunk (as `eval sim --horizon`)."""
    env, wins = make_env(env_name, camera=camera), 0
    for seed in seeds:
        obs, done, success = env.reset(seed), False, False
        while not done:
            actions = net(torch.tensor(obs["state"], dtype=torch.float32)).reshape(chunk, -1).clamp(-1, 1).numpy()
            for action in actions[:execute]:
                step = env.step(action)
                obs, success = step.obs, success or step.success
                if step.done:
                    done = True
                    break
        wins += success
    return wins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="a `wamkit sim record` dataset")
    ap.add_argument("env", help="its sim env, e.g. metaworld/push-v3")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--execute", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--camera", default="corner@2x")
    ap.add_argument("--eval-seeds", default="1000:20,2000:30", help="start:count,... (the testbed's)")
    args = ap.parse_args()
    ds = LeRobotV3Dataset(args.data)
    net = train_mlp(*chunk_pairs(ds, args.chunk), args.steps, args.batch, args.seed)
    err = open_loop_error(net, ds, ds.episode_indices[::5][:8], args.chunk, args.execute)
    print(f"open loop, mean |err| per action dim: {[round(float(v), 3) for v in err]} (all {err.mean():.3f})")
    for part in args.eval_seeds.split(","):
        start, count = (int(v) for v in part.split(":"))
        wins = closed_loop(net, args.env, list(range(start, start + count)), args.chunk, args.execute, args.camera)
        print(f"{args.env} seeds {start}+{count}: success {wins}/{count}")


if __name__ == "__main__":
    main()
