"""Control at a lower rate than the simulator's: each command is held for K simulator steps, so data
recorded through `ActionRepeat` (and policies evaluated through it) run at fps / K.

Real robot datasets run at 10-30 fps. The Meta-World adapter steps at 80 Hz, where a chunk of 8
frames spans only 0.1 s: the arm moves a few pixels and copying the last frame is hard to beat."""

from __future__ import annotations

import dataclasses

import numpy as np

from wamkit.sim.base import SimEnv, SimError, StepResult, higher_reward


class ActionRepeat(SimEnv):
    """`env` with every action applied `repeat` times; observations, success and the step budget
    are counted in held actions. Stepping stops early only when the inner budget is spent."""

    def __init__(self, env: SimEnv, repeat: int):
        if int(repeat) < 1:
            raise SimError("action_repeat", f"is {repeat}", "use 1 (the simulator's own rate) or more")
        self.env, self.repeat = env, int(repeat)
        self.spec = dataclasses.replace(env.spec, fps=env.spec.fps / self.repeat,
                                        max_episode_steps=max(1, env.spec.max_episode_steps // self.repeat))
        self.resolution = env.resolution
        self.max_episode_steps = max(1, env.max_episode_steps // self.repeat)

    def reset(self, seed: int) -> dict:
        return self.env.reset(seed)

    def expert_action(self) -> np.ndarray:
        return self.env.expert_action()

    def step(self, action: np.ndarray, observe: bool = True) -> StepResult:
        success, best = False, None
        for _ in range(self.repeat):  # only the last simulator step is rendered; success and the reward count every one
            result = self.env.step(action, observe=False)
            success, best = success or result.success, higher_reward(best, result.reward)
            if result.done and not result.success:  # the inner budget is spent
                break
        return StepResult(self.env.observe() if observe else None, success, success or result.done, result.info, reward=best)

    def observe(self) -> dict:
        return self.env.observe()

    def close(self) -> None:
        self.env.close()


def at_control_rate(env: SimEnv, repeat: int | None) -> SimEnv:
    """`env` holding each action for `repeat` simulator steps; `env` itself for None or 1."""
    return env if repeat is None or int(repeat) == 1 else ActionRepeat(env, repeat)


def control_repeat(env_fps: float, data_fps: float) -> int | None:
    """How many simulator steps one action of data recorded at `data_fps` spans, or None when the
    rates are not an integer multiple of each other."""
    ratio = float(env_fps) / float(data_fps)
    k = round(ratio)
    return k if k >= 1 and abs(ratio - k) < 1e-6 else None
