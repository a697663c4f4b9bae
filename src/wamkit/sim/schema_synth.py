"""Small synthetic LeRobot v3.0 datasets with a seed recipe's exact schema (action and state dims,
names, fps, camera keys), so every recipe can run end to end on CPU before real data arrives.

Episodes are smooth random walks: actions are low-pass-filtered noise, the state integrates them, and
each camera draws the state as a moving disk (cameras differ in colour and in which state axes they
show), so a world model or policy trained on it has real structure to learn."""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wamkit.errors import ConfigError
from wamkit.data.writer import RecordedEpisode, write_lerobot_dataset


@dataclass(frozen=True)
class DatasetSchema:
    action_names: tuple[str, ...]
    state_names: tuple[str, ...]
    fps: int
    cameras: dict[str, tuple[int, int]]  # key -> (H, W) of the tiny variant
    robot_type: str
    tasks: tuple[str, ...] = ("do the task",)
    layout: tuple[str, ...] = field(default=())  # sub-datasets, e.g. ("success", "failure")


def _names(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}_{i}" for i in range(n))


SCHEMAS: dict[str, DatasetSchema] = {
    # seed 000: flat 36-D whole-body action, 32-D proprio state, one ego camera, 50 fps
    "g1_simple": DatasetSchema(_names("g1_action", 36), _names("g1_state", 32), 50,
                               {"observation.images.ego_view": (64, 96)}, "unitree_g1",
                               ("walk to the table and pick up the box", "pick up the bottle")),
    # seed 001: 8-D joint position (7 joints + gripper) actions and state; wrist + two exterior cameras
    "droid": DatasetSchema((*_names("joint_position", 7), "gripper_position"), (*_names("joint_position", 7), "gripper_position"), 15,
                           {"observation.images.wrist_left": (64, 112), "observation.images.exterior_1_left": (64, 112),
                            "observation.images.exterior_2_left": (64, 112)}, "franka",
                           ("put the marker in the cup", "close the drawer"), ("success", "failure")),
    # seed 004: 10-D Cartesian EE delta (dx, dy, dz, 6-D rotation, gripper), one top camera, 30 fps
    "so101": DatasetSchema(("dx", "dy", "dz", "r11", "r21", "r31", "r12", "r22", "r32", "gripper"),
                           _names("joint", 6), 30, {"observation.images.top": (64, 112)}, "so101",
                           ("pick up the cube and place it in the bin",)),
}


def _episode(rng: np.random.Generator, schema: DatasetSchema, length: int, cam_index: dict[str, int]) -> RecordedEpisode:
    da, ds = len(schema.action_names), len(schema.state_names)
    noise = rng.normal(size=(length, da))
    actions = np.zeros((length, da))
    for t in range(length):  # low-pass: smooth, learnable dynamics
        actions[t] = (0.8 * actions[t - 1] if t else 0) + 0.2 * noise[t]
    state = np.zeros((length, ds))
    state[0] = rng.uniform(-0.5, 0.5, ds)
    coupling = rng.normal(scale=0.2, size=(da, ds)) / np.sqrt(da)
    for t in range(1, length):
        state[t] = np.clip(state[t - 1] + 0.2 * actions[t - 1] @ coupling, -1, 1)
    frames = {key: _render(state, h, w, cam_index[key]) for key, (h, w) in schema.cameras.items()}
    task = schema.tasks[int(rng.integers(len(schema.tasks)))]
    return RecordedEpisode(task, state.astype(np.float32), actions.astype(np.float32), frames)


def _render(state: np.ndarray, h: int, w: int, cam: int) -> np.ndarray:
    """A disk whose position follows two state axes (different per camera) on a tinted background."""
    yy, xx = np.mgrid[0:h, 0:w]
    axes = (2 * cam) % state.shape[1], (2 * cam + 1) % state.shape[1]
    colour = np.array([(200, 60, 60), (60, 200, 60), (60, 60, 200)][cam % 3], dtype=np.uint8)
    frames = np.empty((len(state), h, w, 3), dtype=np.uint8)
    frames[:] = (30 + 20 * cam, 30, 40)
    radius = max(3, min(h, w) // 8)
    for t, s in enumerate(state):
        cy, cx = (0.5 + 0.4 * s[axes[0]]) * h, (0.5 + 0.4 * s[axes[1]]) * w
        frames[t][(yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2] = colour
    return frames


def write_schema_dataset(schema_name: str, out_dir: str | Path, episodes: int = 6, length: int = 60, seed: int = 0,
                         camera_size: tuple[int, int] | None = None) -> Path:
    """Write a dataset (or, for layouts like DROID's, one per sub-directory) with the schema; every
    camera at `camera_size` (H, W) when given (real frame sizes for GPU benchmarks), else the tiny size."""
    if schema_name not in SCHEMAS:
        raise ConfigError("schema", f"unknown schema {schema_name!r}", f"use one of {sorted(SCHEMAS)}")
    schema = SCHEMAS[schema_name]
    if camera_size is not None:
        schema = dataclasses.replace(schema, cameras={key: tuple(camera_size) for key in schema.cameras})
    rng = np.random.default_rng(seed)
    cam_index = {key: i for i, key in enumerate(schema.cameras)}
    out_dir = Path(out_dir)
    for part in schema.layout or ("",):
        eps = [_episode(rng, schema, int(rng.integers(length, length + 20)), cam_index) for _ in range(episodes)]
        first_camera = next(iter(schema.cameras))
        write_lerobot_dataset(out_dir / part if part else out_dir, eps, schema.fps, state_names=schema.state_names,
                              action_names=schema.action_names, robot_type=schema.robot_type, camera_key=first_camera,
                              episodes_per_file=max(2, episodes // 2))
    return out_dir
