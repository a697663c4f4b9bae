"""Several simulator cameras in closed-loop evaluation: which the env renders, how the policy gets them."""

import numpy as np
import pytest

from wamkit.eval.cameras import CameraError, eval_cameras, policy_observation

KEYS = ["observation.images.corner", "observation.images.topview"]


def test_a_policy_of_several_cameras_renders_them_all_unless_told_otherwise():
    assert eval_cameras(KEYS) == "corner,topview"
    assert eval_cameras(KEYS, "topview,corner") == "topview,corner"
    assert eval_cameras(["observation.images.front"]) is None  # one camera: the env's default
    assert eval_cameras(["observation.images.front"], recorded="corner@2x") == "corner@2x"  # as its recording rendered it
    assert eval_cameras(["observation.images.front"], "topview", recorded="corner@2x") == "topview"  # asked for


def test_a_zoomed_camera_key_names_the_whole_spec():
    from wamkit.data.writer import camera_key, camera_name

    assert camera_name(camera_key("corner@2.5x")) == "corner@2.5x" and camera_name("a.b.corner") == "corner"
    assert eval_cameras([camera_key("corner@2.5x"), camera_key("topview")]) == "corner@2.5x,topview"


def test_views_reach_the_policy_in_its_camera_order_whatever_the_env_order():
    a, b = np.zeros((4, 4, 3), np.uint8), np.ones((4, 4, 3), np.uint8)
    obs = {"image": b, "views": {"topview": b, "corner": a}, "state": np.zeros(4), "prompt": "p"}
    out = policy_observation(obs, KEYS)
    assert out["image"][0] is a and out["image"][1] is b and obs["image"] is b  # the env's observation is left as it was
    assert policy_observation(obs, KEYS[:1]) is obs


def test_a_missing_camera_names_it_and_the_fix():
    obs = {"image": np.zeros((4, 4, 3), np.uint8), "views": {"corner": np.zeros((4, 4, 3), np.uint8)}}
    with pytest.raises(CameraError, match="topview") as err:
        policy_observation(obs, KEYS)
    assert "--camera corner,topview" in str(err.value)
    with pytest.raises(CameraError, match="one camera"):
        policy_observation({"image": obs["image"]}, KEYS)
