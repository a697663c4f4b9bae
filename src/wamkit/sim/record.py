"""Record scripted-expert demonstrations from a simulator as a LeRobot v3.0 dataset.

Each attempt resets the env with its own seed (`seed * 1_000_003 + attempt`), rolls out the expert
until the env reports success (plus `post_success_steps` more steps, so the data also shows holding
still at the goal) or the step budget is spent. Only successful attempts are written; failures are
counted in the summary and never mixed into the data.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from wamkit.errors import DataError
from wamkit.sim.control_rate import at_control_rate
from wamkit.sim.base import SimError
from wamkit.sim.envs import expand_env_names, get_spec, make_env
from wamkit.data.writer import DEFAULT_CAMERA_KEY, LeRobotWriter, RecordedEpisode


@dataclass
class RecordSummary:
    env_name: str
    out_dir: str
    attempted: int
    kept: int
    dropped: int
    expert_success_rate: float
    dropped_attempts: list[int] = field(default_factory=list)
    kept_lengths: list[int] = field(default_factory=list)
    total_frames: int = 0
    fps: float = 0.0
    resolution: int = 0
    task: str = ""
    widened_channels: dict = field(default_factory=dict)
    seconds: float = 0.0

    def format(self) -> str:
        return (f"recorded {self.env_name}: {self.kept}/{self.attempted} expert episodes succeeded and were kept "
                f"({self.dropped} failed and dropped{': attempts ' + str(self.dropped_attempts) if self.dropped else ''}); "
                f"expert success rate {self.expert_success_rate:.2f}; {self.total_frames} frames at {self.fps:g} fps, "
                f"{self.resolution}x{self.resolution} px -> {self.out_dir} ({self.seconds:.1f} s)")


def episode_seed(seed: int, attempt: int) -> int:
    return int(seed) * 1_000_003 + int(attempt)


def rollout_expert(env, seed: int, max_steps: int, post_success_steps: int = 10) -> tuple[RecordedEpisode, bool]:
    """One expert episode; row t holds the observation before action t."""
    obs = env.reset(seed)
    states, actions, frames = [], [], []
    success, extra = False, 0
    for _ in range(max_steps):
        action = env.expert_action()
        states.append(obs["state"])
        frames.append(obs.get("views", obs["image"]))
        actions.append(action)
        result = env.step(action)
        obs = result.obs
        success = success or result.success
        if result.done and not success:  # the budget is spent or the env ended the episode as failed
            break
        if success:
            if extra >= post_success_steps:
                break
            extra += 1
    episode = RecordedEpisode(task=env.spec.task, states=np.stack(states).astype(np.float32),
                              actions=np.stack(actions).astype(np.float32), frames=_stack_frames(frames))
    return episode, success


def _stack_frames(frames: list) -> np.ndarray | dict[str, np.ndarray]:
    """One camera: [L, H, W, 3]. Several (observations with "views"): one such array per camera,
    keyed `observation.images.<camera>` as LeRobot names its ALOHA cameras."""
    if isinstance(frames[0], dict):
        return {f"observation.images.{name}": np.stack([f[name] for f in frames]) for name in frames[0]}
    return np.stack(frames)


def record(env_name: str, episodes: int, out_dir: str | Path, seed: int = 0, resolution: int = 64, *,
           max_episode_steps: int | None = None, step_budgets: Sequence[int | None] | None = None,
           post_success_steps: int = 10, camera: str | None = None, episodes_per_file: int = 16,
           action_repeat: int = 1, verbose: bool = False, workers: int = 1) -> RecordSummary:
    """Roll out the env's scripted expert `episodes` times and write the successful ones to `out_dir`.

    `env_name` may list several envs and suites separated by commas ('metaworld/mt10' is Meta-World's ten
    MT10 tasks; a multi-task dataset, whose envs must agree in state/action layout and fps): `episodes`
    attempts are made in each, and every episode carries its own env's task text. `episodes` counts attempts;
    the summary says how many succeeded (were kept) and which were dropped. `step_budgets[i]`
    (optional) overrides the step budget of attempt i (tests use it to force a failure). Raises if
    no attempt succeeded. `action_repeat` K holds every expert action for K simulator steps, so the
    dataset runs at the env's fps / K (wamkit.sim.control_rate). `workers` > 1 rolls attempts out in that
    many processes; every attempt's seed depends only on its index and the writer takes the results in
    attempt order, so the dataset is the same as with one worker."""
    t0 = time.perf_counter()
    names = expand_env_names(env_name)
    specs = [get_spec(n) for n in names]
    spec = specs[0]
    for other in specs[1:]:
        if (other.state_names, other.action_names, other.fps) != (spec.state_names, spec.action_names, spec.fps):
            raise SimError(f"record {env_name}", f"{other.name} and {spec.name} differ in state/action layout or fps",
                           "record envs of one robot into one dataset, others separately")
    if episodes < 1:
        raise SimError("record: episodes", f"is {episodes}", "record at least one episode")
    if resolution % 16:
        raise SimError("record: resolution", f"{resolution} is not a multiple of 16",
                       "use 64 or 96 so the frames tile into the tokenizer's patches")
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise DataError(str(out_dir), "already exists and is not an empty directory",
                        "delete it or choose another output directory")
    fps = spec.fps / action_repeat
    writer = LeRobotWriter(out_dir, fps, state_names=spec.state_names, action_names=spec.action_names,
                           robot_type=spec.robot_type, camera_key=DEFAULT_CAMERA_KEY, episodes_per_file=episodes_per_file,
                           state_bounds=spec.state_bounds, action_bounds=spec.action_bounds, tasks=[s.task for s in specs])
    kept_lengths: list[int] = []  # each kept episode goes to the encoder as it ends: memory holds one episode's frames
    dropped: list[int] = []
    kept_seeds: list[int] = []
    try:
        for index, name in enumerate(names):
            job = (name, seed, resolution, max_episode_steps, step_budgets, post_success_steps, camera, action_repeat, verbose)
            for attempt, episode, success in _attempts_in(workers, episodes, job):
                global_attempt = index * episodes + attempt
                if success:
                    writer.add(episode)
                    kept_lengths.append(len(episode.states))
                    kept_seeds.append(episode_seed(seed, attempt))
                else:
                    dropped.append(global_attempt)
                del episode
        if not kept_lengths:
            raise SimError(f"record {env_name}", f"the expert failed all {episodes * len(names)} attempts; nothing to write",
                           "raise max_episode_steps or check the simulator install")
        written = writer.finish()
    finally:
        writer.abort()
    attempted = episodes * len(names)
    summary = RecordSummary(
        env_name=",".join(names), out_dir=str(out_dir), attempted=attempted, kept=len(kept_lengths), dropped=len(dropped),
        expert_success_rate=len(kept_lengths) / attempted, dropped_attempts=dropped, kept_lengths=kept_lengths,
        total_frames=sum(kept_lengths), fps=fps, resolution=resolution,
        task="; ".join(s.task for s in specs), widened_channels=written["widened_channels"], seconds=time.perf_counter() - t0)
    provenance = {**asdict(summary), "seed": seed, "camera": camera or spec.camera, "post_success_steps": post_success_steps,
                  "action_repeat": action_repeat,
                  "max_episode_steps": max_episode_steps or spec.max_episode_steps, "episode_seeds_kept": kept_seeds}
    (out_dir / "meta" / "wamkit_recording.json").write_text(json.dumps(provenance, indent=2))
    return summary


def _attempts(env_name, seed, resolution, max_episode_steps, step_budgets, post_success_steps, camera, action_repeat,
              verbose, attempts):
    """Yield (attempt, episode, success) for the given expert attempts in one env (one env build)."""
    budgets = list(step_budgets or [])
    with make_env(env_name, resolution=resolution, camera=camera, max_episode_steps=max_episode_steps) as inner:
        env = at_control_rate(inner, action_repeat)
        for attempt in attempts:
            budget = budgets[attempt] if attempt < len(budgets) and budgets[attempt] else env.max_episode_steps
            budget = min(int(budget), env.max_episode_steps)
            episode, success = rollout_expert(env, episode_seed(seed, attempt), budget, post_success_steps)
            if verbose:
                print(f"[wamkit sim] {env_name} attempt {attempt}: {'success' if success else 'FAILED (dropped)'} "
                      f"after {len(episode.states)} steps", flush=True)
            yield attempt, episode, success


def _attempt_block(job: tuple, attempts: list[int]) -> list:
    """One worker's contiguous block of attempts (a process builds its env once)."""
    return list(_attempts(*job, attempts))


def _attempts_in(workers: int, episodes: int, job: tuple):
    """(attempt, episode, success) in attempt order, from `workers` processes (spawned: MuJoCo's GL
    context must not be forked). Blocks are small (about 2 per worker), so the parent's writer,
    which encodes as results arrive, holds at most a few blocks of frames."""
    if workers <= 1 or episodes <= 1:
        yield from _attempts(*job, range(episodes))
        return
    import multiprocessing

    size = max(1, episodes // (2 * workers))
    blocks = [list(range(i, min(i + size, episodes))) for i in range(0, episodes, size)]
    with multiprocessing.get_context("spawn").Pool(min(workers, len(blocks))) as pool:
        for block in pool.imap(functools.partial(_attempt_block, job), blocks):
            yield from block


def sim_record_main(args) -> int:
    """`wamkit sim record ENV --episodes N --out DIR [--seed S --resolution R --max-steps M]`."""
    summary = record(args.env, args.episodes, args.out, seed=args.seed, resolution=args.resolution, camera=getattr(args, "camera", None),
                     max_episode_steps=getattr(args, "max_steps", None), action_repeat=getattr(args, "action_repeat", 1),
                     verbose=True, workers=getattr(args, "workers", 1))
    print(summary.format())
    return 0
