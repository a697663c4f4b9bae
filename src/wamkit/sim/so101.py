"""SO-101 pick-and-place (PyPI `lerobot-env-so101==0.4.0`, `SO101PickPlace-v0`) with the package's own scripted
expert (`lerobot_env_so101.scripted.PickPlaceController`).

The adapter builds the registered gymnasium env (`lerobot_env_so101/SO101PickPlace-v0`, random block and goal
placement per reset seed, the package's calibrated `action_scale` of 0.025 m per unit action) and steps its
unwrapped core, with its own step budget. The package renders nothing unless asked (`image_obs=False`); the
adapter renders the scene's only camera, `front`, at R x R pixels with shadows, reflections and multisampling
off. The model's meshes have 322k triangles, so rendering dominates (~50-60 ms a frame in software GL).

The package's scene has no goal marker (its goal lives only in the privileged `environment_state`), so the
adapter draws one into the rendered frame: a flat green disc on the table, centred on the goal, whose radius is
the success distance (0.03 m). It is a visual-only scene geom: physics never sees it.

* state  = `[shoulder_pan, shoulder_lift, elbow_flex, wrist_flex, wrist_roll, gripper_open, grasp_x, grasp_y,
  grasp_z]`: the 5 arm joint angles (rad), the measured jaw opening normalized to [0, 1] (0 closed, 1 open; the
  package's `ctrl_to_normalized` of the gripper joint), and the world position (m) of the grasp point between
  the jaws (`env.ik_point_pos`, the point the action moves). Block and goal positions are not exposed: the
  policy reads them from the image.
* action = the env's native `[dx, dy, dz, gripper]`: a grasp-point displacement in units of 0.025 m (clipped
  to [-1, 1]; IK keeps the gripper pointing down) and the absolute gripper target (0 closed, 1 open).
* fps    = 10 (the env's control_dt of 0.1 s = 50 physics steps of 2 ms); one dataset row per env step.
* success = the env's `info["succeed"]`: the block was lifted at least 3 cm earlier in the episode, rests within
  3 cm of the goal, is still and the jaw has let go. The env terminates when the block leaves the workspace;
  the adapter then reports the episode done and never successful.
"""

from __future__ import annotations

import numpy as np

from wamkit.sim.base import EnvSpec, SimEnv, SimError, StepResult, ensure_gl_backend

SO101_FPS = 10.0
SO101_TASK = "pick up the purple cube and place it on the green target"
SO101_MAX_STEPS = 300  # the TimeLimit the package registers SO101PickPlace-v0 with
SO101_INSTALL_HINT = "pip install lerobot-env-so101==0.4.0 mujoco==3.3.0 (or pip install -e '.[sim]')"
SO101_ARM_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll")
SO101_STATE_NAMES = (*SO101_ARM_JOINTS, "gripper_open", "grasp_x", "grasp_y", "grasp_z")
SO101_ACTION_NAMES = ("dx", "dy", "dz", "gripper")
# joint ranges of so101_new_calib.xml (rad; checked against the model at construction), the normalized jaw
# opening, and the grasp point's workspace (the package's CARTESIAN_BOUNDS, to which the IK target is clipped)
_JOINT_LOW = (-1.91986, -1.74533, -1.69, -1.65806, -2.74385)
_JOINT_HIGH = (1.91986, 1.74533, 1.69, 1.65806, 2.84121)
SO101_STATE_BOUNDS = ((*_JOINT_LOW, 0.0, 0.1, -0.3, 0.0), (*_JOINT_HIGH, 1.0, 0.5, 0.3, 0.4))
SO101_ACTION_BOUNDS = ((-1.0, -1.0, -1.0, 0.0), (1.0, 1.0, 1.0, 1.0))
GOAL_MARKER_RGBA = (0.1, 0.8, 0.1, 1.0)


class SO101PickPlaceEnv(SimEnv):
    """lerobot-env-so101's pick-and-place task (Cartesian delta control) with its scripted expert."""

    def __init__(self, spec: EnvSpec, resolution: int = 64, camera: str | None = None,
                 max_episode_steps: int | None = None):
        ensure_gl_backend()
        try:
            import gymnasium as gym
            import mujoco
            from lerobot_env_so101.gripper import ctrl_to_normalized
            from lerobot_env_so101.mujoco_env import GymRenderingSpec
            from lerobot_env_so101.pick_place_env import PLACE_SUCCESS_DISTANCE
            from lerobot_env_so101.policy import DEFAULT_ACTION_SCALE, PICK_PLACE_ENV_ID
            from lerobot_env_so101.scripted import PickPlaceController
        except ImportError as exc:
            raise SimError(f"sim env {spec.name!r}", f"lerobot-env-so101 is not installed ({exc})",
                           SO101_INSTALL_HINT) from exc
        self._init_common(spec, resolution, camera, max_episode_steps)
        self._mujoco = mujoco
        self._to_open = ctrl_to_normalized
        # render_spec sizes the model's offscreen buffer (the scene file says 128 px)
        render_spec = GymRenderingSpec(height=self.resolution, width=self.resolution, camera_id=self.camera)
        self._env = gym.make(PICK_PLACE_ENV_ID, random_block_position=True, action_scale=DEFAULT_ACTION_SCALE,
                             render_spec=render_spec).unwrapped
        model = self._env.model
        if abs(1.0 / self._env.control_dt - spec.fps) > 1e-6:
            raise SimError(f"sim env {spec.name!r}", f"control frequency is {1.0 / self._env.control_dt} Hz, the "
                           f"registry says {spec.fps}", "update wamkit.sim.so101 for this lerobot-env-so101 version")
        joints = [model.joint(name) for name in SO101_ARM_JOINTS]
        ranges = np.array([j.range for j in joints])
        if not np.allclose(ranges.T, (_JOINT_LOW, _JOINT_HIGH), atol=1e-4):
            raise SimError(f"sim env {spec.name!r}", f"joint ranges are {ranges.tolist()}, the registry says "
                           f"{[_JOINT_LOW, _JOINT_HIGH]}", "update wamkit.sim.so101 for this lerobot-env-so101 version")
        self._arm_qadr = np.array([j.qposadr[0] for j in joints])
        self._jaw_qadr = model.joint("gripper").qposadr[0]
        self._jaw_range = model.actuator("gripper").ctrlrange.copy()
        self._goal_radius = float(PLACE_SUCCESS_DISTANCE)
        self._fast_renderer(mujoco, model)
        self._expert = PickPlaceController(DEFAULT_ACTION_SCALE)
        self._steps = -1
        self._left_workspace = False

    # ---- env ------------------------------------------------------------------------------------
    def render(self) -> np.ndarray:
        mj = self._mujoco
        scene = self._update_scene(self._env.data, self.camera)
        if scene.ngeom < scene.maxgeom:  # the goal marker: a 2 mm thick disc lying on the table
            goal = self._env.goal_pos
            mj.mjv_initGeom(scene.geoms[scene.ngeom], mj.mjtGeom.mjGEOM_CYLINDER,
                            np.array([self._goal_radius, self._goal_radius, 0.001]), np.array([goal[0], goal[1], 0.001]),
                            np.eye(3).reshape(-1), np.asarray(GOAL_MARKER_RGBA, dtype=np.float32))
            scene.ngeom += 1
        return np.ascontiguousarray(self._renderer.render())

    def block_position(self) -> np.ndarray:
        return self._env.data.sensor("block_pos").data.copy()

    def goal_position(self) -> np.ndarray:
        return self._env.goal_pos

    def robot_state(self) -> np.ndarray:
        data = self._env.data
        opening = np.clip(self._to_open(data.qpos[self._jaw_qadr], self._jaw_range), 0.0, 1.0)
        return np.concatenate([data.qpos[self._arm_qadr], [opening], self._env.ik_point_pos]).astype(np.float32)

    def _obs(self) -> dict:
        return {"image": self.render(), "state": self.robot_state(), "prompt": self.spec.task}

    def reset(self, seed: int) -> dict:
        self._env.reset(seed=int(seed))
        self._expert.reset()
        self._steps = 0
        self._left_workspace = False
        return self._obs()

    def step(self, action: np.ndarray, observe: bool = True) -> StepResult:
        a = self._checked_action(action, *SO101_ACTION_BOUNDS).astype(np.float32)
        _obs, _reward, terminated, _trunc, info = self._env.step(a)
        self._steps += 1
        # terminated without success = the block left the workspace: the episode has failed for good
        self._left_workspace = self._left_workspace or (terminated and not info["succeed"])
        success = bool(info["succeed"]) and not self._left_workspace
        done = success or self._left_workspace or self._steps >= self.max_episode_steps
        return StepResult(self._obs() if observe else None, success, done, {**info, "left_workspace": self._left_workspace})

    # ---- expert ---------------------------------------------------------------------------------
    def expert_action(self) -> np.ndarray:
        """The package's PickPlaceController action for the current step (it reads the privileged block and goal
        positions). The controller counts its own steps: call this exactly once per env step."""
        if self._steps < 0:
            raise SimError(f"sim env {self.spec.name!r}", "expert_action() before reset()", "call reset(seed) first")
        action = self._expert.act(self._env.ik_point_pos, self.block_position(), self.goal_position())
        return np.clip(action, *SO101_ACTION_BOUNDS).astype(np.float32)


SO101_PICK_PLACE_SPEC = EnvSpec(
    name="so101/pick-place", task=SO101_TASK, fps=SO101_FPS, max_episode_steps=SO101_MAX_STEPS,
    state_names=SO101_STATE_NAMES, action_names=SO101_ACTION_NAMES, state_bounds=SO101_STATE_BOUNDS,
    action_bounds=SO101_ACTION_BOUNDS, camera="front", robot_type="so101", factory=SO101PickPlaceEnv)
