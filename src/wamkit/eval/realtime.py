"""Closed-loop episodes with simulated inference latency (`wamkit eval sim --inference-delay D`).

A chunk takes D control ticks to compute. Three ways to live with that (Black et al. 2025):
- `sync`: the robot stops while the next chunk is computed (D idle ticks per chunk, no env step);
- `naive`: the robot keeps executing the old chunk for D ticks and then jumps to the new one, at
  index D, sampled without knowing what the old chunk did: the seam can jump between modes;
- `rtc`: as naive, but the request carries the D committed actions and the rest of the old chunk,
  and the new chunk is sampled to continue them (real-time chunking, wamkit.diffusion.rtc).
Time is counted in ticks, pauses included, and the episode budget is in ticks: stopping costs time.
The executor is wamkit.client.ChunkBuffer, the same queue the robot client runs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wamkit.client.buffer import ChunkBuffer
from wamkit.eval.cameras import policy_observation
from wamkit.sim.base import higher_reward

MODES = ("sync", "naive", "rtc")


@dataclass
class Rollout:
    success: bool = False
    length: int = 0  # env steps
    ticks: int = 0  # control ticks, pauses included
    replans: int = 0
    best_reward: float | None = None  # the sim's highest dense reward in the episode (StepResult.reward)
    frames: list = field(default_factory=list)
    seam_changes: list[float] = field(default_factory=list)  # |a_first_new - a_last_old|^2 per seam
    step_changes: list[float] = field(default_factory=list)  # |a_t - a_{t-1}|^2 per executed step
    executed: list = field(default_factory=list)  # with expert=True: each executed action ...
    expert: list = field(default_factory=list)  # ... and the scripted expert's in the same state (eval.expert_agreement)


def check_schedule(mode: str, delay: int, horizon: int, chunk_length: int) -> str | None:
    """Why (mode, delay, horizon) cannot run, or None: async modes need the old chunk to last the delay."""
    if mode not in MODES:
        return f"mode {mode!r} is not one of {list(MODES)}"
    if delay < 0:
        return f"inference delay {delay} is negative"
    if mode != "sync" and horizon + delay > chunk_length:
        return (f"executing {horizon} actions and then {delay} more while the next chunk is computed needs "
                f"{horizon + delay} > {chunk_length} (the chunk length)")
    return None


def run_episode(policy, env, obs: dict, *, mode: str, delay: int, horizon: int, seed: int, num_steps: int,
                budget: int, expert: bool = False) -> Rollout:
    """One episode from `obs` (the env just reset) until success-and-done, env done, or `budget` ticks; with
    `expert`, the env's scripted expert is asked for its action in every state the policy acts in."""
    buffer, out = ChunkBuffer(policy.chunk_length, horizon), Rollout(frames=[obs["image"]])
    pending, last = None, None  # (chunk, tick it is ready)
    while out.ticks < budget:
        if pending is None and buffer.due():
            request = dict(policy_observation(obs, policy.camera_keys))
            if mode == "rtc" and buffer.chunk is not None:
                request.update(committed_actions=buffer.committed(), inference_delay=delay)
            chunk = policy.predict([request], seed=seed * 1009 + out.replans, num_steps=num_steps)[0]
            out.replans += 1
            if mode == "sync" or buffer.chunk is None:  # the robot waits (always so for the first chunk)
                out.ticks += delay
                buffer.switch(chunk, 0)
            else:
                pending = (chunk, out.ticks + delay)
        if pending is not None and out.ticks >= pending[1]:
            buffer.switch(pending[0], delay)
            pending = None
        if out.ticks >= budget:
            break
        action, seam = buffer.pop()
        if last is not None:
            change = float(np.sum((np.asarray(action, np.float64) - last) ** 2))
            out.step_changes.append(change)
            if seam:
                out.seam_changes.append(change)
        last = np.asarray(action, np.float64)
        if expert:
            out.executed.append(last)
            out.expert.append(np.asarray(env.expert_action(), np.float64))
        result = env.step(action)
        obs, out.length, out.ticks = result.obs, out.length + 1, out.ticks + 1
        out.frames.append(obs["image"])
        out.success, out.best_reward = out.success or result.success, higher_reward(out.best_reward, result.reward)
        if result.done:
            break
    return out
