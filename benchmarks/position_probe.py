"""What a policy's action head knows of an object's position: a linear probe (diagnostic, issue 26).

A policy that solves push from the object's recorded position (the privileged-state testbed) and fails it from
the frame either does not encode where the puck is, or encodes it and does not act on it. This reads the hidden
states the action head reads (the input of `action_proj_out` at the chunk's rows, averaged over the rows) in
recorded frames, fits a ridge regression from them to the object's position on the first episodes (its strength
chosen by cross-validation over those episodes) and reports its error on the rest, in centimetres, beside the same probe on the raw pixels, on the observed frame's tokens where
they enter the trunk, on the hand's state alone, and the spread of the position itself (what predicting the mean
costs): a position the pixels and the input tokens give and the action head's input does not is lost in the trunk.
With `model.vision_stem = "action_keypoints"` or `"action_eye"` a last column probes the read-out the action rows are given.
The positions come from a second recording of the same episodes made with the privileged state
(`benchmarks/privileged_state.patch`: columns obj_x, obj_y, goal_x, goal_y after the hand's four), aligned frame
by frame.

    python benchmarks/position_probe.py RUN --frames /tmp/tb/pu50_z2 --positions /tmp/tb/pu50_priv [--every 4] [--before 40]
"""

from __future__ import annotations

import argparse

import numpy as np

from wamkit.data.lerobot_v3 import LeRobotV3Dataset
from wamkit.eval.open_loop import load_recorded
from wamkit.policy.policy import Policy

TARGETS = "obj=4:6,goal=6:8"  # columns of the privileged state (benchmarks/privileged_state.patch)


def parse_targets(text: str) -> dict[str, tuple[int, int]]:
    """"name=a:b,..." -> {name: (a, b)}: each target a slice of --positions' observation.state columns."""
    out = {}
    for item in text.split(","):
        name, _, span = item.partition("=")
        a, _, b = span.partition(":")
        out[name.strip()] = (int(a), int(b))
    return out


def probe_steps(length: int, every: int, before: int) -> list[int]:
    """The recorded steps probed: every `every`-th, and only those before `before` (0: all)."""
    return list(range(0, min(length, before) if before else length, every))


def action_head_features(policy: Policy, dataset: LeRobotV3Dataset, episodes: list[int], every: int, before: int,
                         seed: int = 0):
    """Per probed step of each episode: the action head's input averaged over the chunk's rows [N, hidden], the
    observed frame's tokens as the trunk receives them (proj_in's output, the stem included) [N, tokens * hidden],
    the frames [N, H*W*3] and the hand states."""
    seen: dict = {}  # what the hooks saw in the last forward
    model = policy.model
    hooks = [model.action_proj_out.register_forward_hook(lambda m, args, out: seen.update(rows=args[0].detach().float())),
             model.register_forward_pre_hook(lambda m, args, kw: seen.update(shapes=kw["vision_token_shapes"]), with_kwargs=True),
             model.proj_in.register_forward_hook(lambda m, args, out: seen.update(tokens=out.detach().float()))]
    if hasattr(model, "action_readout_out"):  # model.vision_stem = "action_keypoints" or "action_eye": what the rows are given
        hooks.append(model.action_readout_out.register_forward_hook(
            lambda m, args, out: seen.update(keypoints=args[0].detach().float())))
    feats, inputs, pixels, states, keypoints = [], [], [], [], []
    try:
        for ep in episodes:
            rec = load_recorded(dataset, ep, policy)
            steps = probe_steps(len(rec.actions), every, before)
            obs = [{"image": rec.image(t), "prompt": rec.task, "state": rec.states[t] if policy.use_state else None} for t in steps]
            policy.predict(obs, seed=seed + ep, num_steps=1)
            rows = seen["rows"].reshape(len(steps), -1, seen["rows"].shape[-1])  # [n, chunk rows, hidden]
            feats.append(rows.mean(1).cpu().numpy())
            frames = sum(shape[0] for shape in seen["shapes"]) // len(steps)  # latent frames a sample (merged packs)
            per_frame = seen["shapes"][0][1] * seen["shapes"][0][2]
            tokens = seen["tokens"].reshape(len(steps), frames * per_frame, -1)[:, :per_frame]  # the observed frame's
            inputs.append(tokens.flatten(1).cpu().numpy())
            pixels.append(np.stack([np.asarray(rec.image(t), np.float32).reshape(-1) / 255.0 for t in steps]))
            states.append(np.stack([rec.states[t] for t in steps]) if rec.states is not None else np.zeros((len(steps), 0)))
            if "keypoints" in seen:  # the same keypoints on every row of a sample
                keypoints.append(seen["keypoints"].reshape(len(steps), -1, seen["keypoints"].shape[-1])[:, 0].cpu().numpy())
            else:
                keypoints.append(np.zeros((len(steps), 0)))
    finally:
        for hook in hooks:
            hook.remove()
    return feats, inputs, pixels, states, keypoints


def recorded_states(dataset: LeRobotV3Dataset, episodes: list[int], every: int, before: int) -> list[np.ndarray]:
    """The privileged recording's whole state at the probed steps of each episode (read once for every target)."""
    out = []
    for ep in episodes:
        length = dataset.episode_length(ep)
        state = dataset.episode_columns(ep, ["observation.state"])["observation.state"].reshape(length, -1)
        out.append(state[probe_steps(length, every, before)].astype(np.float64))
    return out


def ridge_error_cm(train_x, train_y, test_x, test_y, alpha: float) -> float:
    """Root-mean-square position error (cm) of a ridge regression on standardised features; the targets are
    centred on the fit's mean, so the penalty never pulls the intercept (large alpha: the mean's error)."""
    mean, std, y_mean = train_x.mean(0), train_x.std(0) + 1e-6, train_y.mean(0)
    a, b, y = (train_x - mean) / std, (test_x - mean) / std, train_y - y_mean
    if a.shape[1] > a.shape[0]:  # more features than samples: the dual form
        w = a.T @ np.linalg.solve(a @ a.T + alpha * np.eye(len(a)), y)
    else:
        w = np.linalg.solve(a.T @ a + alpha * np.eye(a.shape[1]), a.T @ y)
    return float(np.sqrt(((b @ w + y_mean - test_y) ** 2).sum(1).mean()) * 100)


def chosen_alpha(xs: list[np.ndarray], ys: list[np.ndarray], alphas: list[float], folds: int = 4) -> float:
    """The ridge strength with the lowest mean error over `folds` folds of the fitting episodes (episode i in fold
    i % folds): the held-out episodes never choose it, so their error is not the best of several tries."""
    folds = min(folds, len(xs))
    if folds < 2:
        raise SystemExit("the probe needs at least 2 fitting episodes to choose its ridge strength: "
                         "lower --test-episodes or record more episodes")

    def fold_error(alpha: float) -> float:
        errors = []
        for f in range(folds):
            fit = [i for i in range(len(xs)) if i % folds != f]
            check = [i for i in range(len(xs)) if i % folds == f]
            errors.append(ridge_error_cm(np.concatenate([xs[i] for i in fit]), np.concatenate([ys[i] for i in fit]),
                                         np.concatenate([xs[i] for i in check]), np.concatenate([ys[i] for i in check]),
                                         alpha))
        return float(np.mean(errors))

    return min(alphas, key=fold_error)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a policy run directory or checkpoint")
    p.add_argument("--frames", required=True, help="the recording the policy was trained on")
    p.add_argument("--positions", required=True, help="the same episodes recorded with the privileged state")
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--before", type=int, default=0, help="probe only steps before this one (0: all); early steps, "
                   "before the hand has moved the object, leave the hand's state nothing to give away")
    p.add_argument("--test-episodes", type=int, default=10, help="the last N episodes are held out from the probe's fit")
    p.add_argument("--noise-scale", type=float, default=1.0, help="the sampler's starting noise (0: the action rows "
                   "start from zeros, so what they read does not depend on a random draw)")
    p.add_argument("--targets", default=TARGETS, help="name=first:end columns of --positions' observation.state")
    p.add_argument("--alphas", default="1,10,100,1000,10000,100000", help="ridge strengths tried; the one with the lowest "
                   "error over 4 episode folds of the fitting episodes is scored on the held-out ones")
    args = p.parse_args()

    frames, positions = LeRobotV3Dataset(args.frames), LeRobotV3Dataset(args.positions)
    episodes = list(frames.episode_indices)
    if episodes != list(positions.episode_indices) or any(frames.episode_length(e) != positions.episode_length(e) for e in episodes):
        raise SystemExit("--frames and --positions hold different episodes or lengths: not recordings of the same seeds")
    split = len(episodes) - args.test_episodes
    policy = Policy.from_checkpoint(args.run)
    policy.noise_scale = args.noise_scale
    feats, inputs, pixels, states, keypoints = action_head_features(policy, frames, episodes, args.every, args.before)
    has_keypoints = keypoints[0].shape[1] > 0
    sources = [states, pixels, inputs, feats] + ([keypoints] if has_keypoints else [])
    alphas = [float(a) for a in args.alphas.split(",")]
    print(f"{args.run}: {sum(len(f) for f in feats)} frames, probe fitted on {split} episodes, scored on {args.test_episodes}")
    print("| target | spread (predict the mean) | hand state | raw pixels | observed frame's tokens at the trunk's input | "
          "action head's input |" + (" action rows' keypoints |" if has_keypoints else ""))
    print("| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if has_keypoints else ""))
    recorded = recorded_states(positions, episodes, args.every, args.before)
    for name, (first, end) in parse_targets(args.targets).items():
        y = [state[:, first:end] for state in recorded]
        ty, vy = np.concatenate(y[:split]), np.concatenate(y[split:])
        spread = float(np.sqrt(((vy - ty.mean(0)) ** 2).sum(1).mean()) * 100)
        cells = [spread]
        for source in sources:
            tx, vx = np.concatenate(source[:split]), np.concatenate(source[split:])
            if not tx.shape[1]:
                cells.append(float("nan"))
                continue
            alpha = chosen_alpha(source[:split], y[:split], alphas)
            cells.append(ridge_error_cm(tx, ty, vx, vy, alpha))
        print(f"| {name} | " + " | ".join(f"{c:.2f} cm" for c in cells) + " |")


if __name__ == "__main__":
    main()
