"""One scripted-expert episode and its reset seed: what recording runs in this process or in simulator
workers (wamkit.sim.workers), kept apart from the writer so both can import it."""

from __future__ import annotations

import numpy as np

from wamkit.data.writer import RecordedEpisode, camera_key


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
        return {camera_key(name): np.stack([f[name] for f in frames]) for name in frames[0]}
    return np.stack(frames)
