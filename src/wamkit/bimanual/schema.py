"""The unified bimanual action schema (wamkit-bimanual-v1): 59 named semantic values, padded to 64.

Layout (index ranges are fixed; a source marks the values it does not provide as invalid in its
per-value validity mask, and those values carry neither noise nor loss):

  0-23   left arm   ee_pos xyz (3, metres, base frame) | ee_rot6d (6, first two rotation-matrix
                    columns, column-major) | gripper_width (1, metres, calibrated) | joint_pos j1..j7
                    (7, rad) | ee_linvel xyz (3, m/s) | ee_angvel xyz (3, rad/s) |
                    gripper_vel (1, m/s)
  24-47  right arm  the same 24 values
  48-58  body       base_x, base_y, base_yaw, base_vx, base_vy, base_wz, torso_lift, torso_pitch,
                    torso_yaw, head_pan, head_tilt (11)
  59-63  padding    always invalid (mask false)

Row t of an action array is the command that leads from observation t to observation t+1 (a window
of T+1 frames has T rows). Exactness to any proprietary schema is not claimed."""

from __future__ import annotations

SCHEMA_ID = "wamkit-bimanual-v1"
PADDED_DIM = 64

_ARM = (
    [f"ee_pos_{a}" for a in "xyz"] + [f"ee_rot6d_{i}" for i in range(6)] + ["gripper_width"]
    + [f"joint_pos_{j}" for j in range(1, 8)] + [f"ee_linvel_{a}" for a in "xyz"] + [f"ee_angvel_{a}" for a in "xyz"]
    + ["gripper_vel"]
)
_BODY = ["base_x", "base_y", "base_yaw", "base_vx", "base_vy", "base_wz", "torso_lift", "torso_pitch", "torso_yaw",
         "head_pan", "head_tilt"]
ACTION_NAMES: tuple[str, ...] = tuple([f"left.{n}" for n in _ARM] + [f"right.{n}" for n in _ARM] + [f"body.{n}" for n in _BODY])
ACTION_DIM = len(ACTION_NAMES)
assert ACTION_DIM == 59 and len(set(ACTION_NAMES)) == 59

ARM_SIZE = len(_ARM)


def index(name: str) -> int:
    return ACTION_NAMES.index(name)


def arm_slice(arm: str) -> slice:
    start = 0 if arm == "left" else ARM_SIZE
    return slice(start, start + ARM_SIZE)
