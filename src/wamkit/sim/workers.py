"""Simulators in worker processes: recording and evaluation of many episodes are bound by physics and
rendering on one core each, so W processes give ~W times the episodes per second (16 cores: MT10's 500
expert demonstrations in about the time of the slowest task's share).

Each worker owns its envs (one per task name, built on first use, kept for the worker's life) and
answers four requests over a pipe: `expert` (a whole scripted-expert episode, for `record`),
`reset` and `act` (the first observation, then `horizon` actions at a time, for the batched closed-loop
evaluator, whose policy stays in the parent process and sees every worker's observation in one batch),
and `replay` (an evaluated episode's actions again, every frame rendered: its video).
Workers are spawned, not forked: they inherit no CUDA context and no GL state from the parent.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from dataclasses import dataclass

from wamkit.sim.base import SimError, higher_reward


@dataclass
class EnvSettings:
    """What every env of a pool is built with (per request: the task name)."""

    resolution: int = 64
    camera: str | None = None
    max_episode_steps: int | None = None
    action_repeat: int = 1


def _env(envs: dict, name: str, settings: EnvSettings):
    from wamkit.sim.control_rate import at_control_rate
    from wamkit.sim.envs import make_env

    if name not in envs:
        inner = make_env(name, resolution=settings.resolution, camera=settings.camera,
                         max_episode_steps=settings.max_episode_steps)
        envs[name] = at_control_rate(inner, settings.action_repeat)
    return envs[name]


def _expert(envs, settings, name: str, seed: int, budget: int | None, post_success_steps: int, action_noise: float = 0.0):
    from wamkit.sim.expert import rollout_expert

    env = _env(envs, name, settings)
    return rollout_expert(env, seed, min(int(budget or env.max_episode_steps), env.max_episode_steps), post_success_steps,
                          action_noise)


def _reset(envs, settings, name: str, seed: int):
    env = _env(envs, name, settings)
    return env.reset(seed), env.max_episode_steps


def _act(envs, settings, name: str, actions, steps_left: int, expert: bool = False):
    """Execute actions until success-and-done, done or `steps_left`; (obs, steps taken, success, done, the
    scripted expert's action in each state acted in or None without `expert`, the best dense reward or None).
    Only the state after the last action is rendered: the policy plans from it alone."""
    env, success, done, taken, best = _env(envs, name, settings), False, False, 0, None
    asked = [] if expert else None
    for action in actions[:steps_left]:
        if expert:
            asked.append(env.expert_action())
        result = env.step(action, observe=False)
        taken, success, done, best = taken + 1, success or result.success, result.done, higher_reward(best, result.reward)
        if done:
            break
    return (env.observe() if taken else None), taken, success, done or taken >= steps_left, asked, best


def _replay(envs, settings, name: str, seed: int, actions):
    """The episode of `seed` stepped through `actions` again, rendering every state: (frames [T+1, H, W, 3],
    success, the env's control rate). The batched evaluator renders only the states a policy plans from; the
    simulation is deterministic, so its videos are replays of the actions an episode executed."""
    import numpy as np

    env = _env(envs, name, settings)
    frames, success = [env.reset(seed)["image"]], False
    for action in actions:
        result = env.step(action)
        frames.append(result.obs["image"])
        success = success or result.success
        if result.done:
            break
    return np.stack(frames), success, env.spec.fps


HANDLERS = {"expert": _expert, "reset": _reset, "act": _act, "replay": _replay}


def _serve(conn, settings: EnvSettings) -> None:
    from wamkit.sim.base import ensure_gl_backend

    ensure_gl_backend()  # a headless MUJOCO_GL before mujoco is imported

    envs: dict = {}
    try:
        while True:
            request = conn.recv()
            if request is None:
                break
            try:
                conn.send(("ok", HANDLERS[request[0]](envs, settings, *request[1:])))
            except Exception:  # noqa: BLE001 - the parent re-raises it with the worker's traceback
                conn.send(("error", traceback.format_exc()))
    finally:
        for env in envs.values():
            env.close()


class EnvWorkers:
    """`n` simulator processes; send a request to one worker, then receive its answer."""

    def __init__(self, n: int, settings: EnvSettings | None = None):
        if n < 1:
            raise SimError("env workers", f"{n} requested", "use at least 1 worker")
        ctx = mp.get_context("spawn")
        self.settings = settings or EnvSettings()
        self._conns, self._procs = [], []
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, self.settings), daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)

    def __len__(self) -> int:
        return len(self._conns)

    def send(self, worker: int, kind: str, *args) -> None:
        self._conns[worker].send((kind, *args))

    def receive(self, worker: int):
        status, value = self._conns[worker].recv()
        if status != "ok":
            raise SimError(f"env worker {worker}", f"failed:\n{value}", "see the worker's traceback above")
        return value

    def map_ordered(self, kind: str, jobs: list[tuple]):
        """Yield the answers to (kind, *job) for every job, in job order, keeping every worker busy."""
        pending, nxt = {}, 0
        for w in range(min(len(self), len(jobs))):
            self.send(w, kind, *jobs[nxt])
            pending[nxt], nxt = w, nxt + 1
        for i in range(len(jobs)):
            w = pending.pop(i)
            answer = self.receive(w)
            if nxt < len(jobs):
                self.send(w, kind, *jobs[nxt])
                pending[nxt], nxt = w, nxt + 1
            yield answer

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()

    def __enter__(self) -> "EnvWorkers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
