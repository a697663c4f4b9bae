"""Bimanual ALOHA (gym-aloha 0.1.5, `AlohaTransferCube-v0`) adapter with a scripted IK expert.

The adapter drives gym-aloha's own MuJoCo model (`bimanual_viperx_transfer_cube.xml`) and task
(`gym_aloha.tasks.sim.TransferCubeTask`: action mapping, episode reset, reward) through a
`dm_control.mujoco.Physics`, exactly as `AlohaEnv` does, but without `AlohaEnv`'s observation step,
which renders three 640x480 cameras every step whatever the observation size. Only the `top` camera
is rendered, at R x R pixels with shadows, reflections and multisampling off; `camera="top,left_wrist"`
renders those cameras (any of the model's: left_pillar, right_pillar, top, angle, front_close,
left_wrist, right_wrist) and adds them to each observation as `"views"`.

* state  = the 14 joint positions gym-aloha calls `agent_pos`: per arm (left, then right) 6 joint
  angles (rad) and the normalized gripper opening (0 closed, 1 open).
* action = gym-aloha's 14-D absolute joint-position action, same layout (gripper: normalized target
  opening, 0 closed, 1 open).
* fps    = 50 (control timestep 0.02 s = 10 physics steps of 2 ms); one dataset row per env step.
* reset(seed) places the cube with gym-aloha's `sample_box_pose(seed)` (same placement as
  `AlohaEnv.reset(seed=seed)`).
* success = the env's own criterion, reward == 4 (`TransferCubeTask.get_reward`): the cube touches
  the left gripper's finger and not the table.

Expert: a Cartesian waypoint plan for both grippers (after ACT's scripted transfer-cube policy:
right arm picks the cube from above, lifts it to a meeting point; the left arm comes in with its
gripper rolled by 90 deg, closes on the cube, the right gripper opens and backs off), turned into
joint targets each step by damped-least-squares IK on the model (`ArmIK`, `mujoco.mj_jac` at a
tool-centre point between the finger pads).
"""

from __future__ import annotations

import numpy as np

from wamkit.sim.base import EnvSpec, SimEnv, SimError, StepResult, ensure_gl_backend

ALOHA_FPS = 50.0
ALOHA_TASK = "pick up the red cube with the right arm and hand it over to the left arm"
ALOHA_MAX_STEPS = 400
ALOHA_INSTALL_HINT = "pip install gym-aloha==0.1.5 mujoco==3.3.0 (or pip install -e '.[sim]')"
ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")
ALOHA_STATE_NAMES = tuple(f"{side}_{j}" for side in ("left", "right") for j in (*ARM_JOINTS, "gripper"))
ALOHA_ACTION_NAMES = ALOHA_STATE_NAMES
# joint ranges of the ViperX 300 S model (rad) and the normalized gripper opening [0, 1]
_ARM_LOW = (-3.14158, -1.85005, -1.76278, -3.14158, -1.8675, -3.14158)
_ARM_HIGH = (3.14158, 1.25664, 1.6057, 3.14158, 2.23402, 3.14158)
ALOHA_BOUNDS = ((*_ARM_LOW, 0.0, *_ARM_LOW, 0.0), (*_ARM_HIGH, 1.0, *_ARM_HIGH, 1.0))
TCP_OFFSET = (0.13, 0.0, 0.0)  # tool-centre point in the gripper_link frame: between the finger pads


def _quat_from_mat(mat: np.ndarray) -> np.ndarray:
    import mujoco

    q = np.zeros(4)
    mujoco.mju_mat2Quat(q, np.asarray(mat, dtype=np.float64).reshape(9))
    return q


def _axis_angle_quat(axis, degrees: float) -> np.ndarray:
    import mujoco

    q = np.zeros(4)
    mujoco.mju_axisAngle2Quat(q, np.asarray(axis, dtype=np.float64), np.deg2rad(degrees))
    return q


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    import mujoco

    q = np.zeros(4)
    mujoco.mju_mulQuat(q, a, b)
    return q


def _slerp(a: np.ndarray, b: np.ndarray, s: float) -> np.ndarray:
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    dot = float(np.dot(a, b))
    if dot < 0:
        b, dot = -b, -dot
    if dot > 0.9995:
        q = a + s * (b - a)
        return q / np.linalg.norm(q)
    theta = np.arccos(dot)
    return (np.sin((1 - s) * theta) * a + np.sin(s * theta) * b) / np.sin(theta)


class ArmIK:
    """Damped-least-squares IK for one ViperX arm of the ALOHA model, on a scratch MjData.

    The controlled point is `tcp_offset` in the frame of body `vx300s_<side>/gripper_link` (or any
    `body`); `solve` finds the 6 arm joint angles that put it at a world position (and, optionally,
    the body frame at a world orientation), within the joint ranges."""

    def __init__(self, model, side: str = "right", tcp_offset=TCP_OFFSET, body: str | None = None):
        import mujoco

        self._mj = mujoco
        self.model = model
        self.data = mujoco.MjData(model)
        self.body = model.body(body or f"vx300s_{side}/gripper_link").id
        joints = [model.joint(f"vx300s_{side}/{j}") for j in ARM_JOINTS]
        self.qadr = np.array([model.jnt_qposadr[j.id] for j in joints])
        self.dadr = np.array([model.jnt_dofadr[j.id] for j in joints])
        self.low = np.array([model.jnt_range[j.id][0] for j in joints])
        self.high = np.array([model.jnt_range[j.id][1] for j in joints])
        self.tcp_offset = np.asarray(tcp_offset, dtype=np.float64)
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))

    def _kinematics(self, q: np.ndarray) -> None:
        self.data.qpos[self.qadr] = q
        self._mj.mj_kinematics(self.model, self.data)
        self._mj.mj_comPos(self.model, self.data)

    def fk(self, q) -> tuple[np.ndarray, np.ndarray]:
        """(TCP world position, gripper body world quaternion) at arm joints q."""
        self._kinematics(np.asarray(q, dtype=np.float64))
        return self._tcp(), self.data.xquat[self.body].copy()

    def _tcp(self) -> np.ndarray:
        return self.data.xpos[self.body] + self.data.xmat[self.body].reshape(3, 3) @ self.tcp_offset

    def solve(self, q0, pos, quat=None, *, iters: int = 60, damping: float = 0.02, rot_weight: float = 0.25,
              pos_tol: float = 2e-4, rot_tol: float = 2e-3, max_step: float = 0.25) -> tuple[np.ndarray, float, float]:
        """Joint angles (6,) reaching `pos` (and `quat` when given) from the initial guess q0.
        Returns (q, position error m, orientation error rad)."""
        mj = self._mj
        q = np.clip(np.asarray(q0, dtype=np.float64).copy(), self.low, self.high)
        target = np.asarray(pos, dtype=np.float64)
        err_p = err_r = np.inf
        for _ in range(iters):
            self._kinematics(q)
            tcp = self._tcp()
            e_p = target - tcp
            err_p = float(np.linalg.norm(e_p))
            if quat is not None:
                cur = self.data.xquat[self.body]
                w = np.zeros(3)
                mj.mju_subQuat(w, np.asarray(quat, dtype=np.float64), cur)  # cur * quat(w) = target, w local
                e_r = self.data.xmat[self.body].reshape(3, 3) @ w
                err_r = float(np.linalg.norm(e_r))
            else:
                e_r, err_r = np.zeros(3), 0.0
            if err_p < pos_tol and err_r < rot_tol:
                break
            mj.mj_jac(self.model, self.data, self._jacp, self._jacr, tcp, self.body)
            jp = self._jacp[:, self.dadr]
            if quat is not None:
                jac = np.vstack([jp, rot_weight * self._jacr[:, self.dadr]])
                err = np.concatenate([e_p, rot_weight * e_r])
            else:
                jac, err = jp, e_p
            dq = jac.T @ np.linalg.solve(jac @ jac.T + damping ** 2 * np.eye(len(err)), err)
            norm = np.linalg.norm(dq)
            if norm > max_step:
                dq *= max_step / norm
            q = np.clip(q + dq, self.low, self.high)
        return q, err_p, err_r


class _Track:
    """Piecewise-linear (slerp for orientation) waypoint track: [(t, pos, quat, gripper), ...]."""

    def __init__(self, waypoints):
        self.wp = sorted(waypoints, key=lambda w: w[0])

    def at(self, t: float):
        wp = self.wp
        if t <= wp[0][0]:
            return wp[0][1], wp[0][2], wp[0][3]
        for (t0, p0, q0, g0), (t1, p1, q1, g1) in zip(wp, wp[1:]):
            if t <= t1:
                s = (t - t0) / max(t1 - t0, 1e-9)
                return p0 + s * (p1 - p0), _slerp(q0, q1, s), g0 + s * (g1 - g0)
        return wp[-1][1], wp[-1][2], wp[-1][3]


class AlohaTransferCubeEnv(SimEnv):
    """gym-aloha's bimanual transfer-cube task (joint-position control) with a scripted IK expert."""

    def __init__(self, spec: EnvSpec, resolution: int = 64, camera: str | None = None,
                 max_episode_steps: int | None = None):
        ensure_gl_backend()
        try:
            import mujoco
            from dm_control import mujoco as dm_mujoco
            from gym_aloha.constants import ASSETS_DIR, DT, START_ARM_POSE
            from gym_aloha.tasks import sim as aloha_sim
            from gym_aloha.utils import sample_box_pose
        except ImportError as exc:
            raise SimError(f"sim env {spec.name!r}", f"gym-aloha is not installed ({exc})", ALOHA_INSTALL_HINT) from exc
        self._init_common(spec, resolution, camera, max_episode_steps)
        self._mujoco = mujoco
        self._aloha_sim = aloha_sim
        self._sample_box_pose = sample_box_pose
        self._start_pose = np.asarray(START_ARM_POSE, dtype=np.float64)
        self._physics = dm_mujoco.Physics.from_xml_path(str(ASSETS_DIR / "bimanual_viperx_transfer_cube.xml"))
        self._task = aloha_sim.TransferCubeTask()
        model = self._physics.model.ptr
        self._n_sub_steps = int(round(DT / model.opt.timestep))
        if abs(1.0 / (self._n_sub_steps * model.opt.timestep) - spec.fps) > 1e-6:
            raise SimError(f"sim env {spec.name!r}", f"control frequency is {1.0 / (self._n_sub_steps * model.opt.timestep)}"
                           f" Hz, the registry says {spec.fps}", "update wamkit.sim.aloha for this gym-aloha version")
        self._fast_renderer(mujoco, model)
        self.ik = {side: ArmIK(model, side) for side in ("left", "right")}
        self._box_qadr = model.jnt_qposadr[model.joint("red_box_joint").id]
        self._steps = -1
        self._plan: dict[str, _Track] | None = None
        self._q_cmd: dict[str, np.ndarray] = {}
        self.last_reward = 0

    # ---- env ------------------------------------------------------------------------------------
    multi_camera = True

    def render(self, camera: str | None = None) -> np.ndarray:
        self._update_scene(self._physics.data.ptr, camera or self.camera)
        return np.ascontiguousarray(self._renderer.render())

    def joint_state(self) -> np.ndarray:
        return self._task.get_qpos(self._physics).astype(np.float32)

    def box_position(self) -> np.ndarray:
        return self._physics.data.qpos[self._box_qadr:self._box_qadr + 3].copy()

    def _obs(self) -> dict:
        return self._with_views({"image": self.render(), "state": self.joint_state(), "prompt": self.spec.task})

    def reset(self, seed: int) -> dict:
        self._aloha_sim.BOX_POSE[0] = self._sample_box_pose(int(seed))
        with self._physics.reset_context():
            self._task.initialize_episode(self._physics)
        self._steps = 0
        self.last_reward = 0
        self._plan = self._make_plan()
        self._q_cmd = {"left": self._start_pose[0:6].copy(), "right": self._start_pose[8:14].copy()}
        return self._obs()

    def step(self, action: np.ndarray, observe: bool = True) -> StepResult:
        a = self._checked_action(action, *ALOHA_BOUNDS)
        self._task.before_step(a, self._physics)
        self._physics.step(self._n_sub_steps)
        self._task.after_step(self._physics)
        reward = int(self._task.get_reward(self._physics))
        self.last_reward = reward
        self._steps += 1
        success = reward == self._task.max_reward
        info = {"reward": reward, "is_success": success}
        return StepResult(self._obs() if observe else None, success, success or self._steps >= self.max_episode_steps, info)

    # ---- expert ---------------------------------------------------------------------------------
    def _make_plan(self) -> dict[str, _Track]:
        """Waypoints (step, TCP position, gripper_link quaternion, gripper opening) for both arms."""
        box = self.box_position()
        box[2] = 0.02  # resting height of the cube centre (it is spawned at 0.05 and drops)
        home_l = self._home_l = self.ik["left"].fk(self._start_pose[0:6])
        home_r = self.ik["right"].fk(self._start_pose[8:14])
        # right gripper: pointing at the cube from above, pitched 60 deg down from its home direction
        pick_q = _quat_mul(home_r[1], _axis_angle_quat([0, 1, 0], 60.0))
        # left gripper: horizontal, rolled 90 deg so its fingers close vertically (top/bottom faces)
        meet_l_q = _axis_angle_quat([1, 0, 0], 90.0)
        meet = np.array([0.0, 0.5, 0.25])
        p = self.plan_params
        right = [
            (0, home_r[0], home_r[1], 0.0),
            (p["approach"], box + [0, 0, 0.08], pick_q, 1.0),
            (p["down"], box + [0, 0, p["grasp_dz"]], pick_q, 1.0),
            (p["close"], box + [0, 0, p["grasp_dz"]], pick_q, 0.0),
            (p["lift"], box + [0, 0, 0.10], pick_q, 0.0),
            (p["meet"], meet, pick_q, 0.0),
            (p["l_close"] + 10, meet, pick_q, 0.0),
            (p["r_open"], meet, pick_q, 1.0),
            (p["r_away"], meet + [0.1, 0, 0.03], pick_q, 1.0),
            (ALOHA_MAX_STEPS, meet + [0.1, 0, 0.03], pick_q, 1.0),
        ]
        self._meet_l_q = meet_l_q
        return {"left": self._left_track(home_l, meet), "right": _Track(
            [(t, np.asarray(x, float), np.asarray(q, float), g) for t, x, q, g in right])}

    def _left_track(self, home_l, cube: np.ndarray) -> _Track:
        """Left gripper: wait at a pre-grasp pose 10 cm short of the cube (held at the meeting point), go in
        horizontally, close, back off once the right gripper has let go. Re-planned at step `l_replan` from
        the cube's measured position (the right gripper holds it a few mm off its nominal spot)."""
        p, meet_l_q = self.plan_params, self._meet_l_q
        left_grasp = np.asarray(cube, float) + [p["l_dx"], 0, p["l_dz"]]
        left = [
            (0, home_l[0], home_l[1], 0.0),
            (p["l_approach"], left_grasp + [-0.1, 0, 0], meet_l_q, 1.0),
            (p["l_replan"], left_grasp + [-0.1, 0, 0], meet_l_q, 1.0),
            (p["l_in"], left_grasp, meet_l_q, 1.0),
            (p["l_close"], left_grasp, meet_l_q, 0.0),
            (p["r_away"], left_grasp, meet_l_q, 0.0),
            (p["l_back"], left_grasp + [-0.1, 0, 0], meet_l_q, 0.0),
            (ALOHA_MAX_STEPS, left_grasp + [-0.1, 0, 0], meet_l_q, 0.0),
        ]
        return _Track([(t, np.asarray(x, float), np.asarray(q, float), g) for t, x, q, g in left])

    # waypoint times (env steps at 50 Hz) and offsets (m) of the expert's plan
    plan_params = {"approach": 70, "down": 110, "close": 140, "grasp_dz": 0.0, "lift": 170, "meet": 210,
                   "l_approach": 150, "l_replan": 225, "l_in": 260, "l_close": 285, "l_dx": -0.025, "l_dz": 0.0,
                   "r_open": 315, "r_away": 345, "l_back": 385}

    def expert_action(self) -> np.ndarray:
        """Joint-position action of the scripted expert for the current step (IK of its waypoint plan)."""
        if self._plan is None:
            raise SimError(f"sim env {self.spec.name!r}", "expert_action() before reset()", "call reset(seed) first")
        t = self._steps + 1  # the target the arms should reach after this step
        if self._steps == self.plan_params["l_replan"]:
            self._plan["left"] = self._left_track(self._home_l, self.box_position())
        out = []
        for side in ("left", "right"):
            pos, quat, grip = self._plan[side].at(t)
            q, _, _ = self.ik[side].solve(self._q_cmd[side], pos, quat)
            self._q_cmd[side] = q
            out.extend([*q, grip])
        return np.asarray(out, dtype=np.float32)


ALOHA_TRANSFER_CUBE_SPEC = EnvSpec(
    name="aloha/transfer-cube", task=ALOHA_TASK, fps=ALOHA_FPS, max_episode_steps=ALOHA_MAX_STEPS,
    state_names=ALOHA_STATE_NAMES, action_names=ALOHA_ACTION_NAMES, state_bounds=ALOHA_BOUNDS,
    action_bounds=ALOHA_BOUNDS, camera="top", robot_type="aloha", factory=AlohaTransferCubeEnv)
