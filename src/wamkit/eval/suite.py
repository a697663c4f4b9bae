"""Evaluations made of single-env ones (`sim_eval.evaluate`): a suite of tasks (Meta-World MT10: one policy,
ten envs, per-task success and the average), every checkpoint of a run (success vs training step), and the
`wamkit eval sim` command that picks between them.

A suite evaluates the same episode seeds in every task, so every task has the same number of episodes and
the average of the per-task rates is the pooled rate over all episodes; its 95% interval is the pooled
Wilson interval (conservative: the tasks' separate binomials vary less than one pooled one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from wamkit.errors import CheckpointError
from wamkit.eval.report import write_checkpoints_report, write_suite_report
from wamkit.eval.sim_eval import EvalError, EvalResult, evaluate, evaluate_delays, load_policy, wilson_interval


@dataclass
class SuiteResult:
    tasks: list[EvalResult]
    episodes: int  # over all tasks
    successes: int
    success_rate: float  # the average of the per-task rates (= the pooled rate: equal episodes per task)
    ci95: tuple[float, float]
    mean_episode_length: float
    training_step: int | None
    seconds: float
    out_dir: str | None = None
    mean_best_reward: float | None = None  # the average of the tasks' mean best dense rewards (None if one has none)

    def to_json(self) -> dict:
        return {"env_names": [t.env_name for t in self.tasks], "episodes": self.episodes, "successes": self.successes,
                "success_rate": self.success_rate, "ci95": list(self.ci95),
                "per_task_success": {t.env_name: t.success_rate for t in self.tasks},
                "mean_best_reward": self.mean_best_reward,
                "per_task_best_reward": {t.env_name: t.mean_best_reward for t in self.tasks},
                "mean_episode_length": self.mean_episode_length, "training_step": self.training_step,
                "seconds": self.seconds, "out_dir": self.out_dir, "tasks": [t.to_json() for t in self.tasks]}


def task_dir(env_name: str) -> str:
    """A task's subdirectory inside a suite's report directory ('metaworld/push-v3' -> 'metaworld_push-v3')."""
    return env_name.replace("/", "_")


def evaluate_suite(policy, env_names: Sequence[str], episodes: int, seed: int = 1, *, out_dir: str | Path | None = None,
                   num_steps: int | None = None, **kwargs) -> SuiteResult:
    """`episodes` closed-loop episodes in each env (same seeds in each), each task reported into
    out_dir/<task_dir>/, then the suite's report.md and results.json in out_dir."""
    t0 = time.perf_counter()
    if isinstance(policy, (str, Path)):
        policy = load_policy(policy, num_steps=num_steps or 10)
    out = Path(out_dir) if out_dir is not None else None
    tasks = [evaluate(policy, name, episodes, seed, out_dir=out / task_dir(name) if out else None, num_steps=num_steps,
                      **kwargs) for name in env_names]
    return suite_of(tasks, time.perf_counter() - t0, out)


def suite_of(tasks: list[EvalResult], seconds: float, out: Path | None) -> SuiteResult:
    """The suite's average, pooled interval and report (out/report.md) from its tasks' results."""
    successes, total = sum(t.successes for t in tasks), sum(t.episodes for t in tasks)
    rewards = [t.mean_best_reward for t in tasks]
    suite = SuiteResult(tasks=tasks, episodes=total, successes=successes,
                        success_rate=float(np.mean([t.success_rate for t in tasks])), ci95=wilson_interval(successes, total),
                        mean_episode_length=float(np.mean([t.mean_episode_length for t in tasks])),
                        training_step=tasks[0].training_step, seconds=seconds, out_dir=str(out) if out else None,
                        mean_best_reward=None if None in rewards else float(np.mean(rewards)))
    if out is not None:
        write_suite_report(suite, out)
    return suite


def evaluate_envs(policy, env_names: Sequence[str], episodes: int, seed: int = 1, *, workers: int = 0, pool=None,
                  **kwargs) -> EvalResult | SuiteResult:
    """One env: its EvalResult (the single-env report layout); several: a SuiteResult. `workers` > 0 (or an
    open `pool`): the batched evaluator (wamkit.eval.batched: envs in worker processes, videos by replay)."""
    if workers or pool is not None:
        return _evaluate_batched(policy, env_names, episodes, seed, workers=workers, pool=pool, **kwargs)
    if len(env_names) == 1:
        return evaluate(policy, env_names[0], episodes, seed, **kwargs)
    return evaluate_suite(policy, env_names, episodes, seed, **kwargs)


def _evaluate_batched(policy, env_names, episodes, seed, *, out_dir=None, num_videos: int = 1, **kwargs):
    """`evaluate_envs` through the batched evaluator, reports (and videos) in the serial layout."""
    from wamkit.eval.batched import evaluate_batched
    from wamkit.eval.report import write_report

    t0 = time.perf_counter()
    out = Path(out_dir) if out_dir is not None else None
    video_dirs = None if out is None else {n: out if len(env_names) == 1 else out / task_dir(n) for n in env_names}
    tasks = evaluate_batched(policy, env_names, episodes, seed, video_dirs=video_dirs, num_videos=num_videos, **kwargs)
    if len(tasks) == 1:
        if out is not None:
            tasks[0].out_dir = str(out)
            write_report(tasks[0], out)
        return tasks[0]
    for t in tasks:
        if out is not None:
            t.out_dir = str(out / task_dir(t.env_name))
            write_report(t, t.out_dir)
    return suite_of(tasks, time.perf_counter() - t0, out)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints/iter_<N> directories of a run, oldest first."""
    from wamkit.storage import location
    from wamkit.train.checkpoint import COMPLETE_MARKER

    checkpoints = location(run_dir, "run directory") / "checkpoints"
    found = sorted((p for p in checkpoints.glob("iter_*") if (p / COMPLETE_MARKER).is_file()),
                   key=lambda p: int(p.name.split("_")[1]))
    if not found:
        raise CheckpointError(str(checkpoints), "has no complete iter_<N> checkpoints",
                              "pass a run directory that has been trained (runs/<name>)")
    return found


def evaluate_checkpoints(run_dir: str | Path, env_name: str | Sequence[str], episodes: int, seed: int = 1, *,
                         out_dir: str | Path, num_steps: int = 10, workers: int = 0, device: str = "cpu", dtype: str = "auto",
                         noise_scale: float = 1.0, use_ema: bool = True, **kwargs) -> list:
    """Evaluate every checkpoint of a run (each into out_dir/step_<N>/) in one env or a suite (a list of env
    names, or a string naming envs/suites), then write out_dir/report.md, out_dir/results.json and
    out_dir/success_vs_step.png (or .svg without matplotlib)."""
    from wamkit.sim.envs import expand_env_names

    names = expand_env_names(env_name) if isinstance(env_name, str) else list(env_name)
    out = Path(out_dir)
    results = []
    load = dict(device=device, num_steps=num_steps, dtype=dtype, noise_scale=noise_scale, use_ema=use_ema)
    iterations = list_checkpoints(run_dir)
    policy = load_policy(iterations[0], **load)
    with _pool(policy, names, workers, kwargs) as pool:
        for i, iteration in enumerate(iterations):
            if i:
                policy = next_checkpoint(policy, iteration, load)
            step = int(iteration.name.split("_")[1])
            results.append(evaluate_envs(policy, names, episodes, seed, out_dir=out / f"step_{step:09d}", num_steps=num_steps,
                                         pool=pool, **kwargs))
    label = names[0] if len(names) == 1 else f"{len(names)} tasks"
    write_checkpoints_report(results, out, f"{label}: {episodes} episodes per task and checkpoint")
    return results


def next_checkpoint(policy, iteration: Path, load: dict):
    """The run's next checkpoint: loaded into the same tensors when it can be (its CUDA graphs, captured
    once per batch shape and prompt mix, replay it: 16-26 captures a checkpoint in MT10's curve before),
    else afresh."""
    if policy.reload_refusal(iteration) is None:
        policy.reload(iteration, use_ema=load["use_ema"])
        return policy
    return load_policy(iteration, **load)


def _pool(first, names, workers: int, kwargs):
    """One set of simulator workers for every checkpoint of a run (none for serial evaluation), set up
    for the run's first checkpoint (cameras and frame size are the run's)."""
    import contextlib

    if not workers:
        return contextlib.nullcontext()
    from wamkit.eval.batched import pool_settings
    from wamkit.eval.sim_eval import frame_size
    from wamkit.sim.envs import get_spec
    from wamkit.sim.workers import EnvWorkers

    specs = [get_spec(n) for n in names]
    settings = pool_settings(first, specs, frame_size(first, kwargs.get("resolution")), kwargs.get("max_episode_steps"))
    return EnvWorkers(workers, settings)


def _summary_line(result) -> str:
    lo, hi = result.ci95
    name = result.env_name if isinstance(result, EvalResult) else f"average of {len(result.tasks)} tasks"
    reward = "" if result.mean_best_reward is None else f", best reward {result.mean_best_reward:.2f} (mean over episodes)"
    return (f"{name}: success {result.successes}/{result.episodes} = {result.success_rate:.2f} (95% CI {lo:.2f}-{hi:.2f}), "
            f"mean length {result.mean_episode_length:.1f} steps{reward}")


def eval_sim_main(args) -> int:
    """`wamkit eval sim CHECKPOINT_OR_EXPORT ENV --episodes N --seed S [--horizon H] [--out DIR] [--all-checkpoints]`;
    ENV is an env, a comma-separated list or a suite such as metaworld/mt10."""
    from wamkit.eval.expert_agreement import agreement_line
    from wamkit.sim.envs import expand_env_names

    names = expand_env_names(args.env)
    out = Path(args.out) if args.out else Path("eval") / args.env.replace("/", "_").replace(",", "+")
    common = dict(execute_horizon=args.horizon, resolution=getattr(args, "resolution", None),
                  max_episode_steps=getattr(args, "max_steps", None), num_steps=getattr(args, "num_steps", None) or 10,
                  verbose=True, expert_trace=getattr(args, "expert_trace", False), num_videos=getattr(args, "videos", 1))
    workers = getattr(args, "workers", 0) or 0
    # where the policy computes, in what, and how far from the mode it samples
    place = dict(device=getattr(args, "device", "cpu"), dtype=getattr(args, "dtype", "auto"),
                 noise_scale=getattr(args, "noise_scale", 1.0), use_ema=not getattr(args, "raw", False))
    delays = getattr(args, "inference_delay", None)
    if delays is not None:  # simulated latency: one env, every (delay, mode) pair, realtime.md
        if len(names) != 1:
            raise EvalError("eval sim: --inference-delay", f"{args.env} names {len(names)} envs", "pass one env with --inference-delay")
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        policy = load_policy(args.path, num_steps=common["num_steps"], **place)
        evaluate_delays(policy, names[0], delays, modes, out, episodes=args.episodes, seed=args.seed, **common)
        print(f"report: {out / 'realtime.md'}")
        return 0
    if getattr(args, "all_checkpoints", False):
        for r in evaluate_checkpoints(args.path, names, args.episodes, args.seed, out_dir=out, workers=workers, **place, **common):
            print(f"step {r.training_step}: {_summary_line(r)}")
        print(f"report: {out / 'report.md'}\nplot: {next(out.glob('success_vs_step.*'))}")
        return 0
    policy = load_policy(args.path, num_steps=common["num_steps"], **place)
    result = evaluate_envs(policy, names, args.episodes, args.seed, out_dir=out, workers=workers, **common)
    for task in getattr(result, "tasks", None) or [result]:
        if len(names) > 1:
            print(_summary_line(task))
        if task.expert_agreement:
            print(f"  against the expert (direction followed, |diff|): {agreement_line(task.expert_agreement)}")
    print(_summary_line(result))
    videos = sorted(out.rglob("rollout_*_success.mp4")) or sorted(out.rglob("rollout_*.mp4"))
    print(f"report: {out / 'report.md'}" + (f"\nrollout video: {videos[0]}" if videos else ""))
    return 0
