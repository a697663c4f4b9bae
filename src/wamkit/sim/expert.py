"""One scripted-expert episode and its reset seed: what recording runs in this process or in simulator
workers (wamkit.sim.workers), kept apart from the writer so both can import it."""

from __future__ import annotations

import numpy as np

from wamkit.data.writer import RecordedEpisode, camera_key
from wamkit.sim.base import SimError


def episode_seed(seed: int, attempt: int) -> int:
    return int(seed) * 1_000_003 + int(attempt)


def rollout_expert(env, seed: int, max_steps: int, post_success_steps: int = 10,
                   action_noise: float = 0.0) -> tuple[RecordedEpisode, bool]:
    """One expert episode; row t holds the observation before action t.

    `action_noise` s > 0 perturbs what is executed, not what is recorded (DART, Laskey et al. 2017): the env
    steps with the expert's action plus Gaussian noise of s times each channel's half range, clipped to the
    action bounds, and row t keeps the expert's own action. The recording then holds states off the expert's
    path, each labelled with the expert's correction: the states a policy's small errors lead it into, which a
    clean recording never visits. The noise is drawn from `seed`, so an episode is reproducible."""
    obs = env.reset(seed)
    states, actions, frames = [], [], []
    success, extra = False, 0
    perturb = _action_perturbation(env.spec.action_bounds, action_noise, seed)
    for _ in range(max_steps):
        action = env.expert_action()
        states.append(obs["state"])
        frames.append(obs.get("views", obs["image"]))
        actions.append(action)
        result = env.step(perturb(action))
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


def check_action_noise(scale: float) -> None:
    if not scale >= 0:  # NaN too
        raise SimError("record: expert action noise", f"is {scale}", "give a scale >= 0 (0 records the expert as it is)")


def _action_perturbation(bounds, scale: float, seed: int):
    """The executed action for an expert action: itself at scale 0, else the DART perturbation above."""
    check_action_noise(scale)
    if scale == 0:
        return lambda action: action
    low, high = (np.asarray(b, dtype=np.float64) for b in bounds)
    std, rng = scale * (high - low) / 2, np.random.default_rng([int(seed), 0xDA27])
    return lambda action: np.clip(action + rng.normal(size=std.shape) * std, low, high).astype(np.asarray(action).dtype)


def _stack_frames(frames: list) -> np.ndarray | dict[str, np.ndarray]:
    """One camera: [L, H, W, 3]. Several (observations with "views"): one such array per camera,
    keyed `observation.images.<camera>` as LeRobot names its ALOHA cameras."""
    if isinstance(frames[0], dict):
        return {camera_key(name): np.stack([f[name] for f in frames]) for name in frames[0]}
    return np.stack(frames)
