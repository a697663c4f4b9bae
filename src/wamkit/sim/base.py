"""The types every simulator adapter shares: the env spec, one step's result, the adapter base class and its
error, and the headless GL choice that must precede any MuJoCo import. Adapters (`envs` for Meta-World,
`aloha`, `so101`) import this; the registry in `envs` imports the adapters."""

from __future__ import annotations

import ctypes.util
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

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
    obs: dict | None  # None when stepped with observe=False
    success: bool
    done: bool  # success or the step budget is spent
    info: dict
    # the sim's dense task reward where it has one (Meta-World's shaped reward, 0-10): graded where success is not,
    # so evaluations can say how close a failed episode came (EvalResult.mean_best_reward); None elsewhere
    reward: float | None = None


def higher_reward(best: float | None, reward: float | None) -> float | None:
    """The running best of an episode's dense rewards (None while the sim has given none)."""
    return reward if best is None else best if reward is None else max(best, reward)


ZOOM_RANGE = (0.25, 8.0)
SHADOW_MAP_PX = 2048  # ~2 mm a texel over Meta-World's table: its 1 cm goal marker casts a solid shadow


class CameraSpec(NamedTuple):
    """One camera of an env's `camera` argument: the model's camera, its zoom, and whether it is rendered
    with an overhead light's shadows (`+shadow`)."""

    name: str
    zoom: float = 1.0
    shadow: bool = False


SHADOW_SUFFIX = "+shadow"


def parse_camera(spec: str, where: str = "camera") -> CameraSpec:
    """A camera spec, `NAME[@<zoom>x][+shadow]`, -> CameraSpec. A zoom narrows the camera's field of view
    about its centre (2x: half the tangent of the half-angle): the frame shows the middle of the view at the
    same resolution, so the scene's objects cover that many times the pixels. `+shadow` lights the scene
    from straight above with the one shadow-casting light: whatever floats above the table (reach's and
    pick-place's goal marker, the gripper) casts its shadow right below it, the depth cue one view lacks."""
    base, shadow = (spec[:-len(SHADOW_SUFFIX)], True) if spec.endswith(SHADOW_SUFFIX) else (spec, False)
    name, sep, zoom = base.partition("@")
    if not sep:
        value = 1.0
    else:
        try:
            value = float(zoom[:-1]) if zoom.endswith("x") else float("nan")
        except ValueError:
            value = float("nan")
    if not (ZOOM_RANGE[0] <= value <= ZOOM_RANGE[1]) or not name or "+" in name:
        raise SimError(where, f"{spec!r} is not NAME, NAME@<zoom>x or either with {SHADOW_SUFFIX} after it, with a zoom in "
                       f"[{ZOOM_RANGE[0]}, {ZOOM_RANGE[1]}]", "write e.g. corner, corner@2x or corner@2x+shadow")
    return CameraSpec(name, value, shadow)


def overhead_shadow(scene, model) -> None:
    """Turn a built mjvScene's lighting into one shadow-casting sun straight above the model's centre
    (the first non-head light, moved; the others keep lighting but cast nothing). The model's own lights
    stay untouched: this acts on one render's scene only."""
    lights = [scene.lights[i] for i in range(scene.nlight)]
    suns = [light for light in lights if not light.headlight]
    if not suns:
        raise SimError("camera +shadow", "the model has no light to cast the shadow", "render without +shadow")
    for light in lights:
        light.castshadow = 0
    sun = suns[0]
    sun.directional, sun.castshadow = 1, 1
    sun.dir[:] = (0.0, 0.0, -1.0)
    sun.pos[:] = np.asarray(model.stat.center) + (0.0, 0.0, float(model.stat.extent))  # above the scene, inside its shadow map


def zoomed_fovy(fovy_degrees: float, zoom: float) -> float:
    """The vertical field of view (degrees) that magnifies a pinhole camera's image `zoom` times about its centre."""
    return math.degrees(2 * math.atan(math.tan(math.radians(fovy_degrees) / 2) / zoom))


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

    def step(self, action: np.ndarray, observe: bool = True) -> StepResult:  # pragma: no cover - interface
        """Apply one action. `observe=False` leaves StepResult.obs None and renders nothing: a policy
        executing a chunk looks only after its last action (`observe()` then), and rendering is
        most of a Meta-World step."""
        raise NotImplementedError

    def observe(self) -> dict:
        """The observation of the current state, as `step` would have returned it."""
        return self._obs()

    def _with_views(self, obs: dict) -> dict:
        """`obs` with `"views"` = {camera: image} (the first camera's is `obs["image"]`) when this env
        renders several cameras; adapters that set `multi_camera` call it from `_obs` and define
        `render(camera)`."""
        if len(self.cameras) > 1:
            obs["views"] = {self.camera: obs["image"], **{c: self.render(c) for c in self.cameras[1:]}}
        return obs

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
        self._camera_specs = {c: parse_camera(c, f"sim env {spec.name!r}: camera") for c in self.cameras}
        if len(self.cameras) > 1 and not self.multi_camera:
            raise SimError(f"sim env {spec.name!r}: camera", f"{camera!r} names {len(self.cameras)} cameras; this env "
                           "renders one", "name a single camera (several are supported for Meta-World and aloha/transfer-cube)")
        self.camera = self.cameras[0]
        self.max_episode_steps = int(max_episode_steps or spec.max_episode_steps)
        if self.max_episode_steps < 1:
            raise SimError(f"sim env {spec.name!r}: max_episode_steps", f"is {self.max_episode_steps}", "use >= 1")

    def _fast_renderer(self, mujoco, model) -> None:
        """An offscreen renderer for `self.camera` with shadows, reflections and multisampling off:
        the software renderer goes from 1-10 to ~50 fps at 64-256 px. A `+shadow` camera gets a shadow
        map (SHADOW_MAP_PX, over the model's extent) and its shadow pass in its own renders only."""
        model.vis.quality.shadowsize = SHADOW_MAP_PX if any(c.shadow for c in self._camera_specs.values()) else 0
        model.vis.quality.offsamples = 0
        self._renderer = mujoco.Renderer(model, self.resolution, self.resolution)
        self._mujoco_render_flags = mujoco.mjtRndFlag
        flags = self._renderer.scene.flags
        flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._camera_ids, self._camera_fovy, self._camera_model = {}, {}, model
        for spec, camera in self._camera_specs.items():
            try:
                self._camera_ids[spec] = model.camera(camera.name).id
            except KeyError as exc:
                names = [model.camera(i).name for i in range(model.ncam)]
                raise SimError(f"sim env {self.spec.name!r}: camera", f"{camera.name!r} does not exist", f"use one of {names}") from exc
            self._camera_fovy[spec] = zoomed_fovy(float(model.cam_fovy[self._camera_ids[spec]]), camera.zoom)

    def _scene_camera(self, camera: str) -> int:
        """The model camera id to render `camera` (a spec of self.cameras) from, its field of view set to the
        spec's zoom first (two specs of one camera may differ in zoom)."""
        camera_id = self._camera_ids[camera]
        self._camera_model.cam_fovy[camera_id] = self._camera_fovy[camera]
        return camera_id

    def _update_scene(self, data, camera: str):
        """Build the renderer's scene for `camera` (a spec of self.cameras): its zoom, and for a `+shadow`
        spec the overhead sun and the shadow pass. Returns the scene (adapters may add marker geoms)."""
        self._renderer.update_scene(data, camera=self._scene_camera(camera))
        scene, shadow = self._renderer.scene, self._camera_specs[camera].shadow
        scene.flags[self._mujoco_render_flags.mjRND_SHADOW] = int(shadow)
        if shadow:
            overhead_shadow(scene, self._camera_model)
        return scene

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
