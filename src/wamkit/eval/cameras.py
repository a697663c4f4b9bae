"""Which simulator cameras a closed-loop evaluation renders, and how their views reach the policy.

A policy trained on several cameras (a recording made with `wamkit sim record --camera corner,topview`, keys
`observation.images.<camera>`) is evaluated with the same cameras: the env renders them all (observation
`"views"` = {camera: image}) and the policy gets them as one list in its own camera order, the order its
training canvas tiled them in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from wamkit.data.writer import camera_name
from wamkit.errors import WamkitError


class CameraError(WamkitError, ValueError):
    """The env's cameras do not match the policy's."""


def eval_cameras(camera_keys: Sequence[str], camera: str | None = None, recorded: str | None = None) -> str | None:
    """The `camera` argument for the env: the one asked for, else the simulator camera(s) the policy's views were
    recorded with (its contract's `sim_camera`: a one-camera recording keys its view after no camera, and a
    zoomed camera, `corner@2x`, must be rendered zoomed), else the policy's cameras when it has several, else
    None (the env's default camera)."""
    if camera is not None:
        return camera
    if recorded:
        return recorded
    return ",".join(camera_name(k) for k in camera_keys) if len(camera_keys) > 1 else None


def policy_cameras(policy, camera: str | None = None) -> str | None:
    """`eval_cameras` for a loaded policy (wamkit's or a LeRobot adapter: both carry camera_keys and a contract)."""
    return eval_cameras(policy.camera_keys, camera, policy.contract.get("sim_camera"))


def policy_observation(obs: Mapping, camera_keys: Sequence[str]) -> Mapping:
    """An env observation as the policy takes it: for a policy of several cameras, `image` becomes the
    list of the env's views in the policy's camera order."""
    if len(camera_keys) < 2:
        return obs
    views = obs.get("views") or {}
    missing = [k for k in camera_keys if camera_name(k) not in views]
    if missing:
        raise CameraError("evaluate: cameras", f"the env renders {list(views) or 'one camera'}, the policy was trained on "
                          f"{list(camera_keys)} ({missing[0]!r} is missing)",
                          f"render the policy's cameras: --camera {eval_cameras(camera_keys)}")
    return {**obs, "image": [views[camera_name(k)] for k in camera_keys]}
