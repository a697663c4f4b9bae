"""The embedded demo dataset: a tiny 2-D reaching task written as a real LeRobot v3.0 dataset.

It lets every recipe, test and tutorial run end to end without downloads: a red point robot must
reach the green or blue disk (the other colour is a distractor), driven by a noisy proportional
expert. Writing it with our own v3.0 writer also exercises the reader on multi-episode parquet and
mp4 files. The renderer and simulator are public so tests can compare decoded data to ground truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from wamkit.data.writer import RecordedEpisode, check_encoding, write_lerobot_dataset
from wamkit.errors import DataError

TASKS = ("reach the green target", "reach the blue target")
CAMERA_KEY = "observation.images.front"
_COLORS = {"background": (40, 40, 48), "robot": (230, 40, 40), "green": (40, 200, 70), "blue": (50, 90, 235)}
_RADIUS = {"robot": 0.07, "target": 0.09}  # fractions of the image side
_REACH = 0.06  # gripper closes within this distance of the target
_GAIN, _VMAX, _NOISE = 2.0, 0.5, 0.03  # proportional gain [1/s], speed limit [side/s], command noise


@dataclass
class SynthEpisode:
    """Ground truth of one simulated episode: states [L,4], actions [L,3], frames [L,H,W,3]."""

    task_index: int
    states: np.ndarray
    actions: np.ndarray
    frames: np.ndarray
    green: np.ndarray
    blue: np.ndarray


# ---- simulation ---------------------------------------------------------------------------------
def render_scene(robot_xy: np.ndarray, green_xy: np.ndarray, blue_xy: np.ndarray, image_size: int) -> np.ndarray:
    """Top-down RGB uint8 image; positions in [0,1]^2 (x right, y down); soft disk edges help the codec."""
    img = np.empty((image_size, image_size, 3), np.float32)
    img[:] = _COLORS["background"]
    pix = (np.arange(image_size, dtype=np.float32) + 0.5) / image_size
    for xy, color, radius in ((green_xy, "green", _RADIUS["target"]), (blue_xy, "blue", _RADIUS["target"]),
                              (robot_xy, "robot", _RADIUS["robot"])):
        dist = np.hypot(pix[None, :] - xy[0], pix[:, None] - xy[1]) * image_size
        alpha = np.clip(radius * image_size + 0.5 - dist, 0.0, 1.0)[..., None]
        img = img * (1 - alpha) + np.asarray(_COLORS[color], np.float32) * alpha
    return np.round(img).astype(np.uint8)


def _place(rng: np.random.Generator, others: Sequence[np.ndarray], min_sep: float = 0.3) -> np.ndarray:
    """Random point in [0.15, 0.85]^2 at least min_sep from the others."""
    while True:
        p = rng.uniform(0.15, 0.85, size=2)
        if all(np.hypot(*(p - o)) >= min_sep for o in others):
            return p


def simulate_episode(rng: np.random.Generator, fps: int, image_size: int, length: int) -> SynthEpisode:
    """Roll out the scripted expert for `length` steps; state is recorded before each action."""
    task_index = int(rng.integers(len(TASKS)))
    pos = rng.uniform(0.15, 0.85, size=2)
    green = _place(rng, [pos])
    blue = _place(rng, [pos, green])
    target = green if task_index == 0 else blue
    vel, dt = np.zeros(2), 1.0 / fps
    states, actions, frames = [], [], []
    for _ in range(length):
        states.append([*pos, *vel])
        frames.append(render_scene(pos, green, blue, image_size))
        cmd = _GAIN * (target - pos)
        speed = np.hypot(*cmd)
        cmd = cmd * min(1.0, _VMAX / max(speed, 1e-9)) + rng.normal(0.0, _NOISE, size=2)
        grip = 1.0 if np.hypot(*(target - pos)) < _REACH else 0.0
        actions.append([*cmd, grip])
        vel = 0.5 * vel + 0.5 * cmd  # first-order actuator lag
        pos = np.clip(pos + vel * dt, 0.0, 1.0)
    return SynthEpisode(task_index, np.asarray(states, np.float32), np.asarray(actions, np.float32),
                        np.stack(frames), green, blue)


def generate_episodes(num_episodes: int, fps: int = 10, image_size: int = 64, seed: int = 0,
                      min_length: int = 40, max_length: int = 60) -> list[SynthEpisode]:
    """Deterministic for a seed, so tests can regenerate the ground truth of a written dataset."""
    rng = np.random.default_rng(seed)
    return [simulate_episode(rng, fps, image_size, int(rng.integers(min_length, max_length + 1)))
            for _ in range(num_episodes)]


def write_demo_dataset(out_dir: str | Path, num_episodes: int = 32, fps: int = 10, image_size: int = 64,
                       episodes_per_file: int = 16, seed: int = 0, codec: str = "h264") -> Path:
    """Simulate and write the demo dataset to `out_dir` (built in a temp dir, then renamed into place)."""
    out_dir = Path(out_dir)
    check_encoding(codec, "yuv420p", caller="write_demo_dataset")  # before simulating the episodes
    if num_episodes < 1 or episodes_per_file < 1 or image_size < 16 or image_size % 2 or fps < 1:
        raise DataError("write_demo_dataset", f"bad sizes num_episodes={num_episodes} episodes_per_file="
                        f"{episodes_per_file} image_size={image_size} fps={fps}",
                        "use positive counts and an even image_size >= 16")
    episodes = [RecordedEpisode(TASKS[e.task_index], e.states, e.actions, e.frames)
                for e in generate_episodes(num_episodes, fps, image_size, seed)]
    write_lerobot_dataset(out_dir, episodes, fps, state_names=("x", "y", "vx", "vy"), action_names=("dx", "dy", "grip"),
                          robot_type="planar_point_robot", camera_key=CAMERA_KEY, episodes_per_file=episodes_per_file,
                          codec=codec, tasks=TASKS)
    return out_dir
