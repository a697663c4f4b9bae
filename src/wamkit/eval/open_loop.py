"""`wamkit eval open-loop`: what a policy asks for in the recorded expert's own states.

`eval sim --expert-trace` compares a policy with the scripted expert in the states the policy drove
itself into; a policy that does not follow there either cannot see what the expert sees, or has drifted
into states its data never showed. This splits the two: at every `every`-th step of held-out recorded
episodes it predicts a chunk from the recorded frame, state and task, and compares the chunk's first
`horizon` actions with the actions the expert recorded from there (the same per-dimension measure as
the trace, wamkit.eval.expert_agreement, per task and over all). Following the recording here but not in
closed loop points at drift; following neither, at what the policy reads from its inputs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wamkit.data.writer import camera_key
from wamkit.errors import WamkitError
from wamkit.eval.expert_agreement import agreement, percent


@dataclass
class RecordedEpisode:
    """One recorded episode as the policy is shown it: its cameras' frames as recorded, raw states and actions."""

    episode: int
    views: list[np.ndarray]  # one uint8 [L, H, W, 3] per camera, in the policy's camera order
    actions: np.ndarray  # [L, A]
    states: np.ndarray | None  # [L, S]
    task: str

    def image(self, t: int):
        """The policy's `image` at step t: the frame of a single-camera policy, else the list of its views (the
        policy tiles them into its training canvas itself, as in closed loop)."""
        return self.views[0][t] if len(self.views) == 1 else [view[t] for view in self.views]


def load_recorded(dataset, episode: int, policy) -> RecordedEpisode:
    """The policy's cameras, action and (when it reads one) state columns of one episode."""
    length = dataset.episode_length(episode)
    action_key = policy.contract.get("action_key") or "action"
    keys = [action_key] + ([policy.contract["state_key"]] if policy.use_state else [])
    cols = dataset.episode_columns(episode, keys)
    rows = {k: cols[k].reshape(length, -1).astype(np.float64) for k in keys}
    views = [dataset.decode_frames(episode, camera, np.arange(length)) for camera in recorded_camera_keys(policy, dataset)]
    return RecordedEpisode(episode, views, rows[action_key], rows[keys[-1]] if policy.use_state else None,
                           dataset.episode_task(episode))


def recorded_camera_keys(policy, dataset) -> list[str]:
    """The dataset's keys of the policy's cameras. A one-camera recording keys its view after no camera
    (`observation.images.front`); in a recording of several cameras the same view is keyed after its simulator
    camera, which the policy's contract keeps (`sim_camera`, e.g. `corner@2x`): such a recording shows every
    one-camera policy of its cameras, as `eval sim` renders them."""
    keys, sim_camera = list(policy.camera_keys), policy.contract.get("sim_camera")
    if len(keys) == 1 and keys[0] not in dataset.features and sim_camera and camera_key(sim_camera) in dataset.features:
        return [camera_key(sim_camera)]
    return keys


def episode_windows(ep, every: int, horizon: int) -> list[int]:
    """The steps t of a recorded episode at which a chunk is predicted: 0, every, 2 every, ... while
    t + horizon actions were recorded."""
    return list(range(0, len(ep.actions) - horizon + 1, every))


def open_loop_episode(policy, ep, every: int, horizon: int, seed: int, prompt: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, recorded) actions [n * horizon, D] of one episode, one chunk per window, all windows
    in one batched predict; `prompt` replaces the episode's task text (`swapped_prompts`)."""
    starts = episode_windows(ep, every, horizon)
    if not starts:
        return np.zeros((0, ep.actions.shape[1])), np.zeros((0, ep.actions.shape[1]))
    obs = [{"image": ep.image(t), "prompt": ep.task if prompt is None else prompt,
            "state": ep.states[t] if policy.use_state else None} for t in starts]
    chunks = policy.predict(obs, seed=seed + ep.episode)
    predicted = np.concatenate([np.asarray(c[:horizon], np.float64) for c in chunks])
    recorded = np.concatenate([ep.actions[t:t + horizon] for t in starts])
    return predicted, recorded


def check_policy(policy, horizon: int, every: int) -> None:
    if not 1 <= horizon <= policy.chunk_length:
        raise WamkitError("horizon", f"is {horizon}", f"compare 1..{policy.chunk_length} actions (the policy's chunk)")
    if every < 1:
        raise WamkitError("every", f"is {every}", "predict every 1 or more steps")


def swapped_prompts(tasks: list[str]) -> dict[str, str]:
    """Each task -> the next one in sorted order: the text `--swap-prompts` shows a task's episodes. A policy
    that reads its task text follows the expert less under it; one that tells the task from the scene alone
    (as ACT and DP must: they see no text) follows it as before."""
    names = sorted(set(tasks))
    if len(names) < 2:
        raise WamkitError("--swap-prompts", f"needs episodes of 2 or more tasks; these have {len(names)}",
                          "pass --episodes of several tasks, or leave --swap-prompts out")
    return {task: names[(i + 1) % len(names)] for i, task in enumerate(names)}


def evaluate_open_loop(policy, dataset, episodes: list[int], horizon: int, every: int, seed: int = 0,
                       swap_prompts: bool = False) -> dict:
    """Agreement with the recorded actions per task and over all episodes; JSON-ready. With `swap_prompts`
    each episode is shown another task's text (`swapped_prompts`), reported under its own task."""
    check_policy(policy, horizon, every)
    prompts = swapped_prompts([dataset.episode_task(int(e)) for e in episodes]) if swap_prompts else {}
    action_key = policy.contract.get("action_key") or "action"
    names = tuple(dataset.channel_names(action_key))[: policy.action_dim]
    stats = (dataset.stats or {}).get(action_key)
    by_task: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for e in episodes:
        ep = load_recorded(dataset, int(e), policy)
        by_task.setdefault(ep.task, []).append(open_loop_episode(policy, ep, every, horizon, seed, prompts.get(ep.task)))
    every_pair = [pair for pairs in by_task.values() for pair in pairs]
    bounds = _bounds(stats, every_pair)

    def summary(pairs):
        return agreement([p for p, _ in pairs], [r for _, r in pairs], [False] * len(pairs), names, bounds)["all"]

    return {"format": "wamkit-open-loop-report", "version": 1, "policy": policy.loaded.source, "dataset": str(dataset.root),
            "episodes": [int(e) for e in episodes], "horizon": horizon, "every": every, "seed": seed, "names": list(names),
            "prompts": prompts or "own",
            "all": summary(every_pair), "tasks": {task: summary(pairs) for task, pairs in by_task.items()}}


def _bounds(stats, pairs) -> tuple[list[float], list[float]]:
    """The action range the agreement is measured in: the dataset's recorded min/max, else what was compared."""
    if stats and "min" in stats and "max" in stats:
        return list(np.ravel(stats["min"]).astype(float)), list(np.ravel(stats["max"]).astype(float))
    rows = np.concatenate([r for _, r in pairs]) if pairs else np.zeros((1, 1))
    return rows.min(0).tolist(), rows.max(0).tolist()


def summary_line(names: list[str], result: dict | None) -> str:
    if not result:
        return "no windows"
    return "; ".join(f"{n} {percent(s)}, |diff| {d}" for n, s, d in zip(names, result["same_direction"], result["mean_abs_diff"]))


def write_report(report: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    lines = ["# Open-loop agreement with the recorded expert", "",
             f"policy: `{report['policy']}`  ", f"dataset: `{report['dataset']}`  episodes: {report['episodes']}  ",
             f"a chunk every {report['every']} steps, its first {report['horizon']} actions against the recorded ones; per action "
             f"dimension the share of the expert's firm moves (|a| >= 0.2 of the half range) followed in direction, "
             f"and the mean |difference| in half ranges", *_prompt_lines(report.get("prompts", "own")), "",
             "| task | windows x actions | " + " | ".join(report["names"]) + " |",
             "| --- | ---: | " + " | ".join("---" for _ in report["names"]) + " |"]
    for task, r in [*report["tasks"].items(), ("**all**", report["all"])]:
        if r:
            cells = [f"{percent(s)} ({d})" for s, d in zip(r["same_direction"], r["mean_abs_diff"])]
            lines.append(f"| {task} | {r['steps']} | " + " | ".join(cells) + " |")
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")


def _prompt_lines(prompts) -> list[str]:
    if prompts == "own":
        return []
    return ["", "**Swapped prompts** (`--swap-prompts`): each task's episodes were shown another task's text: "
            + "; ".join(f"{task} <- \"{shown}\"" for task, shown in prompts.items())]


def default_episodes(contract: dict, ds) -> list[int]:
    """The run's held-out episodes on its own training dataset; every episode of another dataset (a
    recording of placements it never saw: the run's val_episodes index its training data, not this)."""
    trained_on = contract.get("dataset")
    if trained_on and Path(trained_on).resolve() == ds.root.resolve():
        return [int(e) for e in contract.get("val_episodes") or []]
    return [int(e) for e in ds.episode_indices]


def open_loop_main(path: str, dataset: str | None = None, episodes=None, horizon: int | None = None, every: int = 8,
                   seed: int = 0, out_dir: str | None = None, device: str = "auto", num_steps: int = 10,
                   swap_prompts: bool = False) -> int:
    """The CLI: load the policy, default to its training dataset's held-out episodes (every episode of another
    --dataset), print and write the report."""
    from wamkit.data import LeRobotV3Dataset
    from wamkit.device import resolve_device
    from wamkit.eval.sim_eval import load_policy

    policy = load_policy(path, device=resolve_device(device), num_steps=num_steps)
    root = dataset or policy.contract.get("dataset")
    if not root:
        raise WamkitError("--dataset", "is not given and the policy's contract names no dataset", "pass --dataset DIR")
    ds = LeRobotV3Dataset(root)
    chosen = [int(e) for e in episodes] if episodes else default_episodes(policy.contract, ds)
    if not chosen:
        raise WamkitError("--episodes", "are not given and the run held out no validation episodes",
                          "pass --episodes (episodes the policy did not train on)")
    report = evaluate_open_loop(policy, ds, chosen, horizon or policy.chunk_length // 2 or 1, every, seed, swap_prompts)
    out = Path(out_dir or Path("eval") / "open_loop")
    write_report(report, out)
    for task, r in report["tasks"].items():
        print(f"{task}: {summary_line(report['names'], r)}")
    print(f"all: {summary_line(report['names'], report['all'])}")
    print(f"report: {out / 'report.md'}")
    return 0
