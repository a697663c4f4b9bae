"""Closed-loop evaluation of many episodes at once: the envs step in W simulator processes
(`wamkit.sim.workers`), the policy stays in this process and answers every live episode's observation
in one batched `predict` per round. Serial evaluation of MT10's 500 episodes is ~25 minutes of one core
plus one GPU request per chunk; here physics and rendering spread over the cores and the GPU sees
batches of W observations.

Same protocol as `sim_eval.evaluate` in sync mode: episode i of a task resets with
`episode_seed(seed, i)`, `execute_horizon` actions are executed per chunk, an episode ends on success
or its step budget. What differs: the sampling noise of a round is seeded by (seed, round) for the whole
batch, so a stochastic policy's samples are not those of a serial run. Videos (the first `num_videos`
successes and failures of each task, as the serial evaluator picks them) are rendered afterwards by
replaying those episodes' executed actions in a worker: in the loop only the states the policy plans
from are rendered (rendering every step costs ~10x the physics at 64 px on a CPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from wamkit.eval.cameras import policy_cameras, policy_observation
from wamkit.eval.sim_eval import (EpisodeResult, EvalError, EvalResult, check_request, frame_size, rollout_video_name,
                                   summarize, trace_agreement)
from wamkit.sim.base import higher_reward


@dataclass
class _Live:
    """An episode in a worker: where it is and what it has done so far."""

    spec: object
    index: int
    seed: int
    obs: dict | None = None
    budget: int = 0
    length: int = 0
    replans: int = 0
    success: bool = False
    best_reward: float | None = None
    executed: list = field(default_factory=list)  # the actions taken (replayed for videos) ...
    expert: list = field(default_factory=list)  # ... and, with expert_trace, the scripted expert's in the same states


def pool_settings(policy, specs, resolution: int, max_episode_steps: int | None):
    from wamkit.sim.control_rate import control_repeat
    from wamkit.sim.workers import EnvSettings

    repeats = {control_repeat(s.fps, policy.fps) or 1 for s in specs}
    if len(repeats) > 1:
        raise EvalError("evaluate_batched", f"the envs run at different rates {sorted({s.fps for s in specs})}",
                        "evaluate envs of one control rate together")
    return EnvSettings(resolution=resolution, camera=policy_cameras(policy), max_episode_steps=max_episode_steps,
                       action_repeat=repeats.pop())


def evaluate_batched(policy, env_names: Sequence[str], episodes: int, seed: int = 1, *, workers: int = 8,
                     execute_horizon: int | None = None, resolution: int | None = None,
                     max_episode_steps: int | None = None, num_steps: int | None = None, pool=None,
                     verbose: bool = False, expert_trace: bool = False, video_dirs: dict | None = None,
                     num_videos: int = 1, pad_batches: bool | None = None) -> list[EvalResult]:
    """`episodes` episodes in each env (the same seeds in each), one EvalResult per env in env order.
    `pool`: an open `EnvWorkers` built with the same settings, reused across calls (checkpoints).
    `video_dirs`: env name -> directory for that task's rollout videos (none without).
    `pad_batches` (default: when the policy replays CUDA graphs): every predict gets a batch of the pool's
    size, the live observations padded with copies of the first (their chunks dropped). A graphed policy
    captures one graph per batch shape (150-900 ms each on an H100); as episodes end, a loop's batches
    take every size below the pool's (the forty-sixth session's final loop: 26 captures in 91 s)."""
    from wamkit.sim.envs import get_spec
    from wamkit.sim.record import episode_seed
    from wamkit.sim.workers import EnvWorkers

    t0 = time.perf_counter()
    specs = [get_spec(n) for n in env_names]
    horizon = max(check_request(policy, s, episodes, execute_horizon) for s in specs)
    settings = pool_settings(policy, specs, frame_size(policy, resolution), max_episode_steps)
    if pool is not None and pool.settings != settings:
        raise EvalError("evaluate_batched: pool", f"was built with {pool.settings}, this evaluation needs {settings}",
                        "open one pool per frame size / step budget")
    queue = [_Live(s, i, episode_seed(seed, i)) for s in specs for i in range(episodes)]
    steps = int(num_steps or policy.num_steps)
    own = pool is None
    pool = pool or EnvWorkers(min(workers, len(queue)), settings)
    done: dict[str, list[EpisodeResult]] = {s.name: [] for s in specs}
    traces: dict[str, dict[int, tuple]] = {s.name: {} for s in specs}  # (executed, expert) by episode index
    timing = Timing(padded_to=len(pool) if (_replays_graphs(policy) if pad_batches is None else pad_batches) else 0)
    captures = _graph_captures(policy)
    try:
        _run(policy, pool, queue, done, horizon, steps, seed, verbose, timing, traces, expert_trace)
        if video_dirs and num_videos > 0:
            write_videos(pool, done, traces, video_dirs, num_videos)
    finally:
        if own:
            pool.close()
    seconds = time.perf_counter() - t0
    timing.graph_captures = _graph_captures(policy) - captures
    print(f"[wamkit eval] {timing.line(seconds)}", flush=True)
    results = []
    for s in specs:
        episodes = sorted(done[s.name], key=lambda e: e.index)
        agreement = trace_agreement(s, [traces[s.name][e.index] for e in episodes], episodes) if expert_trace else None
        results.append(summarize(policy, s, episodes, horizon=horizon, budget=settings.max_episode_steps or s.max_episode_steps,
                                 resolution=settings.resolution, seed=seed, num_steps=steps, seconds=seconds,
                                 timing=timing.to_json(seconds), expert_agreement=agreement))
    return results


@dataclass
class Timing:
    """Where a batched evaluation's wall time went: the policy's batched predicts (GPU) by batch size,
    the simulator processes' resets and chunks, and the CUDA graphs the policy captured meanwhile (one
    per new packed layout: many means the batches' layouts keep changing)."""

    env_s: float = 0.0
    graph_captures: int = 0
    padded_to: int = 0  # every predict's batch padded to this size (0: the live episodes' count)
    by_batch: dict = field(default_factory=dict)  # batch size -> [predicts, seconds]: latency- or compute-bound

    def add_predict(self, batch: int, seconds: float) -> None:
        entry = self.by_batch.setdefault(batch, [0, 0.0])
        entry[0], entry[1] = entry[0] + 1, entry[1] + seconds

    @property
    def rounds(self) -> int:
        return sum(n for n, _ in self.by_batch.values())

    @property
    def policy_s(self) -> float:
        return sum(sec for _, sec in self.by_batch.values())

    @property
    def mean_batch(self) -> float:
        return sum(b * n for b, (n, _) in self.by_batch.items()) / max(self.rounds, 1)

    def ms_by_batch(self) -> dict[int, float]:
        return {b: 1e3 * sec / n for b, (n, sec) in sorted(self.by_batch.items())}

    def to_json(self, seconds: float) -> dict:
        return {"policy_s": round(self.policy_s, 3), "env_s": round(self.env_s, 3), "other_s": round(seconds - self.policy_s - self.env_s, 3),
                "rounds": self.rounds, "mean_batch": round(self.mean_batch, 2), "graph_captures": self.graph_captures,
                "padded_to": self.padded_to,
                "ms_per_predict_by_batch": {str(b): round(ms, 1) for b, ms in self.ms_by_batch().items()}}

    def line(self, seconds: float) -> str:
        return (f"{seconds:.1f} s: policy {self.policy_s:.1f} s over {self.rounds} batched predicts "
                f"({1e3 * self.policy_s / max(self.rounds, 1):.0f} ms each, mean batch {self.mean_batch:.1f}"
                + (f" padded to {self.padded_to}" if self.padded_to else "") + ", "
                f"{self.graph_captures} CUDA graph captures), simulators {self.env_s:.1f} s; ms per predict by batch size: "
                + ", ".join(f"{b}: {ms:.0f}" for b, ms in self.ms_by_batch().items()))


def _graph_captures(policy) -> int:
    return int(getattr(policy, "graph_captures", 0) or 0)  # 0 for policies without CUDA graphs (ACT, DP, the CPU)


def _replays_graphs(policy) -> bool:
    return bool(getattr(policy, "replays_cuda_graphs", False))  # False for ACT, DP and wamkit's policy off CUDA


def padded_batch(observations: list, size: int) -> list:
    """`observations` followed by copies of the first up to `size` (unchanged when size is 0 or no larger)."""
    return observations + observations[:1] * max(size - len(observations), 0)


def write_videos(pool, done: dict, traces: dict, video_dirs: dict, num_videos: int) -> None:
    """The first `num_videos` successes and failures of each task (by episode index) replayed in the workers
    and written as rollout_<i>_<outcome>.mp4 beside the task's report; a replay that does not end as the
    episode did (the simulation was not deterministic) is reported and not written: no video shows another
    episode than the one counted."""
    from wamkit.data.writer import encode_video

    chosen = []
    for name, directory in video_dirs.items():
        episodes = sorted(done.get(name, []), key=lambda e: e.index)
        for outcome in (True, False):
            chosen += [(name, Path(directory), e) for e in [e for e in episodes if e.success == outcome][:num_videos]]
    jobs = [(name, e.seed, traces[name][e.index][0]) for name, _, e in chosen]
    for (name, directory, episode), (frames, success, fps) in zip(chosen, pool.map_ordered("replay", jobs)):
        if bool(success) != episode.success:
            print(f"[wamkit eval] {name} episode {episode.index}: its replay ended in "
                  f"{'success' if success else 'failure'}, the episode in {'success' if episode.success else 'failure'}: "
                  "no video written (the simulation is not deterministic here)", flush=True)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        episode.video = rollout_video_name(episode.index, episode.success)
        encode_video(directory / episode.video, frames, int(round(fps)), "libx264")


def _run(policy, pool, queue: list[_Live], done: dict, horizon: int, steps: int, seed: int, verbose: bool, timing: Timing,
         traces: dict, expert_trace: bool = False) -> None:
    """Rounds of: start episodes on free workers, one batched predict, every live worker executes its chunk
    (and, with `expert_trace`, reports the expert's action in each state it acted in). Each finished
    episode's (executed actions, expert actions) land in `traces`."""
    live: dict[int, _Live] = {}
    while live or queue:
        t0 = time.perf_counter()
        started = [w for w in range(len(pool)) if w not in live][:len(queue)]  # fewer episodes left than free workers
        for w in started:
            live[w] = queue.pop(0)
            pool.send(w, "reset", live[w].spec.name, live[w].seed)
        for w in started:
            live[w].obs, live[w].budget = pool.receive(w)
        workers = sorted(live)
        t1 = time.perf_counter()
        observations = [policy_observation(live[w].obs, policy.camera_keys) for w in workers]
        chunks = policy.predict(padded_batch(observations, timing.padded_to), seed=seed * 1009 + timing.rounds,
                                num_steps=steps)[:len(observations)]
        t2 = time.perf_counter()
        for w, chunk in zip(workers, chunks):
            ep = live[w]
            ep.replans += 1
            pool.send(w, "act", ep.spec.name, chunk[:horizon], ep.budget - ep.length, expert_trace)
        for w, chunk in zip(workers, chunks):
            ep = live[w]
            ep.obs, taken, success, finished, asked, best = pool.receive(w)
            ep.executed += [np.asarray(a, np.float64) for a in chunk[:taken]]
            if expert_trace:
                ep.expert += [np.asarray(a, np.float64) for a in asked]
            ep.length, ep.success, ep.best_reward = ep.length + taken, ep.success or success, higher_reward(ep.best_reward, best)
            if finished:
                done[ep.spec.name].append(EpisodeResult(ep.index, ep.seed, ep.success, ep.length, ep.replans, ticks=ep.length,
                                                        best_reward=ep.best_reward))
                traces[ep.spec.name][ep.index] = (ep.executed, ep.expert)
                del live[w]
                if verbose:
                    print(f"[wamkit eval] {ep.spec.name} episode {ep.index}: {'success' if ep.success else 'failure'} "
                          f"in {ep.length} steps ({ep.replans} chunks)", flush=True)
        timing.add_predict(len(workers), t2 - t1)
        timing.env_s += (t1 - t0) + (time.perf_counter() - t2)
