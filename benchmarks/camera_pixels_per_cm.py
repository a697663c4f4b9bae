"""How far the object and the goal move in the image, in pixels per centimetre, for each Meta-World camera.

    python benchmarks/camera_pixels_per_cm.py [--tasks reach-v3,button-press-topdown-v3] [--resolution 64] [--placements 30]

A policy can only act on a placement it can see: where the expert's next move depends on the object's place along
one world axis, that axis must move the object by enough pixels. For each task this prints the spread of the object
and goal placements over `--placements` reset seeds (cm) and, for each camera, the image motion of a 1 cm move along
world x, y and z at the mean placement (the pinhole projection with MuJoCo's camera pose and field of view, so no
rendering is involved). The table is issue 26's evidence that x is sub-pixel for the tasks that fail from the corner
view at 64 px (benchmarks/RESULTS.md, twenty-third session).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from wamkit.sim.base import parse_camera  # noqa: E402
from wamkit.sim.envs import make_env  # noqa: E402

CAMERAS = ("corner", "corner2", "corner3", "topview", "behindGripper", "corner@2x")  # NAME@<zoom>x: `--camera corner@2x`


def project(model, data, camera: int, point: np.ndarray, resolution: int, zoom: float = 1.0) -> np.ndarray:
    """Pixel coordinates of a world point in a square frame of `resolution` px (MuJoCo cameras look along -z);
    a zoom scales the focal length, as `wamkit.sim.base.zoomed_fovy` narrows the field of view."""
    in_camera = data.cam_xmat[camera].reshape(3, 3).T @ (point - data.cam_xpos[camera])
    focal = zoom * (resolution / 2) / np.tan(np.deg2rad(model.cam_fovy[camera]) / 2)
    return focal * in_camera[:2] / -in_camera[2]


def pixels_per_cm(model, data, camera: int, point: np.ndarray, resolution: int, zoom: float = 1.0) -> list[float]:
    """Image motion (px) of a 1 cm move along world x, y, z from `point`."""
    base = project(model, data, camera, point, resolution, zoom)
    moves = []
    for axis in range(3):
        moved = point.copy()
        moved[axis] += 0.01
        moves.append(float(np.linalg.norm(project(model, data, camera, moved, resolution, zoom) - base)))
    return moves


def placements(env, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Object and goal positions (m) after `count` resets; Meta-World's observation holds them at [4:7] and [-3:]."""
    objects, goals = [], []
    for seed in range(count):
        env.reset(1000 + seed)
        raw = env._raw_obs  # the privileged observation the scripted expert reads
        objects.append(raw[4:7].copy())
        goals.append(raw[-3:].copy())
    return np.array(objects), np.array(goals)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="reach-v3,push-v3,pick-place-v3,button-press-topdown-v3,window-open-v3,peg-insert-side-v3")
    p.add_argument("--resolution", type=int, default=64)
    p.add_argument("--placements", type=int, default=30)
    args = p.parse_args()
    import mujoco

    print("| task | spread x / y / z (cm): object; goal | camera | object px/cm x / y / z | goal px/cm x / y / z |")
    print("| --- | --- | --- | --- | --- |")
    for task in args.tasks.split(","):
        env = make_env(f"metaworld/{task}", resolution=args.resolution)
        objects, goals = placements(env, args.placements)
        model, data = env._env.model, env._env.data
        spread = "; ".join(" / ".join(f"{100 * np.ptp(p[:, a]):.1f}" for a in range(3)) for p in (objects, goals))
        for camera in CAMERAS:
            name, zoom, _ = parse_camera(camera)  # shadows do not move a pixel
            camera_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, name)
            if camera_id < 0:
                continue
            cells = [" / ".join(f"{v:.2f}" for v in pixels_per_cm(model, data, camera_id, p.mean(0), args.resolution, zoom))
                     for p in (objects, goals)]
            print(f"| {task} | {spread} | {camera} | {cells[0]} | {cells[1]} |")
            task, spread = "", ""
        env.close()


if __name__ == "__main__":
    main()
