"""`wamkit eval wm-policy`: a forward-dynamics world model as a policy evaluator.

Each policy is run closed-loop INSIDE the world model instead of the simulator: from the recorded
first frame of a held-out episode it predicts a chunk (`Policy.predict`, raw observation in, raw
actions out), the world model generates the frames those actions lead to (`WorldModel.predict`),
and the policy re-plans from the last generated frame, until `max_steps` frames are imagined.

Score (needs no hidden simulator state): the recorded episodes are successful expert demonstrations
from the same initial state, so their last frame shows the task solved for that placement. An
imagined rollout scores the PSNR of its imagined frames to that goal frame: `best` (default) the
closest approach over frames 1..max_steps, because a simulated episode succeeds as soon as the goal
is reached (it stops there); `final` the last imagined frame. Scores average over episodes. Every
report also scores the same rollouts over the `changed` region alone (the pixels where the recorded
goal frame differs from the first: the arm and the task's object), where the whole-frame PSNR is
diluted by the static background, with its own rank correlation beside the primary one.

Policies are ranked by their mean rank over the episodes (on each episode the policies are ranked
by their score, 1 = the best; ties share): every episode counts once, whatever the spread of its
scores, where a mean of PSNRs lets a few episodes of wide spread decide (in each of seven MT10 judge
rankings of 7-9 policies, recomputed from their reports, the episode rank's correlation was at least
the mean score's: 0.79 against 0.62 on average; benchmarks/RESULTS.md). The ranking is set against
the policies' true closed-loop success rates (`wamkit eval sim` results.json) with Spearman's rho,
Kendall's tau-b and an exact permutation p-value; the mean score's correlation stands beside it.
References, not ranked: `expert` (the recorded actions through the world model: what a
known-successful policy scores in imagination), `static` (the first frame held: a policy that
does nothing) and, over two or more episodes, `swapped_actions` (each episode's first frame driven by
another episode's recorded actions: expert motion aimed at the wrong placement; a world model that
follows its actions scores it well below `expert`, one that imagines the expert's outcome whatever it is
told scores it alike, and then no score of its frames can rank policies).

The world model predicts no robot state. A policy or world model that uses a state row gets, with
`state="affine"`, the state advanced by the actions it took (a least-squares model fit on the dataset's
other episodes, wamkit.worldmodel.state_model; its fit on the evaluated episodes is in the report), or
with `state="recorded"` the RECORDED state at the same time index, an approximation that leaks the
expert's trajectory into the imagination (train both with data.use_state = false for an evaluator
that needs neither). World-model noise is seeded per (seed, episode, chunk) exactly as in
`rollout_episode`, so every policy sees the same noise (common random numbers) and a policy that
replays the recorded actions reproduces the `expert` reference."""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wamkit.data import LeRobotV3Dataset
from wamkit.data.canvas import split_canvas
from wamkit.eval.sim_eval import mean_sem
from wamkit.serve.camera_size import contract_sizes
from wamkit.worldmodel import metrics as M
from wamkit.worldmodel.report import PSNR_CAP_DB, _fmt, _json_safe, _separator, write_mp4
from wamkit.worldmodel.rollout import EpisodeData, WorldModel, WorldModelError, _seed_for, load_episode, rollout_episodes
from wamkit.worldmodel.state_model import AffineStateModel, StateTrack

STATE_MODES = ("none", "recorded", "affine")
STATE_FIT_MAX_EPISODES = 1000  # the affine state model's fit: a few hundred episodes pin its few dozen weights
SCORES = ("best", "final")
# regions a rollout is scored over: the whole frame (the primary score), and the pixels the recorded episode changes
SCORE_REGIONS = ("frame", "changed")
DEFAULT_POLICY_STEPS = 10  # a policy's denoising steps without a sim report to copy them from (eval sim's default)
RANKED_BY_TEXT = {"episode_rank": "ranked by the mean episode rank", "mean_score": "ranked by the mean score"}
CHANGED_THRESHOLD = 16.0  # of 255 on any channel: a pixel the recorded episode changed
CHANGED_DILATE_PX = 2  # grown by this much, so an arm or object a few pixels off still falls inside
EXACT_P_MAX_N = 8  # n! orderings enumerated for the permutation p-value
PERMUTATION_DRAWS = 100_000  # seeded random orderings for the p-value beyond EXACT_P_MAX_N policies
POLICY_MODES = ("policy", "mixed")


# ---- inputs ---------------------------------------------------------------------------------------
@dataclass
class SimReport:
    """The parts of a `wamkit eval sim` results.json that wm-policy reads."""

    path: str
    env_name: str
    task: str
    successes: int
    episodes: int
    success_rate: float
    ci95: tuple[float, float]
    execute_horizon: int
    num_steps: int
    training_step: int | None
    tasks: tuple[str, ...] = ()  # the task texts whose recorded episodes are imagined (several for a suite)
    mean_best_reward: float | None = None  # the sim's graded measure beside success (EvalResult.mean_best_reward)


def load_sim_report(path: str | Path) -> SimReport:
    """A results.json written by `wamkit eval sim` (or the directory holding it)."""
    path = Path(path).expanduser()
    file = path / "results.json" if path.is_dir() else path
    if not file.is_file():
        raise WorldModelError(str(path), "is not a `wamkit eval sim` results.json (or a directory holding one)",
                              "run `wamkit eval sim POLICY ENV --episodes N --seed S --out DIR` and pass DIR")
    try:
        data = json.loads(file.read_text())
    except ValueError as exc:
        raise WorldModelError(str(file), f"is not valid JSON: {exc}", "pass the results.json that eval sim wrote") from exc
    if isinstance(data, list):
        raise WorldModelError(str(file), "holds the results of every checkpoint (eval sim --all-checkpoints)",
                              "pass one step_<N>/results.json per policy, e.g. --sim-reports DIR/step_*")
    try:
        if "tasks" in data:  # a suite (eval sim ENV=metaworld/mt10): the average over its tasks, episodes of every task
            first = data["tasks"][0]
            return SimReport(str(file), ",".join(data["env_names"]), "; ".join(t["task"] for t in data["tasks"]),
                             int(data["successes"]), int(data["episodes"]), float(data["success_rate"]),
                             tuple(float(x) for x in data["ci95"]), int(first["execute_horizon"]), int(first["num_steps"]),
                             data.get("training_step"), tuple(str(t["task"]) for t in data["tasks"]),
                             data.get("mean_best_reward"))
        return SimReport(str(file), str(data["env_name"]), str(data["task"]), int(data["successes"]), int(data["episodes"]),
                         float(data["success_rate"]), tuple(float(x) for x in data["ci95"]), int(data["execute_horizon"]),
                         int(data["num_steps"]), data.get("training_step"), (str(data["task"]),), data.get("mean_best_reward"))
    except (KeyError, TypeError, ValueError) as exc:
        raise WorldModelError(str(file), f"lacks eval sim field {exc}", "pass the results.json that eval sim wrote") from exc


def policy_label(policy) -> str:
    """`<run>@<step>` for a checkpoint, the directory name for an export, `<method>@<step>` for a LeRobot
    policy (wamkit.eval.lerobot_adapter)."""
    src = policy.loaded.source
    if "export" in src:
        return Path(src["export"]).name
    if src.get("kind") == "lerobot":
        return f"{src.get('method') or src.get('policy')}@{src.get('step')}"
    return f"{Path(src['checkpoint']).parent.parent.name}@{src.get('step')}"


def check_pair(policy, wm: WorldModel, label: str, frame_size: int) -> None:
    """The policy must act in the world model's action space, at its rate, on its frames."""
    from wamkit.eval.sim_eval import _training_resolution

    mode = str(policy.loaded.model_info.get("mode", "policy"))
    if mode not in POLICY_MODES:
        raise WorldModelError(f"policy {label}", f"was trained in {mode!r} mode, which never learned to act from a frame",
                              "pass checkpoints trained with model.mode = 'policy' or 'mixed'")
    for what, p, w in (("action_dim", policy.action_dim, wm.action_dim), ("fps", policy.fps, wm.fps),
                       ("camera_keys", policy.camera_keys, wm.camera_keys),
                       ("canvas", policy.contract.get("canvas"), wm.contract.get("canvas"))):
        if p != w:
            raise WorldModelError(f"policy {label}: {what}", f"is {p}, the world model's is {w}",
                                  "evaluate policies and a world model trained on the same robot, cameras and frame size")
    trained = _training_resolution(policy)  # None when its dataset is gone: nothing to compare
    if trained is not None and trained != frame_size:
        raise WorldModelError(f"policy {label}: frame size", f"was trained on {trained} px frames, the world model "
                              f"generates {frame_size} px", "evaluate policies trained at the world model's frame size")
    if len(wm.camera_keys) > 1:
        layout = (wm.contract.get("canvas") or {}).get("camera_layout", "side_by_side")
        if layout != "side_by_side":
            raise WorldModelError("world model: canvas", f"its {len(wm.camera_keys)} cameras are tiled {layout!r}, which "
                                  "cannot be split back into the views a policy takes", "train both with camera_layout = 'side_by_side'")
        if contract_sizes(wm.contract, wm.camera_keys) is None:
            raise WorldModelError("world model: camera_sizes", "its data contract does not record its cameras' sizes, which "
                                  "splitting a canvas back into views needs", "re-train the world model with this wamkit version")


def check_state(policy, wm: WorldModel, state: str, label: str) -> None:
    """The world model generates no state: refuse to invent one unless asked for the recorded one."""
    if state not in STATE_MODES:
        raise WorldModelError("state", f"{state!r} is not understood", f"use one of {list(STATE_MODES)}")
    users = [name for name, m in ((f"policy {label}", policy), ("the world model", wm)) if m.use_state]
    if users and state == "none":
        raise WorldModelError("state", f"{' and '.join(users)} use(s) a robot state, which the world model does not predict",
                              "pass --state affine (advanced by the actions taken, a model fit on the dataset) or --state recorded "
                              "(the recorded episode's state at the same time step: an approximation that leaks the expert's "
                              "trajectory), or train with data.use_state = false")


def check_horizon(policy, wm: WorldModel, horizon: int, label: str) -> None:
    """Each re-planning step must be whole world-model chunks from one policy chunk."""
    if not 1 <= horizon <= policy.chunk_length or horizon % wm.chunk_length:
        raise WorldModelError(f"policy {label}: horizon", f"{horizon} actions per re-plan is not a multiple of the world "
                              f"model's chunk {wm.chunk_length} within the policy's chunk {policy.chunk_length}",
                              f"pass --horizon a multiple of {wm.chunk_length} (and run eval sim with the same --horizon)")


def pick_episodes(wm: WorldModel, dataset: LeRobotV3Dataset, tasks: tuple[str, ...] | None, episodes) -> list[int]:
    """Explicit episodes, else the world model's validation episodes of the evaluated task(s) (`tasks` None: of every task)."""
    if episodes:
        return [int(e) for e in episodes]
    val = [int(e) for e in wm.contract.get("val_episodes") or []]
    chosen = [e for e in val if tasks is None or dataset.episode_task(e) in tasks]
    if not chosen:
        same = [e for e in dataset.episode_indices if tasks is None or dataset.episode_task(e) in tasks][:8]
        problem = ("the world model has no validation episodes" if tasks is None else
                   f"none of the world model's validation episodes {val} is of the tasks {list(tasks)}")
        raise WorldModelError("episodes", problem, f"pass --episodes (episodes of that task: {same or 'none in this dataset'})")
    return chosen


# ---- imagination ----------------------------------------------------------------------------------
def imagine(policy, wm: WorldModel, eps: list[EpisodeData], policy_track: StateTrack | None, horizon: int, max_steps: int,
            seed: int = 0, num_steps: int | None = None, wm_track: StateTrack | None = None) -> torch.Tensor:
    """Closed-loop rollouts of `policy` inside `wm` from each episode's first frame; uint8
    [B, 1 + max_steps, H, W, 3] (frame 0 recorded). `policy_track` / `wm_track`: the raw states the policy /
    a state-using world model are shown (None for image-only models), advanced with every action taken."""
    t_wm = wm.chunk_length
    frames = torch.stack([ep.frames[0] for ep in eps])
    video, step = [frames], 0
    while step < max_steps:
        states = policy_track.now() if policy_track is not None else [None] * len(eps)
        obs = [{"image": policy_image(frames[i], wm), "prompt": ep.task, "state": states[i]} for i, ep in enumerate(eps)]
        chunks = policy.predict(obs, seed=_seed_for(seed, eps[0].episode, step, salt=13), num_steps=num_steps)
        actions = np.stack([c[:horizon] for c in chunks])
        for j in range(0, horizon, t_wm):
            t = step + j
            wm_states = torch.stack([wm.normalize_states(s) for s in wm_track.now()]) if wm.use_state else None
            out = wm.predict(frames, wm.normalize_actions(actions[:, j:j + t_wm]), wm_states, [ep.task for ep in eps],
                             [_seed_for(seed, ep.episode, t // t_wm) for ep in eps])
            video.append(out[:, 1:])
            frames = out[:, -1]
            for track in (policy_track, wm_track):
                if track is not None:
                    track.advance(actions[:, j:j + t_wm])
        step += horizon
    return torch.cat([video[0].unsqueeze(1), torch.cat(video[1:], 1)[:, :max_steps]], 1)


# ---- scoring --------------------------------------------------------------------------------------
def policy_image(canvas: torch.Tensor, wm: WorldModel):
    """A generated canvas as the policy takes it: the frame itself for one camera, else the list of its views at
    the sizes its contract records (the policy tiles them again into the same canvas: wamkit.data.canvas.split_canvas)."""
    if len(wm.camera_keys) == 1:
        return canvas.numpy()
    canvas_cfg = wm.contract.get("canvas") or {}
    views = split_canvas(canvas, contract_sizes(wm.contract, wm.camera_keys), canvas_cfg.get("camera_layout", "side_by_side"),
                         int(canvas_cfg.get("resolution", 0)))
    return [np.ascontiguousarray(v.numpy()) for v in views]


def changed_mask(first: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
    """bool [H, W]: where the recorded goal frame differs from the first (uint8 [H, W, 3] both), dilated by
    CHANGED_DILATE_PX: the arm's and the object's paths, without the background that dilutes a whole-frame PSNR."""
    changed = ((goal.float() - first.float()).abs().amax(-1) > CHANGED_THRESHOLD).float()
    k = 2 * CHANGED_DILATE_PX + 1
    return F.max_pool2d(changed[None, None], k, stride=1, padding=CHANGED_DILATE_PX)[0, 0] > 0


def goal_psnr(video: torch.Tensor, goal: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """PSNR [dB] of every frame of video [..., N, H, W, 3] to goal [H, W, 3] over the pixels of mask [H, W]
    (the whole frame when None or empty), capped at 100 dB (identical)."""
    if mask is None or not bool(mask.any()):
        return M.psnr(video, goal.expand_as(video)).clamp(max=PSNR_CAP_DB)
    weight = mask.to(torch.float64)[..., None]
    sq = (video.to(torch.float64) - goal.to(torch.float64)).pow(2) * weight
    mse = sq.sum(dim=(-3, -2, -1)) / (weight.sum() * video.shape[-1])
    return (10.0 * torch.log10(M.MAX**2 / mse)).clamp(max=PSNR_CAP_DB)


def region_curves(frames: torch.Tensor, ep: EpisodeData) -> dict[str, torch.Tensor]:
    """Goal-PSNR curves of frames [N, H, W, 3] for every SCORE_REGIONS entry, against ep's last frame."""
    goal = ep.frames[-1]
    return {"frame": goal_psnr(frames, goal), "changed": goal_psnr(frames, goal, changed_mask(ep.frames[0], goal))}


def rollout_score(curve: torch.Tensor, how: str = "best") -> float:
    """Outcome score of one imagined rollout from its goal-PSNR curve over frames 1..N."""
    if how not in SCORES:
        raise WorldModelError("score", f"{how!r} is not understood", f"use one of {list(SCORES)}")
    return float(curve.max() if how == "best" else curve[-1])


# ---- rank correlation -----------------------------------------------------------------------------
def average_ranks(x) -> np.ndarray:
    """Ranks 1..n, ties sharing their mean rank (as scipy.stats.rankdata)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tied = x == v
        ranks[tied] = ranks[tied].mean()
    return ranks


def _pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a - a.mean(-1, keepdims=True), b - b.mean(-1, keepdims=True)
    return (a * b).sum(-1) / np.sqrt((a * a).sum(-1) * (b * b).sum(-1))


def spearman(x, y) -> float | None:
    """Spearman's rho (Pearson correlation of average ranks); None when either side is constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    if np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return None
    return float(_pearson_rows(rx, ry))


def kendall_tau_b(x, y) -> float | None:
    """Kendall's tau-b (tie-corrected); None when either side is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    i, j = np.triu_indices(len(x), 1)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    den = math.sqrt(float(np.count_nonzero(sx)) * float(np.count_nonzero(sy)))
    return float((sx * sy).sum() / den) if den > 0 else None


def spearman_p_exact(x, y) -> float | None:
    """Two-sided exact permutation p-value of Spearman's rho: the share of all n! pairings whose |rho|
    reaches the observed one (None for n > EXACT_P_MAX_N or an undefined rho). With 3 policies even a
    perfect ranking has p = 1/3."""
    rho = spearman(x, y)
    if rho is None or len(x) > EXACT_P_MAX_N:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    perms = rx[np.array(list(itertools.permutations(range(len(rx)))))]
    rhos = _pearson_rows(perms, np.broadcast_to(ry, perms.shape))
    return float(np.mean(np.abs(rhos) >= abs(rho) - 1e-12))


def spearman_p_permutation(x, y, draws: int = PERMUTATION_DRAWS, seed: int = 0) -> float | None:
    """Two-sided permutation p-value of Spearman's rho from `draws` seeded random orderings, for policy counts
    whose n! orderings are too many to enumerate: (hits + 1) / (draws + 1), never 0 (None for an undefined rho)."""
    rho = spearman(x, y)
    if rho is None:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    perms = np.random.default_rng(seed).permuted(np.broadcast_to(rx, (draws, len(rx))), axis=1)
    rhos = _pearson_rows(perms, np.broadcast_to(ry, perms.shape))
    return float((np.sum(np.abs(rhos) >= abs(rho) - 1e-12) + 1) / (draws + 1))


def spearman_p(x, y) -> tuple[float | None, str]:
    """(two-sided p-value of Spearman's rho, how it was computed): exact up to EXACT_P_MAX_N policies, else drawn."""
    if len(x) <= EXACT_P_MAX_N:
        return spearman_p_exact(x, y), "exact permutation"
    return spearman_p_permutation(x, y), f"permutation, {PERMUTATION_DRAWS:,} seeded draws"


def rank_correlation(predicted, true) -> dict:
    """Spearman, Kendall and the p-value of predicted scores against true success rates."""
    p, method = spearman_p(predicted, true)
    out = {"n": len(predicted), "spearman_rho": spearman(predicted, true), "kendall_tau_b": kendall_tau_b(predicted, true),
           "spearman_p_exact": spearman_p_exact(predicted, true), "spearman_p": p, "spearman_p_method": method}
    if out["spearman_rho"] is None:
        out["note"] = "undefined: the true success rates (or the predicted scores) are all equal"
    return out


# ---- evaluation -----------------------------------------------------------------------------------
def _episode_rows(dataset: LeRobotV3Dataset, key: str, episodes: list[int]) -> list[np.ndarray]:
    """The raw rows [L, S] of column `key` of each episode."""
    return [dataset.episode_columns(e, [key])[key].reshape(dataset.episode_length(e), -1).astype(np.float64) for e in episodes]


def state_keys(policies: list, wm: WorldModel) -> list[str]:
    """The state columns the policies and the world model read (none for image-only models)."""
    keys = [m.contract["state_key"] for m in (*policies, wm) if m.use_state]
    return list(dict.fromkeys(keys))


def fit_state_models(dataset: LeRobotV3Dataset, keys: list[str], action_key: str, eps: list[EpisodeData]) -> dict:
    """{key: (AffineStateModel, its fit_report)}: each state column's model fit on the dataset's episodes outside
    `eps` and reported on `eps`."""
    evaluated = [ep.episode for ep in eps]
    skip = set(evaluated)
    fit_on = [e for e in dataset.episode_indices if e not in skip][:STATE_FIT_MAX_EPISODES]
    if not fit_on:
        raise WorldModelError("state", "= 'affine' needs episodes besides the evaluated ones to fit its state model on",
                              "evaluate fewer episodes (--episodes) or pass --state recorded")
    actions_fit = _episode_rows(dataset, action_key, fit_on)
    actions_eval = [ep.actions for ep in eps]
    models = {}
    for key in keys:
        model = AffineStateModel.fit(_episode_rows(dataset, key, fit_on), actions_fit)
        models[key] = (model, model.fit_report(_episode_rows(dataset, key, evaluated), actions_eval))
    return models


def _track(model, dataset: LeRobotV3Dataset, eps: list[EpisodeData], state_models: dict) -> StateTrack | None:
    """The state a model (policy or world model) is shown over a batch of episodes: None for an image-only one."""
    if not model.use_state:
        return None
    key = model.contract["state_key"]
    fitted = state_models.get(key)
    return StateTrack(_episode_rows(dataset, key, [ep.episode for ep in eps]), fitted[0] if fitted else None)


def score_policy(policy, wm: WorldModel, dataset: LeRobotV3Dataset, eps: list[EpisodeData], horizon: int,
                 max_steps: int, how: str, seed: int, num_steps: int | None, max_batch: int = 8,
                 state_models: dict | None = None):
    """({region: per-episode scores}, {region: goal-PSNR curves}, the first episode's video) of one policy
    imagined on every episode; other videos are dropped as soon as they are scored (they can be large).
    `state_models` (fit_state_models): the states advanced by the actions taken; without it, the recorded ones."""
    scores, curves, first = {r: [] for r in SCORE_REGIONS}, {r: [] for r in SCORE_REGIONS}, None
    for i in range(0, len(eps), max_batch):
        batch = eps[i:i + max_batch]
        tracks = [_track(m, dataset, batch, state_models or {}) for m in (policy, wm)]
        video = imagine(policy, wm, batch, tracks[0], horizon, max_steps, seed, num_steps, wm_track=tracks[1])
        first = video[0] if first is None else first
        for ep, v in zip(batch, video):
            for region, curve in region_curves(v[1:], ep).items():
                curves[region].append(curve)
                scores[region].append(rollout_score(curve, how))
    return scores, curves, first


def swapped_actions(eps: list[EpisodeData]) -> list[EpisodeData]:
    """Each episode with the recorded actions of the one half the list away (cut to its length, or its last action
    held): episodes listed by index are grouped by task in a multi-task recording, so the swap crosses tasks where
    the next episode would often be a nearby placement of the same task (a weak contrast)."""
    out, apart = [], max(1, len(eps) // 2)
    for i, ep in enumerate(eps):
        other, n = eps[(i + apart) % len(eps)].actions[:len(ep.actions)], len(ep.actions)
        out.append(replace(ep, actions=np.pad(other, ((0, n - len(other)), (0, 0)), mode="edge")))
    return out


def _states_for_actions(wm: WorldModel, driven: list[EpisodeData], state_models: dict) -> list[EpisodeData]:
    """The world model's state rows advanced by the actions each episode is driven with (the judge's `affine`
    mode, as its policies get them), or the recorded rows when the judge shows the recorded state. Without this a
    reference driven by another episode's actions would be shown the arm's recorded positions, and a world model
    that draws the arm where its state row says would look as if it followed those actions."""
    fitted = state_models.get(wm.contract.get("state_key")) if wm.use_state else None
    if fitted is None:
        return driven
    return [replace(ep, states=fitted[0].roll(ep.states[0], ep.actions)) for ep in driven]


def reference_scores(wm: WorldModel, eps: list[EpisodeData], max_steps: int, how: str, seed: int,
                     state_models: dict | None = None) -> dict:
    """Unranked anchors scored like the policies: the recorded actions through the world model
    (`expert`), the first frame held (`static`) and, over two or more episodes, another episode's
    recorded actions through it (`swapped_actions`: does the world model follow what it is told?).
    `state_models` (fit_state_models, the judge's `affine` mode): the world model's state follows the
    driving actions, as it does for the policies; without it, the recorded state."""
    imagined = {"expert": eps, **({"swapped_actions": swapped_actions(eps)} if len(eps) > 1 else {})}
    scores = {name: {r: [] for r in SCORE_REGIONS} for name in (*imagined, "static")}
    for name, driven in imagined.items():
        driven = _states_for_actions(wm, driven, state_models or {})
        for ep, rollout in zip(eps, rollout_episodes(wm, driven, "autoregressive", seed)):
            frames = torch.cat([c[1:] for c in rollout.pred])[:max_steps]
            for region, curve in region_curves(frames, ep).items():  # scored against the episode's own goal
                scores[name][region].append(rollout_score(curve, how))
    for ep in eps:
        for region, curve in region_curves(ep.frames[:1], ep).items():
            scores["static"][region].append(rollout_score(curve, how))
    return {name: _scored(by_region) for name, by_region in scores.items()}


UNMOVED_DB = 0.02  # an episode whose score moves less than this when its actions are swapped did not respond to them


def action_response(references: dict) -> dict | None:
    """`expert` minus `swapped_actions`, episode by episode (whole frame, dB): how much the imagined outcome
    depends on the actions. Near 0 on most episodes: the world model imagines the same future whatever it is told,
    and no score of its frames can rank policies. None without the swapped reference (one episode)."""
    if "swapped_actions" not in references:
        return None
    gaps = [e - s for e, s in zip(references["expert"]["per_episode"], references["swapped_actions"]["per_episode"])]
    mean, sem = mean_sem(gaps)
    return {"mean_db": mean, "sem_db": sem, "episodes": len(gaps), "unmoved": sum(abs(g) < UNMOVED_DB for g in gaps)}


def action_response_text(response: dict) -> str:
    """One line for report.md, the CLI and the MT10 report."""
    return (f"Action response (expert minus swapped_actions, per episode): {_fmt(response['mean_db'], 2)} ± "
            f"{_fmt(response['sem_db'], 2)} dB; {response['unmoved']} of {response['episodes']} episodes moved less "
            f"than {UNMOVED_DB} dB when given another episode's actions.")


def _scored(by_region: dict[str, list[float]]) -> dict:
    """The primary (whole-frame) score's mean, s.e. and per-episode values, and every region's mean and s.e."""
    mean, sem = mean_sem(by_region["frame"])
    return {"score": mean, "sem": sem, "per_episode": by_region["frame"],
            "by_region": {r: dict(zip(("score", "sem"), mean_sem(v))) for r, v in by_region.items()}}


def strip_image(rows: dict[str, torch.Tensor], goal: torch.Tensor, every: int) -> np.ndarray:
    """One row per rollout (frames 0, every, 2*every, ... and its last), then the goal frame."""
    lines = []
    for video in rows.values():
        idx = sorted(set(range(0, len(video), every)) | {len(video) - 1})
        tiles = [t for k in idx for t in (video[k].numpy(), _separator(video.shape[1]))]
        lines.append(np.concatenate(tiles + [goal.numpy()], axis=1))
    widest = max(x.shape[1] for x in lines)
    lines = [np.pad(x, ((0, 2), (0, widest - x.shape[1]), (0, 0)), constant_values=255) for x in lines]
    return np.concatenate(lines, axis=0)


def write_media(out: Path, label: str, video: torch.Tensor, goal: torch.Tensor, fps: float) -> str:
    """videos/<run>_step<N>.mp4: the first episode's imagined rollout | its goal frame."""
    name = f"videos/{label.replace('/', '_').replace('@', '_step')}.mp4"
    goal_col = goal.expand_as(video).numpy()
    sep = np.broadcast_to(_separator(video.shape[1]), (len(video), video.shape[1], 2, 3))
    write_mp4(out / name, np.concatenate([video.numpy(), sep, goal_col], axis=2), fps)
    return name


def summary_lines(report: dict) -> list[str]:
    """The policy table (references below it) and the rank correlation: report.md's core and the CLI's output."""
    if "correlation" not in report:
        return ranking_lines(report)
    c = report["correlation"]
    lines = _policy_table(report, report["policies"], with_sim=True)
    by = RANKED_BY_TEXT[c.get("ranked_by", "mean_score")]
    lines += ["", f"**Spearman rho {_fmt(c['spearman_rho'])}** ({by}) {_correlation_text(c)} " + c.get("note", "")]
    mean_score = report.get("correlation_by_aggregate", {}).get("mean_score")
    if mean_score and c.get("ranked_by") != "mean_score":
        lines += ["", f"Ranked by the mean score instead: Spearman rho {_fmt(mean_score['spearman_rho'])} {_correlation_text(mean_score)}"]
    graded = report.get("correlation_with_best_reward")
    if graded:
        lines += ["", f"Against the sim's best shaped reward instead of success (fewer ties, less binomial noise): Spearman "
                  f"rho {_fmt(graded['spearman_rho'])} {_correlation_text(graded)}"]
    changed = report.get("correlation_by_region", {}).get("changed")
    if changed:
        lines += ["", f"The mean score over the changed region alone: Spearman rho {_fmt(changed['spearman_rho'])} "
                  f"{_correlation_text(changed)}"]
    return lines


def ranking_lines(report: dict) -> list[str]:
    """summary_lines of a judge run without sim reports: the world model's ranking alone, best first."""
    best_first = sorted(report["policies"], key=lambda row: row["predicted_rank"])
    return _policy_table(report, best_first, with_sim=False) + [
        "", "No sim reports: the world model's ranking alone, best first (pass one `wamkit eval sim` results.json per "
        "policy with --sim-reports to rank-correlate it with sim success)."]


def _policy_table(report: dict, rows: list[dict], with_sim: bool) -> list[str]:
    """The policies' rows (with their sim success, CI and true rank when `with_sim`), the references below
    them and the action response."""
    sim_heads = ["true success", "95% CI", "true rank"] if with_sim else []
    heads = ["policy", "predicted score [dB]", "± s.e.", "mean episode rank", "predicted rank", *sim_heads, "changed-region score [dB]"]
    lines = ["| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    for p in rows:
        sim = [f"{p['successes']}/{p['sim_episodes']} = {p['success_rate']:.3f}", f"{p['ci95'][0]:.3f} – {p['ci95'][1]:.3f}",
               f"{p['true_rank']:g}"] if with_sim else []
        cells = [p["label"], _fmt(p["score"], 2), _fmt(p["sem"], 2), _fmt(p.get("episode_rank"), 2), f"{p['predicted_rank']:g}",
                 *sim, _changed_score(p)]
        lines.append("| " + " | ".join(cells) + " |")
    for name, ref in report["references"].items():
        cells = [f"*{name} (reference)*", _fmt(ref["score"], 2), _fmt(ref["sem"], 2), "", "", *[""] * len(sim_heads), _changed_score(ref)]
        lines.append("| " + " | ".join(cells) + " |")
    response = action_response(report["references"])
    return lines + (["", action_response_text(response)] if response else [])


def _correlation_text(c: dict) -> str:
    """What follows a correlation's rho: its p-value and how it was computed, Kendall's tau-b and n."""
    return (f"(two-sided p {_fmt(c.get('spearman_p', c['spearman_p_exact']))}, "
            f"{c.get('spearman_p_method', 'exact permutation')}), Kendall tau-b {_fmt(c['kendall_tau_b'])}, n = {c['n']} policies.")


def _changed_score(row: dict) -> str:
    """The changed-region score ± its s.e. (blank for a report written before regions were scored)."""
    r = row.get("by_region", {}).get("changed")
    return f"{_fmt(r['score'], 2)} ± {_fmt(r['sem'], 2)}" if r else ""


def write_markdown(path: Path, report: dict) -> None:
    s = report["settings"]
    lines = [
        "# World model as a policy evaluator", "",
        "world model: `" + ", ".join(f"{k}={v}" for k, v in report["world_model"].items()) + "`  ", f"dataset: `{report['dataset']}`  episodes: {report['episodes']} "
        f"(held out: {report['held_out']})  ",
        f"env: `{report['env_name']}`  task: \"{report['task']}\"  " if report["env_name"] else "env: none (no sim reports)  ",
        f"score: **{s['score']}** PSNR [dB] of frames 1..{s['max_steps']} to the recorded goal (last) frame; "
        f"state: {s['state']}; world model {s['num_steps']} {s['solver']} steps, seed {s['seed']}", "",
        *summary_lines(report), "",
        "Ranks: 1 = best. `expert` rolls the recorded actions through the world model; `static` holds the first frame. "
        "strip.png: one row per policy (table order), every chunk of the first episode, then the goal frame.",
    ]
    if s["state"] == "recorded":
        lines += ["", "State: the recorded (expert) state was fed at each time step, an approximation that favours "
                  "expert-like behaviour."]
    for key, fit in (report.get("state_model") or {}).items():
        lines += ["", f"State `{key}`: advanced by the actions taken (an affine model fit on {fit.get('fit_transitions')} "
                  f"steps of other episodes). On the evaluated episodes, per value: R^2 of the one-step change "
                  f"{_values(fit.get('step_change_r2'))}; mean |error| after an open-loop roll of the recorded actions "
                  f"{_values(fit.get('final_drift'))} (the recorded range {_values(fit.get('range'))})."]
    lines += ["", "## Files", ""] + [f"- `{f}`" for f in report["files"]] + [""]
    path.write_text("\n".join(lines))


def _values(xs) -> str:
    return "[" + ", ".join(_fmt(x, 3) for x in xs) + "]" if xs else "-"


def _check_counts(n_policies: int, n_reports: int, min_policies: int = 2) -> None:
    """Enough policies, and one sim report for each or none (the world model's ranking alone)."""
    if n_policies < min_policies:
        raise WorldModelError("policies", f"got {n_policies}; this needs at least {min_policies}",
                              "pass several policies (e.g. checkpoints of one run: --policies RUN/checkpoints/iter_*)")
    if n_reports and n_reports != n_policies:
        raise WorldModelError("sim-reports", f"got {n_reports} for {n_policies} policies",
                              "pass one `wamkit eval sim` results.json per policy, in the order of --policies")


def _check_reports(policies: list, reports: list[SimReport], labels: list[str], min_policies: int = 2) -> None:
    """One report per policy (or none), all from one env, each for its policy's training step."""
    _check_counts(len(policies), len(reports), min_policies)
    _check_env_and_steps(reports, [p.loaded.source.get("step") for p in policies], labels, "pass the reports in the order of --policies")


def _check_env_and_steps(reports: list[SimReport], steps: list, labels: list[str], order_fix: str) -> None:
    """The reports come from one env, and each is for its policy's training step (where both are known)."""
    envs = sorted({r.env_name for r in reports})
    if len(envs) > 1:
        raise WorldModelError("sim-reports", f"come from different envs {envs}", "compare policies on one env")
    for report, step, label in zip(reports, steps, labels):
        if report.training_step is not None and step is not None and int(step) >= 0 and int(step) != report.training_step:
            raise WorldModelError(f"sim report {report.path}", f"is for training step {report.training_step}, "
                                  f"policy {label} is step {step}", order_fix)


def _prepare(wm: WorldModel, policies: list, reports: list[SimReport], dataset: LeRobotV3Dataset, episodes, state: str,
             score: str, horizon: int | None, min_policies: int = 2):
    """Every check that needs no sampling, then (labels, re-planning horizons, loaded episodes)."""
    if score not in SCORES:
        raise WorldModelError("score", f"{score!r} is not understood", f"use one of {list(SCORES)}")
    labels = _unique([policy_label(p) for p in policies])
    _check_reports(policies, reports, labels, min_policies)
    # without sim reports: what `wamkit eval sim` defaults to (the whole chunk), over every task's held-out episodes
    horizons = [int(horizon or (r.execute_horizon if r else p.chunk_length)) for p, r in zip(policies, _each(reports, policies))]
    eps = [load_episode(dataset, e, wm.contract) for e in pick_episodes(wm, dataset, reports[0].tasks if reports else None, episodes)]
    too_short = [ep.episode for ep in eps if len(ep.frames) < wm.chunk_length + 1]
    if too_short:
        raise WorldModelError("episodes", f"{too_short} have fewer than chunk_length + 1 = {wm.chunk_length + 1} frames",
                              "pick longer episodes")
    for p, label, h in zip(policies, labels, horizons):
        check_pair(p, wm, label, int(eps[0].frames.shape[1]))
        check_state(p, wm, state, label)
        check_horizon(p, wm, h, label)
    return labels, horizons, eps


def _each(reports: list[SimReport], policies: list) -> list[SimReport | None]:
    """Each policy's sim report, or None for every policy when the judge ranks them without any."""
    return list(reports) if reports else [None] * len(policies)


def _policy_row(label: str, policy, report: SimReport | None, horizon: int, scores: dict, curves: dict, wall: float) -> dict:
    return {"label": label, "source": policy.loaded.source, "execute_horizon": horizon, **_scored(scores), **_sim_fields(report),
            "goal_psnr_by_step": [float(x) for x in torch.stack(curves["frame"]).mean(0)], "wall_seconds": wall}


def _sim_fields(report: SimReport | None) -> dict:
    """A row's sim success, from its `wamkit eval sim` report (None: the row has none)."""
    if report is None:
        return {"sim_report": None, "success_rate": None, "best_reward": None}
    return {"sim_report": report.path, "success_rate": report.success_rate, "best_reward": report.mean_best_reward,
            "successes": report.successes, "sim_episodes": report.episodes, "ci95": list(report.ci95)}


def _have_success(rows: list[dict]) -> bool:
    """Whether every row carries its sim success (a judge run without sim reports ranks without it)."""
    return all(r.get("success_rate") is not None for r in rows)


def episode_ranks(per_episode: list[list[float]]) -> np.ndarray | None:
    """Each policy's mean rank over the episodes: on every episode the policies ranked by score (1 = the
    highest, ties share their mean rank), then averaged. None unless every policy has one score per
    episode of one common set (rows of a report written before per-episode scores were kept)."""
    if not per_episode or any(not p for p in per_episode) or len({len(p) for p in per_episode}) != 1:
        return None
    scores = np.asarray(per_episode, dtype=np.float64)  # policies x episodes
    return np.mean([average_ranks(-scores[:, e]) for e in range(scores.shape[1])], axis=0)


def _correlations(rows: list[dict]) -> dict:
    """The primary rank correlation (by episode rank where every row has one, else by mean score), the mean
    score's beside it, and one per score region that every row carries (merged reports may mix rows written
    before regions were scored: those regions are left out). None without every row's sim success."""
    if not _have_success(rows):
        return {}
    true = [r["success_rate"] for r in rows]
    by_region = {region: rank_correlation([r["by_region"][region]["score"] for r in rows], true)
                 for region in SCORE_REGIONS if all(region in r.get("by_region", {}) for r in rows)}
    by_aggregate = {"mean_score": rank_correlation([r["score"] for r in rows], true)}
    if all("episode_rank" in r for r in rows):
        by_aggregate["episode_rank"] = rank_correlation([-r["episode_rank"] for r in rows], true)
    primary = "episode_rank" if "episode_rank" in by_aggregate else "mean_score"
    out = {"correlation": {**by_aggregate[primary], "ranked_by": primary}, "correlation_by_aggregate": by_aggregate,
           "correlation_by_region": by_region}
    if all(r.get("best_reward") is not None for r in rows):  # the same ranking against the sim's graded measure:
        predicted = [-r["episode_rank"] for r in rows] if primary == "episode_rank" else [r["score"] for r in rows]
        out["correlation_with_best_reward"] = rank_correlation(predicted, [r["best_reward"] for r in rows])
    return out


def _add_ranks(rows: list[dict]) -> None:
    """Each row's mean episode rank among these rows (when all have per-episode scores), and its predicted
    rank from it (else from the mean score) and its true one: rank 1 = the best predicted / the highest true
    success rate (ties share their mean rank). Merging recomputes them over the merged rows."""
    ranks = episode_ranks([r.get("per_episode") for r in rows])
    for r in rows:
        r.pop("episode_rank", None)
    if ranks is not None:
        for r, er in zip(rows, ranks):
            r["episode_rank"] = float(er)
    predicted = average_ranks(ranks if ranks is not None else -np.asarray([r["score"] for r in rows]))
    true = average_ranks(-np.asarray([r["success_rate"] for r in rows])) if _have_success(rows) else [None] * len(rows)
    for r, pr, tr in zip(rows, predicted, true):
        r["predicted_rank"], r["true_rank"] = float(pr), (None if tr is None else float(tr))


def evaluate_policies(wm: WorldModel, policies: list, reports: list[SimReport] | None, dataset: LeRobotV3Dataset, out_dir: Path,
                      episodes=None, state: str = "none", score: str = "best", horizon: int | None = None,
                      max_steps: int | None = None, policy_steps: int | None = None, seed: int = 0,
                      videos: bool = True, min_policies: int = 2) -> dict:
    """Imagine every policy on every episode, score it, rank-correlate with the true success rates (`reports`,
    one `wamkit eval sim` report per policy; without them the world model's ranking alone, for policies that no
    simulator can evaluate); writes out_dir/report.{json,md}, videos/ and strip.png. `min_policies` = 1 scores a lone policy (no
    correlation) for `merge_reports` to rank beside others scored by the same world model elsewhere."""
    reports = list(reports or [])
    labels, horizons, eps = _prepare(wm, policies, reports, dataset, episodes, state, score, horizon, min_policies)
    state_models = (fit_state_models(dataset, state_keys(policies, wm), wm.contract.get("action_key") or "action", eps)
                    if state == "affine" else {})
    steps = int(max_steps or max(len(ep.frames) - 1 for ep in eps))
    goal = eps[0].frames[-1]
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, files, strips = [], [], {}
    for policy, report, label, h in zip(policies, _each(reports, policies), labels, horizons):
        wall = time.perf_counter()
        steps_per_chunk = policy_steps or (report.num_steps if report else DEFAULT_POLICY_STEPS)
        scores, curves, strips[label] = score_policy(policy, wm, dataset, eps, h, steps, score, seed, steps_per_chunk,
                                                     state_models=state_models)
        rows.append(_policy_row(label, policy, report, h, scores, curves, time.perf_counter() - wall))
        if videos:
            files.append(write_media(out_dir, label, strips[label], goal, wm.fps))
    _add_ranks(rows)
    if videos:
        from PIL import Image

        Image.fromarray(strip_image(strips, goal, wm.chunk_length)).save(out_dir / "strip.png")
        files.append("strip.png")
    val = set(int(e) for e in wm.contract.get("val_episodes") or [])
    report = _json_safe({
        "format": "wamkit-wm-policy-report", "version": 1, "world_model": wm.loaded.source, "dataset": str(dataset.root),
        "env_name": reports[0].env_name if reports else None, "task": reports[0].task if reports else None,
        "episodes": [ep.episode for ep in eps],
        "held_out": all(ep.episode in val for ep in eps),
        "settings": {"score": score, "state": state, "max_steps": steps, "seed": seed, "num_steps": wm.num_steps,
                     "solver": wm.solver, "guidance": wm.guidance, "shift": wm.shift_for(eps[0].frames[0]),
                     "policy_steps": policy_steps, "chunk_length": wm.chunk_length, "fps": wm.fps},
        "state_model": {key: fit for key, (_, fit) in state_models.items()},
        "policies": rows, "references": reference_scores(wm, eps, steps, score, seed, state_models), **_correlations(rows),
        "files": files + ["report.json", "report.md"],
    })
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    write_markdown(out_dir / "report.md", report)
    return report


MERGE_KEYS = ("format", "world_model", "dataset", "env_name", "episodes", "settings")  # what makes two reports one judge's


def _judge_report_file(path: str | Path) -> Path:
    """A judge report's report.json, given the file or its directory."""
    path = Path(path)
    return path / "report.json" if path.is_dir() else path


def load_judge_report(path: str | Path) -> tuple[Path, dict]:
    """(report.json's path, its contents) of a `wamkit eval wm-policy` report: the file or its directory."""
    path = _judge_report_file(path)
    if not path.is_file():
        raise WorldModelError(f"report {path}", "does not exist", "pass a `wamkit eval wm-policy` output directory or its report.json")
    report = json.loads(path.read_text())
    if report.get("format") != "wamkit-wm-policy-report":
        raise WorldModelError(f"report {path}", f"has format {report.get('format')!r}, not a world-model judge report",
                              "pass report.json files written by `wamkit eval wm-policy`")
    return path, report


def merge_reports(sources: list, out_dir: Path, sim_reports: list | None = None) -> dict:
    """One ranking from judge reports that one world model wrote with the same settings over the same
    episodes (wamkit checkpoints judged by `wamkit eval wm-policy`, LeRobot policies judged in the process
    that trained them: benchmarks/policy_quality.py --judge-world-model): the rows side by side, ranks and
    the rank correlation computed again; writes out_dir/report.{json,md}. `sim_reports`: one `wamkit eval sim`
    results.json per row, in the merged order, for rows judged without one (a judge that ran beside the closed
    loops, before their results existed)."""
    loaded = [load_judge_report(p) for p in sources]
    (first_path, first), rows = loaded[0], []
    for path, report in loaded:
        for key in MERGE_KEYS:
            if report.get(key) != first.get(key):
                raise WorldModelError(f"report {path}: {key}", f"is {report.get(key)}, {first_path}'s is {first.get(key)}",
                                      "merge reports of one world model, one episode set and the same settings "
                                      "(run the judge again with them)")
        rows += [dict(row) for row in report["policies"]]
    _check_counts(len(rows), len(rows))
    for row, label in zip(rows, _unique([r["label"] for r in rows])):
        row["label"] = label
    merged = {**first, "merged_from": [str(p) for p, _ in loaded], "files": ["report.json", "report.md"]}
    for key in ("correlation", "correlation_by_aggregate", "correlation_by_region", "correlation_with_best_reward"):
        merged.pop(key, None)  # computed again below, over the merged rows
    if sim_reports:
        reports = [load_sim_report(p) for p in sim_reports]
        attach_sim_reports(rows, reports)
        merged.update(env_name=reports[0].env_name, task=reports[0].task)
    _add_ranks(rows)
    merged.update(policies=rows, **_correlations(rows))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(merged, indent=2, allow_nan=False))
    write_markdown(out_dir / "report.md", merged)
    return merged


def attach_sim_reports(rows: list[dict], reports: list[SimReport]) -> None:
    """Each row's sim success from its report (one per row, in order, one env, each for its row's training step)."""
    if len(reports) != len(rows):
        raise WorldModelError("sim-reports", f"got {len(reports)} for {len(rows)} policies",
                              "pass one `wamkit eval sim` results.json per merged policy, in the merged order")
    _check_env_and_steps(reports, [r["source"].get("step") for r in rows], [r["label"] for r in rows],
                         "pass the reports in the merged order")
    for row, report in zip(rows, reports):
        if row.get("success_rate") is not None:
            raise WorldModelError(f"sim report {report.path}", f"is given for {row['label']}, which has its sim success already",
                                  "pass sim reports only when merging reports judged without them")
        row.update(_sim_fields(report))


def merge_main(sources: list, out_dir: str | None = None, sim_reports: list | None = None) -> int:
    """`wamkit eval wm-policy-merge`: merge, print the table; 0 on success."""
    out = Path(out_dir) if out_dir else _judge_report_file(sources[0]).parent.parent / "merged"
    report = merge_reports(sources, out, sim_reports)
    print("\n".join(summary_lines(report)))
    print(f"wrote {out / 'report.md'}")
    return 0


def _unique(labels: list[str]) -> list[str]:
    """Labels made distinct by a #k suffix (the same checkpoint may be passed twice)."""
    return [lab if labels.count(lab) == 1 else f"{lab}#{labels[:i].count(lab)}" for i, lab in enumerate(labels)]


def eval_wm_policy_main(world_model, policies, sim_reports, dataset=None, episodes=None, out_dir=None, state: str = "none",
                        score: str = "best", horizon: int | None = None, max_steps: int | None = None,
                        policy_steps: int | None = None, num_steps: int = 30, shift: float | None = None,
                        guidance: float = 1.0, solver: str = "euler", seed: int = 0, videos: bool = True,
                        device: str = "cpu", dtype: str = "auto") -> int:
    """`wamkit eval wm-policy`: load everything, evaluate, print the table; 0 on success."""
    from wamkit.eval.sim_eval import load_policy

    reports = [load_sim_report(p) for p in sim_reports or []]  # cheap checks before loading any model
    _check_counts(len(policies), len(reports))
    wm = WorldModel.from_path(world_model, device=device, dtype=dtype, num_steps=num_steps, shift=shift, guidance=guidance, solver=solver)
    loaded = [load_policy(p, device=device, dtype=dtype) for p in policies]
    ds = LeRobotV3Dataset(dataset or wm.contract["dataset"])
    out = Path(out_dir) if out_dir else Path("eval") / "wm_policy" / (reports[0].env_name.replace("/", "_") if reports else "imagined")
    report = evaluate_policies(wm, loaded, reports, ds, out, episodes=episodes, state=state, score=score, horizon=horizon,
                               max_steps=max_steps, policy_steps=policy_steps, seed=seed, videos=videos)
    print("\n".join(summary_lines(report)))
    print(f"wrote {out / 'report.md'}")
    return 0
