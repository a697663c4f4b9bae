"""ALOHA transfer-cube (gym-aloha): IK, the scripted expert, recording to LeRobot v3.0."""

import json

import numpy as np
import pytest

import wamkit.sim  # noqa: F401 - picks the headless GL backend before dm_control/mujoco are imported

pytest.importorskip("gym_aloha")

from wamkit.data import LeRobotV3Dataset  # noqa: E402
from wamkit.data.doctor import DatasetExpectation, diagnose  # noqa: E402
from wamkit.sim import SimError, env_names, get_spec, make_env, record  # noqa: E402
from wamkit.sim.aloha import ArmIK  # noqa: E402

ENV = "aloha/transfer-cube"


@pytest.fixture(scope="module")
def model():
    from dm_control import mujoco as dm_mujoco
    from gym_aloha.constants import ASSETS_DIR

    return dm_mujoco.Physics.from_xml_path(str(ASSETS_DIR / "bimanual_viperx_transfer_cube.xml")).model.ptr


def test_registry_spec():
    spec = get_spec(ENV)
    assert ENV in env_names()
    assert spec.fps == 50.0 and spec.state_dim == 14 and spec.action_dim == 14 and spec.max_episode_steps == 400
    assert spec.state_names[6] == "left_gripper" and spec.action_names[13] == "right_gripper"


@pytest.mark.parametrize("side", ["left", "right"])
def test_ik_reaches_target_site_position(model, side):
    """DLS IK puts the gripper_link-frame point at the `midair` site (position only), then at a full pose."""
    import mujoco

    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    site = data.site_xpos[model.site("midair").id].copy()  # (0, 0.6, 0.2)
    ik = ArmIK(model, side)
    home = np.array([0, -0.96, 1.16, 0, -0.3, 0])
    q, err_p, _ = ik.solve(home, site)
    pos, _ = ik.fk(q)
    assert err_p < 1e-3 and np.linalg.norm(pos - site) < 1e-3
    assert np.all(q >= ik.low - 1e-9) and np.all(q <= ik.high + 1e-9)
    # pose target: a reachable pose taken from forward kinematics of other joint angles
    q_ref = np.array([0.3, -0.5, 0.8, 0.2, 0.4, -0.3])
    pos_ref, quat_ref = ik.fk(q_ref)
    q2, err_p, err_r = ik.solve(home, pos_ref, quat_ref, iters=200)
    pos2, quat2 = ik.fk(q2)
    assert err_p < 1e-3 and err_r < 1e-2 and np.linalg.norm(pos2 - pos_ref) < 1e-3
    assert abs(abs(float(np.dot(quat2, quat_ref))) - 1.0) < 1e-4


def test_env_observation_step_and_errors():
    with make_env(ENV, resolution=64) as env:
        a = env.reset(3)
        assert a["image"].shape == (64, 64, 3) and a["image"].dtype == np.uint8
        assert a["state"].shape == (14,) and a["state"].dtype == np.float32 and a["prompt"] == get_spec(ENV).task
        action = env.expert_action()
        assert action.shape == (14,) and action.dtype == np.float32
        r = env.step(action)
        assert r.obs["state"].shape == (14,) and not r.done and r.info["reward"] == 0
        with pytest.raises(SimError, match="14 finite floats"):
            env.step(np.zeros(4))
        b = env.reset(3)
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_allclose(a["state"], b["state"])


def test_record_two_episodes_loads_and_passes_doctor(tmp_path):
    out = tmp_path / "aloha"
    # attempt 1 gets a 50-step budget: the expert cannot succeed, so it is dropped and counted
    summary = record(ENV, 3, out, seed=0, resolution=64, step_budgets=[None, 50, None])
    assert summary.attempted == 3 and summary.kept == 2 and summary.dropped_attempts == [1], summary.format()
    ds = LeRobotV3Dataset(out)
    assert ds.fps == 50.0 and ds.episode_indices == [0, 1]
    assert ds.feature_dim("observation.state") == 14 and ds.feature_dim("action") == 14
    assert ds.episode_task(0) == get_spec(ENV).task
    lengths = [ds.episode_length(e) for e in ds.episode_indices]
    assert lengths == summary.kept_lengths and all(200 < n <= 400 for n in lengths)
    frames = ds.decode_frames(0, ds.camera_keys[0], [0, lengths[0] - 1])
    assert frames.shape == (2, 64, 64, 3)
    report = diagnose(out, DatasetExpectation(chunk_length=16, max_action_dim=16, fps=50.0))
    assert report.ok, report.format()
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["robot_type"] == "aloha" and info["features"]["action"]["names"][6] == "left_gripper"
