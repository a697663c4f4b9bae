"""Closed-loop evaluation of a `wamkit.policy.Policy` in a registered simulator.

Every `execute_horizon` env steps the policy is asked for a new chunk from the current raw
observation (image, state, task text); the first `execute_horizon` actions of the chunk are executed
open-loop, then it re-plans. An episode ends on the env's success flag or when the step budget is
spent. Episode i is reset with `wamkit.sim.record.episode_seed(seed, i)`: evaluate with a seed other
than the one the training data was recorded with to get unseen object/goal placements.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from wamkit.errors import WamkitError


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
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class EpisodeResult:
    index: int
    seed: int
    success: bool
    length: int
    replans: int
    video: str | None = None


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

    def to_json(self) -> dict:
        d = asdict(self)
        d["ci95"] = list(self.ci95)
        return d


def load_policy(path: str | Path, device: str = "cpu", num_steps: int = 10):
    """An export directory (has wamkit.json), a run directory or a checkpoints/iter_<N> directory."""
    from wamkit.policy import Policy

    path = Path(path)
    if (path / "wamkit.json").is_file():
        return Policy.from_export(path, device=device, num_steps=num_steps)
    return Policy.from_checkpoint(path, device=device, num_steps=num_steps)


def _training_resolution(policy) -> int | None:
    """The camera frame size the policy was trained on, read from its training dataset if still there."""
    dataset = policy.contract.get("dataset")
    if not dataset:
        return None
    info_file = Path(dataset) / "meta" / "info.json"
    try:
        features = json.loads(info_file.read_text())["features"]
        cams = policy.camera_keys or [k for k, f in features.items() if f.get("dtype") == "video"]
        h, w = features[cams[0]]["shape"][:2]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return int(h) if h == w else None


def _check_pairing(policy, spec) -> None:
    if len(policy.camera_keys) > 1:
        raise EvalError("evaluate", f"the policy was trained on {len(policy.camera_keys)} cameras {policy.camera_keys}; "
                        f"{spec.name} renders one", "evaluate a single-camera policy")
    if policy.action_dim != spec.action_dim:
        raise EvalError("evaluate", f"the policy outputs {policy.action_dim}-D actions, {spec.name} takes "
                        f"{spec.action_dim}-D {list(spec.action_names)}", "evaluate on the env its data was recorded in")
    if policy.use_state and policy.state_dim != spec.state_dim:
        raise EvalError("evaluate", f"the policy expects {policy.state_dim}-D state, {spec.name} gives "
                        f"{spec.state_dim}-D {list(spec.state_names)}", "evaluate on the env its data was recorded in")


def evaluate(policy, env_name: str, episodes: int, seed: int = 1, execute_horizon: int | None = None, *,
             out_dir: str | Path | None = None, resolution: int | None = None, max_episode_steps: int | None = None,
             num_videos: int = 1, num_steps: int | None = None, camera: str | None = None,
             verbose: bool = False) -> EvalResult:
    """Run `episodes` closed-loop episodes; with `out_dir`, write rollout mp4s, results.json and report.md.

    `policy` is a Policy or a path (export / run / checkpoint directory). `execute_horizon` defaults to
    the policy's chunk length. `resolution` defaults to the frame size of the policy's training data.
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
    _check_pairing(policy, spec)
    if episodes < 1:
        raise EvalError("evaluate: episodes", f"is {episodes}", "evaluate at least one episode")
    horizon = int(execute_horizon or policy.chunk_length)
    if not 1 <= horizon <= policy.chunk_length:
        raise EvalError("evaluate: execute_horizon", f"{horizon} is outside [1, {policy.chunk_length}] (the chunk length)",
                        "execute at most one predicted chunk before re-planning")
    if resolution is None:
        resolution = _training_resolution(policy)
        if resolution is None:
            raise EvalError("evaluate: resolution", "cannot read the training frame size from the policy's dataset",
                            "pass resolution= (--resolution) equal to the training frame size")
    repeat = control_repeat(spec.fps, policy.fps)  # data recorded with `sim record --action-repeat K`
    if repeat is None and verbose:
        print(f"[wamkit eval] warning: policy trained at {policy.fps:g} fps, {env_name} runs at {spec.fps:g} fps")
    steps = int(num_steps or policy.num_steps)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    per_episode: list[EpisodeResult] = []
    videos_written = {True: 0, False: 0}  # per outcome
    with make_env(env_name, resolution=resolution, camera=camera, max_episode_steps=max_episode_steps) as inner:
        env = at_control_rate(inner, repeat)  # act at the policy's own rate
        for i in range(episodes):
            ep_seed = episode_seed(seed, i)
            obs = env.reset(ep_seed)
            frames = [obs["image"]]
            success, length, replans, done = False, 0, 0, False
            while not done:
                chunk = policy.predict([obs], seed=ep_seed * 1009 + replans, num_steps=steps)[0]
                replans += 1
                for action in chunk[:horizon]:
                    result = env.step(action)
                    obs, length = result.obs, length + 1
                    frames.append(obs["image"])
                    success = success or result.success
                    if result.done:
                        done = True
                        break
            video = None
            if out is not None and videos_written[success] < num_videos:
                videos_written[success] += 1
                video = f"rollout_{i:03d}_{'success' if success else 'failure'}.mp4"
                encode_video(out / video, np.stack(frames), int(round(env.spec.fps)), "libx264")
            per_episode.append(EpisodeResult(i, ep_seed, success, length, replans, video))
            if verbose:
                print(f"[wamkit eval] {env_name} episode {i}: {'success' if success else 'failure'} in {length} steps "
                      f"({replans} chunks)", flush=True)
        budget = env.max_episode_steps
    successes = sum(e.success for e in per_episode)
    lengths = [e.length for e in per_episode]
    ok_lengths = [e.length for e in per_episode if e.success]
    source = dict(policy.loaded.source)
    step = source.get("step")
    result = EvalResult(
        env_name=env_name, task=spec.task, episodes=episodes, successes=successes, success_rate=successes / episodes,
        ci95=wilson_interval(successes, episodes), mean_episode_length=float(np.mean(lengths)),
        mean_success_length=float(np.mean(ok_lengths)) if ok_lengths else None, execute_horizon=horizon,
        chunk_length=policy.chunk_length, max_episode_steps=budget, resolution=int(resolution), seed=seed,
        num_steps=steps, policy_source=source, training_step=int(step) if step is not None and int(step) >= 0 else None,
        seconds=time.perf_counter() - t0, per_episode=per_episode, out_dir=str(out) if out is not None else None)
    if out is not None:
        write_report(result, out)
    return result
