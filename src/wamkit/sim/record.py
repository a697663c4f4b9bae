"""Record scripted-expert demonstrations from a simulator as a LeRobot v3.0 dataset.

Each attempt resets the env with its own seed (`seed * 1_000_003 + attempt`), rolls out the expert
until the env reports success (plus `post_success_steps` more steps, so the data also shows holding
still at the goal) or the step budget is spent. Only successful attempts are written; failures are
counted in the summary and never mixed into the data.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence


from wamkit.errors import DataError
from wamkit.sim.control_rate import at_control_rate
from wamkit.sim.base import SimError
from wamkit.sim.envs import expand_env_names, get_spec, make_env
from wamkit.data.writer import DEFAULT_CAMERA_KEY, RECORDING_META, LeRobotWriter
from wamkit.sim.expert import check_action_noise, episode_seed, rollout_expert  # noqa: F401 - re-exported


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


def record(env_name: str, episodes: int, out_dir: str | Path, seed: int = 0, resolution: int = 64, *,
           max_episode_steps: int | None = None, step_budgets: Sequence[int | None] | None = None,
           post_success_steps: int = 10, camera: str | None = None, episodes_per_file: int = 16,
           action_repeat: int = 1, workers: int = 0, pix_fmt: str = "yuv444p", expert_noise: float = 0.0,
           verbose: bool = False) -> RecordSummary:
    """Roll out the env's scripted expert `episodes` times and write the successful ones to `out_dir`.

    `env_name` may list several envs and suites separated by commas ('metaworld/mt10' is Meta-World's ten
    MT10 tasks; a multi-task dataset, whose envs must agree in state/action layout and fps): `episodes`
    attempts are made in each, and every episode carries its own env's task text. `episodes` counts attempts;
    the summary says how many succeeded (were kept) and which were dropped. `step_budgets[i]`
    (optional) overrides the step budget of attempt i (tests use it to force a failure). Raises if
    no attempt succeeded. `action_repeat` K holds every expert action for K simulator steps, so the
    dataset runs at the env's fps / K (wamkit.sim.control_rate). `workers` W > 0 rolls the attempts out
    in W simulator processes (wamkit.sim.workers); the dataset is the same, episodes in the same order.
    `pix_fmt` is the video's: 'yuv444p' (default) keeps the full colour resolution the policy sees in closed loop;
    'yuv420p', LeRobot's and every browser's, halves it (wamkit.data.writer.PIXEL_FORMATS says what that costs).
    `expert_noise` s > 0 executes the expert's actions with Gaussian noise of s times the action range's half and
    records the expert's clean actions (wamkit.sim.expert.rollout_expert: DART's states off the expert's path)."""
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
    check_action_noise(expert_noise)  # before anything is written
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise DataError(str(out_dir), "already exists and is not an empty directory",
                        "delete it or choose another output directory")
    fps = spec.fps / action_repeat
    writer = LeRobotWriter(out_dir, fps, state_names=spec.state_names, action_names=spec.action_names,
                           robot_type=spec.robot_type, camera_key=DEFAULT_CAMERA_KEY, episodes_per_file=episodes_per_file,
                           state_bounds=spec.state_bounds, action_bounds=spec.action_bounds, tasks=[s.task for s in specs],
                           pix_fmt=pix_fmt)
    kept_lengths: list[int] = []  # each kept episode goes to the encoder as it ends: memory holds one episode's frames
    dropped: list[int] = []
    kept_seeds: list[int] = []
    try:
        args = (episodes, seed, resolution, max_episode_steps, step_budgets, post_success_steps, camera, action_repeat,
                expert_noise)
        rollouts = _attempts_in_workers(names, workers, *args) if workers > 0 else (
            (index, *a) for index, name in enumerate(names) for a in _attempts(name, *args, verbose))
        for index, attempt, episode, success in rollouts:
            if verbose and workers > 0:
                print(f"[wamkit sim] {names[index]} attempt {attempt}: {'success' if success else 'FAILED (dropped)'} "
                      f"after {len(episode.states)} steps", flush=True)
            if success:
                writer.add(episode)
                kept_lengths.append(len(episode.states))
                kept_seeds.append(episode_seed(seed, attempt))
            else:
                dropped.append(index * episodes + attempt)
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
                  "action_repeat": action_repeat, "pix_fmt": pix_fmt, "expert_noise": expert_noise,
                  "max_episode_steps": max_episode_steps or spec.max_episode_steps, "episode_seeds_kept": kept_seeds}
    (out_dir / RECORDING_META).write_text(json.dumps(provenance, indent=2))
    return summary


def _attempts(env_name, episodes, seed, resolution, max_episode_steps, step_budgets, post_success_steps, camera,
              action_repeat, expert_noise, verbose):
    """Yield (attempt, episode, success) for `episodes` expert attempts in one env."""
    budgets = list(step_budgets or [])
    with make_env(env_name, resolution=resolution, camera=camera, max_episode_steps=max_episode_steps) as inner:
        env = at_control_rate(inner, action_repeat)
        for attempt in range(episodes):
            budget = budgets[attempt] if attempt < len(budgets) and budgets[attempt] else env.max_episode_steps
            budget = min(int(budget), env.max_episode_steps)
            episode, success = rollout_expert(env, episode_seed(seed, attempt), budget, post_success_steps, expert_noise)
            if verbose:
                print(f"[wamkit sim] {env_name} attempt {attempt}: {'success' if success else 'FAILED (dropped)'} "
                      f"after {len(episode.states)} steps", flush=True)
            yield attempt, episode, success


def _attempts_in_workers(names, workers, episodes, seed, resolution, max_episode_steps, step_budgets, post_success_steps,
                         camera, action_repeat, expert_noise):
    """Yield (env index, attempt, episode, success) for every env's attempts, rolled out in `workers` processes
    (one pool for all envs, so no core idles at a task boundary), in the serial order."""
    from wamkit.sim.workers import EnvSettings, EnvWorkers

    budgets = list(step_budgets or [])
    order = [(index, attempt) for index in range(len(names)) for attempt in range(episodes)]
    jobs = [(names[i], episode_seed(seed, a), budgets[a] if a < len(budgets) else None, post_success_steps, expert_noise)
            for i, a in order]
    with EnvWorkers(min(workers, len(jobs)), EnvSettings(resolution, camera, max_episode_steps, action_repeat)) as pool:
        for (index, attempt), (episode, success) in zip(order, pool.map_ordered("expert", jobs)):
            yield index, attempt, episode, success


def sim_record_main(args) -> int:
    """`wamkit sim record ENV --episodes N --out DIR [--seed S --resolution R --max-steps M]`."""
    summary = record(args.env, args.episodes, args.out, seed=args.seed, resolution=args.resolution, camera=getattr(args, "camera", None),
                     max_episode_steps=getattr(args, "max_steps", None), action_repeat=getattr(args, "action_repeat", 1),
                     workers=getattr(args, "workers", 0), pix_fmt=getattr(args, "pix_fmt", "yuv444p"),
                     expert_noise=getattr(args, "expert_noise", 0.0), verbose=True)
    print(summary.format())
    return 0
