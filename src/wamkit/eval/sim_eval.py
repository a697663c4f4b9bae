"""Closed-loop evaluation of a `wamkit.policy.Policy` in a registered simulator.

Every `execute_horizon` env steps the policy is asked for a new chunk from the current raw
observation (image, state, task text); the first `execute_horizon` actions of the chunk are executed
open-loop, then it re-plans. An episode ends on the env's success flag or when the step budget is
spent. With `inference_delay` D each chunk takes D control ticks to arrive and `mode` says what
the robot does meanwhile (wamkit.eval.realtime: sync, naive async, real-time chunking). Episode i is
reset with `wamkit.sim.record.episode_seed(seed, i)`: evaluate with a seed other
than the one the training data was recorded with to get unseen object/goal placements.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from wamkit.errors import WamkitError
from wamkit.eval.cameras import policy_cameras
from wamkit.eval.realtime import MODES, check_schedule, run_episode


class EvalError(WamkitError):
    """An evaluation cannot run as asked (bad policy/env pairing, bad arguments)."""


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (well-behaved at 0/n and n/n)."""
    if n <= 0:
        raise EvalError("wilson_interval", f"n = {n}", "evaluate at least one episode")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # exact at the ends: rounding leaves centre - half at 0/n a hair above 0 (and a plot's error bar negative)
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


@dataclass
class EpisodeResult:
    index: int
    seed: int
    success: bool
    length: int
    replans: int
    video: str | None = None
    ticks: int | None = None  # control ticks, pauses for inference included
    seam_jerk: float | None = None  # mean |a_first_new - a_last_old|^2 over the episode's chunk seams
    best_reward: float | None = None  # the sim's highest dense reward in the episode (StepResult.reward), None without one


@dataclass
class EvalResult:
    env_name: str
    task: str
    episodes: int
    successes: int
    success_rate: float
    ci95: tuple[float, float]
    mean_episode_length: float
    mean_success_length: float | None
    execute_horizon: int
    chunk_length: int
    max_episode_steps: int
    resolution: int
    seed: int
    num_steps: int
    policy_source: dict
    training_step: int | None
    seconds: float
    per_episode: list[EpisodeResult] = field(default_factory=list)
    out_dir: str | None = None
    mode: str = "sync"
    inference_delay: int = 0
    seam_jerk: float | None = None  # mean squared action change at chunk seams, over all seams
    step_jerk: float | None = None  # the same over every pair of consecutive actions (the baseline)
    seams: int = 0
    timing: dict | None = None  # batched evaluation only: policy / simulator seconds (wamkit.eval.batched.Timing)
    noise_scale: float = 1.0  # the sampler's starting noise scale (wamkit.policy.load_policy)
    expert_agreement: dict | None = None  # --expert-trace: the policy's actions against the expert's (eval.expert_agreement)
    # the episodes' mean best dense reward and its standard error (EpisodeResult.best_reward; Meta-World: 0-10): how
    # close failures came, so policies of equal success (or variants at few episodes) still separate; None without one
    mean_best_reward: float | None = None
    best_reward_se: float | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["ci95"] = list(self.ci95)
        return d


def load_policy(*args, **kwargs):
    """wamkit.policy.load_policy, imported when first needed: this closed loop also runs other frameworks'
    policies (LeRobot's ACT and DP in benchmarks/policy_quality.py) on hosts without diffusers, on which
    wamkit's own policy builds."""
    from wamkit.policy.policy import load_policy as load

    return load(*args, **kwargs)


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _training_resolution(policy) -> int | None:
    """The square camera frame size the policy was trained on, from its data contract's `camera_sizes`
    (the one record of it: the training dataset may be gone or changed since); None when the contract
    predates camera sizes or the frames are not square."""
    sizes = policy.contract.get("camera_sizes")
    if not sizes:
        return None
    h, w = (int(v) for v in sizes[0])
    return h if h == w else None


def _check_pairing(policy, spec) -> None:
    if policy.action_dim != spec.action_dim:
        raise EvalError("evaluate", f"the policy outputs {policy.action_dim}-D actions, {spec.name} takes "
                        f"{spec.action_dim}-D {list(spec.action_names)}", "evaluate on the env its data was recorded in")
    if policy.use_state and policy.state_dim != spec.state_dim:
        raise EvalError("evaluate", f"the policy expects {policy.state_dim}-D state, {spec.name} gives "
                        f"{spec.state_dim}-D {list(spec.state_names)}", "evaluate on the env its data was recorded in")


def check_request(policy, spec, episodes: int, execute_horizon: int | None) -> int:
    """Refuse a policy/env pairing or an episode count that cannot run; the re-planning horizon."""
    _check_pairing(policy, spec)
    if episodes < 1:
        raise EvalError("evaluate: episodes", f"is {episodes}", "evaluate at least one episode")
    horizon = int(execute_horizon or policy.chunk_length)
    if not 1 <= horizon <= policy.chunk_length:
        raise EvalError("evaluate: execute_horizon", f"{horizon} is outside [1, {policy.chunk_length}] (the chunk length)",
                        "execute at most one predicted chunk before re-planning")
    return horizon


def frame_size(policy, resolution: int | None) -> int:
    """The frame size to render: the one asked for, else the policy's training frame size."""
    if resolution is not None:
        return int(resolution)
    resolution = _training_resolution(policy)
    if resolution is None:
        raise EvalError("evaluate: resolution", "the policy's data contract records no square camera size "
                        f"(camera_sizes = {policy.contract.get('camera_sizes')})",
                        "pass resolution= (--resolution) equal to the training frame size")
    return resolution


def evaluate(policy, env_name: str, episodes: int, seed: int = 1, execute_horizon: int | None = None, *,
             out_dir: str | Path | None = None, resolution: int | None = None, max_episode_steps: int | None = None,
             num_videos: int = 1, num_steps: int | None = None, camera: str | None = None,
             verbose: bool = False, inference_delay: int = 0, mode: str = "sync", expert_trace: bool = False) -> EvalResult:
    """Run `episodes` closed-loop episodes; with `out_dir`, write rollout mp4s, results.json and report.md.

    `policy` is a Policy or a path (export / run / checkpoint directory). `execute_horizon` defaults to
    the policy's chunk length. `resolution` defaults to the frame size of the policy's training data.
    `inference_delay` / `mode`: simulated latency in control ticks and what the robot does meanwhile.
    `expert_trace`: also ask the env's scripted expert what it would do in every state the policy acted in
    (result.expert_agreement, wamkit.eval.expert_agreement).
    Videos: the first `num_videos` successes and the first `num_videos` failures, so a report shows what
    working and failing look like rather than whichever episodes came first."""
    from wamkit.data.writer import encode_video
    from wamkit.eval.report import write_report
    from wamkit.sim.control_rate import at_control_rate, control_repeat
    from wamkit.sim.envs import get_spec, make_env
    from wamkit.sim.record import episode_seed

    t0 = time.perf_counter()
    if isinstance(policy, (str, Path)):
        policy = load_policy(policy, num_steps=num_steps or 10)
    spec = get_spec(env_name)
    horizon = check_request(policy, spec, episodes, execute_horizon)
    problem = check_schedule(mode, inference_delay, horizon, policy.chunk_length)
    if problem:
        raise EvalError("evaluate: --inference-delay / --horizon", problem,
                        "use a shorter --horizon (at most chunk length - delay) or a smaller delay")
    resolution = frame_size(policy, resolution)
    repeat = control_repeat(spec.fps, policy.fps)  # data recorded with `sim record --action-repeat K`
    if repeat is None and verbose:
        print(f"[wamkit eval] warning: policy trained at {policy.fps:g} fps, {env_name} runs at {spec.fps:g} fps")
    steps = int(num_steps or policy.num_steps)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    per_episode: list[EpisodeResult] = []
    seam_changes: list[float] = []
    step_changes: list[float] = []
    videos_written = {True: 0, False: 0}  # per outcome
    traces: list[tuple] = []  # (executed, expert) per episode, with expert_trace
    camera = policy_cameras(policy, camera)  # the cameras it was recorded with; several: it sees them all
    with make_env(env_name, resolution=resolution, camera=camera, max_episode_steps=max_episode_steps) as inner:
        env = at_control_rate(inner, repeat)  # act at the policy's own rate
        for i in range(episodes):
            ep_seed = episode_seed(seed, i)
            rollout = run_episode(policy, env, env.reset(ep_seed), mode=mode, delay=inference_delay, horizon=horizon,
                                  seed=ep_seed, num_steps=steps, budget=env.max_episode_steps, expert=expert_trace)
            traces.append((rollout.executed, rollout.expert))
            success, length, replans, frames = rollout.success, rollout.length, rollout.replans, rollout.frames
            seam_changes += rollout.seam_changes
            step_changes += rollout.step_changes
            video = None
            if out is not None and videos_written[success] < num_videos:
                videos_written[success] += 1
                video = rollout_video_name(i, success)
                encode_video(out / video, np.stack(frames), int(round(env.spec.fps)), "libx264")
            per_episode.append(EpisodeResult(i, ep_seed, success, length, replans, video, rollout.ticks,
                                             _mean(rollout.seam_changes), rollout.best_reward))
            if verbose:
                print(f"[wamkit eval] {env_name} episode {i}: {'success' if success else 'failure'} in {length} steps "
                      f"({replans} chunks)", flush=True)
        budget = env.max_episode_steps
    result = summarize(policy, spec, per_episode, horizon=horizon, budget=budget, resolution=int(resolution), seed=seed,
                       num_steps=steps, seconds=time.perf_counter() - t0, out_dir=out, mode=mode,
                       inference_delay=int(inference_delay), seam_jerk=_mean(seam_changes), step_jerk=_mean(step_changes),
                       seams=len(seam_changes),
                       expert_agreement=trace_agreement(spec, traces, per_episode) if expert_trace else None)
    if out is not None:
        write_report(result, out)
    return result


def rollout_video_name(index: int, success: bool) -> str:
    """The file name of episode `index`'s rollout video, serial and batched alike (reports link to it)."""
    return f"rollout_{index:03d}_{'success' if success else 'failure'}.mp4"


def trace_agreement(spec, traces: list[tuple], per_episode: list[EpisodeResult]) -> dict:
    """expert_agreement of one env's episodes from their (executed, expert) action lists."""
    from wamkit.eval.expert_agreement import agreement

    as_array = lambda rows: np.asarray(rows, np.float64).reshape(len(rows), spec.action_dim)  # noqa: E731
    return agreement([as_array(e) for e, _ in traces], [as_array(x) for _, x in traces],
                     [not e.success for e in per_episode], spec.action_names, spec.action_bounds)


def summarize(policy, spec, per_episode: list[EpisodeResult], *, horizon: int, budget: int, resolution: int, seed: int,
              num_steps: int, seconds: float, out_dir: Path | None = None, **realtime) -> EvalResult:
    """The EvalResult of one env's episodes (serial or batched evaluation alike): rate, Wilson interval,
    lengths, and the policy's training step from its source."""
    successes, episodes = sum(e.success for e in per_episode), len(per_episode)
    lengths = [e.length for e in per_episode]
    ok_lengths = [e.length for e in per_episode if e.success]
    source = dict(policy.loaded.source)
    step = source.get("step")
    rewards = [e.best_reward for e in per_episode]
    mean_reward, reward_se = (None, None) if None in rewards else mean_sem(rewards)
    return EvalResult(
        env_name=spec.name, task=spec.task, episodes=episodes, successes=successes, success_rate=successes / episodes,
        ci95=wilson_interval(successes, episodes), mean_episode_length=float(np.mean(lengths)),
        mean_success_length=float(np.mean(ok_lengths)) if ok_lengths else None, execute_horizon=horizon,
        chunk_length=policy.chunk_length, max_episode_steps=budget, resolution=resolution, seed=seed,
        num_steps=num_steps, policy_source=source, training_step=int(step) if step is not None and int(step) >= 0 else None,
        seconds=seconds, per_episode=per_episode, out_dir=str(out_dir) if out_dir is not None else None,
        noise_scale=float(getattr(policy, "noise_scale", 1.0)), mean_best_reward=mean_reward, best_reward_se=reward_se,
        **realtime)


def mean_sem(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and its standard error (None for a single value: one value gives no spread)."""
    x = np.asarray(values, np.float64)
    return float(x.mean()), (float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None)


def evaluate_delays(policy, env_name: str, delays: list[int], modes: list[str], out_dir: str | Path,
                    execute_horizon: int | None = None, **kwargs) -> list[EvalResult]:
    """`evaluate` once per (delay, mode), each into out_dir/delay_<D>_<mode>/, and the comparison table
    (success and seam jerk per mode) in out_dir/realtime.md. The horizon defaults to half the chunk,
    so the async modes have room for the delay and RTC an overlap to blend."""
    from wamkit.eval.report import write_realtime_table

    horizon = execute_horizon or max(1, policy.chunk_length // 2)
    for delay in delays:  # refuse a bad combination before spending time on the others
        for mode in modes:
            problem = check_schedule(mode, delay, horizon, policy.chunk_length)
            if problem:
                raise EvalError("evaluate: --inference-delay / --modes / --horizon", problem,
                                f"use modes from {list(MODES)} and a --horizon of at most chunk length - delay")
    results = []
    for delay in delays:
        for mode in modes:
            results.append(evaluate(policy, env_name, out_dir=Path(out_dir) / f"delay_{delay}_{mode}", execute_horizon=horizon,
                                    inference_delay=delay, mode=mode, **kwargs))
            r = results[-1]
            if kwargs.get("verbose"):
                print(f"[wamkit eval] delay {delay} {mode}: success {r.successes}/{r.episodes}, seam jerk "
                      f"{_fmt(r.seam_jerk)} over {r.seams} seams, step jerk {_fmt(r.step_jerk)} (mean squared action change, "
                      "raw action units squared)", flush=True)
    write_realtime_table(results, out_dir)
    return results


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"
