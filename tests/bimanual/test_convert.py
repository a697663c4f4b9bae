"""`wamkit data bundle`: recorded ALOHA transfer-cube episodes (two cameras) -> a bundle every stage validates."""

import json

import numpy as np
import pytest
import torch

import wamkit.sim  # noqa: F401 - picks the headless GL backend before dm_control/mujoco are imported
from wamkit.bimanual import ACTION_NAMES, open_bundle, validate_bundle
from wamkit.bimanual.bundle import asinh_scale
from wamkit.bimanual.convert import FINGER_CLOSED, FINGER_OPEN, convert_lerobot
from wamkit.cli import main
from wamkit.data import LeRobotV3Dataset
from wamkit.data.canvas import compose_frames
from wamkit.data.video import decode_at_times
from wamkit.errors import DataError
from wamkit.sim import SimError, make_env, record

T = 16
CAMERAS = ["observation.images.top", "observation.images.left_wrist"]


@pytest.fixture(scope="module")
def aloha(tmp_path_factory):
    """Three short expert episodes at 25 fps (each action held for two 50 Hz steps), two cameras."""
    out = tmp_path_factory.mktemp("aloha") / "lerobot"
    summary = record("aloha/transfer-cube", 3, out, seed=0, resolution=64, action_repeat=2, camera="top,left_wrist")
    assert summary.kept == 3, summary.format()
    return out


@pytest.fixture(scope="module")
def bundle(aloha, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "b"
    code = main(["data", "bundle", str(aloha), str(out), "--chunk-length", str(T), "--val-fraction", "0.34",
                 "--cameras", ",".join(CAMERAS), "--caption", "bimanual: {task}"])
    assert code == 0
    return out


def test_recording_has_both_cameras(aloha):
    ds = LeRobotV3Dataset(aloha)
    assert sorted(ds.camera_keys) == sorted(CAMERAS)
    top, wrist = (ds.decode_frames(0, k, [0]) for k in CAMERAS)
    assert top.shape == wrist.shape == (1, 64, 64, 3) and np.abs(top.astype(int) - wrist.astype(int)).mean() > 10


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_materializes(bundle, stage):
    report = validate_bundle(bundle, materialize_stage=stage)
    assert report["passed"] and report["materialized"], report["problems"]
    m = report["materialize"]
    assert m["sample"]["video"] == {"shape": [T + 1, 64, 128, 3], "dtype": "uint8"}
    assert m["sample"]["actions"] == {"shape": [T, 64], "dtype": "float32"} and m["sample"]["valid_action_values"] == 14
    assert m["attention"] == ("bidirectional" if stage == 0 else "block_causal")


def test_split_before_windowing(aloha, bundle):
    ds, b = LeRobotV3Dataset(aloha), open_bundle(bundle)
    splits = {}
    for r in b.samples:
        splits.setdefault(r["episode_id"], set()).add(r["split"])
        assert r["frame_end"] - r["frame_start"] == T + 1 and r["frame_start"] % T == 0
    assert all(len(s) == 1 for s in splits.values()) and sorted(splits) == [f"ep{e:05d}" for e in ds.episode_indices]
    assert sum("val" in s for s in splits.values()) == 1
    for ep in ds.episode_indices:  # every window that fits, none past the last frame
        windows = [r for r in b.samples if r["episode_id"] == f"ep{ep:05d}"]
        assert len(windows) == (ds.episode_length(ep) - 1) // T and max(r["frame_end"] for r in windows) <= ds.episode_length(ep)
    assert b.manifest["chunk_length"] == T and b.manifest["fps"] == 25.0 and b.manifest["frame_size"] == [64, 128]
    assert {r["caption"] for r in b.samples} == {f"bimanual: {ds.episode_task(0)}"}


def test_actions_map_to_the_schema_with_pinned_train_stats(aloha, bundle):
    ds, b = LeRobotV3Dataset(aloha), open_bundle(bundle)
    rows = {}
    for ep in ds.episode_indices:
        raw = ds.episode_columns(ep, ["action"])["action"]
        mapped = np.load(bundle / f"actions/ep{ep:05d}.npy")
        assert mapped.shape == (len(raw) - 1, 59)  # row t leads from frame t to t+1
        for side, offset in (("left", 0), ("right", 7)):
            joints = [ACTION_NAMES.index(f"{side}.joint_pos_{j}") for j in range(1, 7)]
            np.testing.assert_allclose(mapped[:, joints], raw[:-1, offset:offset + 6], rtol=1e-6)
            width = mapped[:, ACTION_NAMES.index(f"{side}.gripper_width")]
            np.testing.assert_allclose(width, 2 * (FINGER_CLOSED + raw[:-1, offset + 6] * (FINGER_OPEN - FINGER_CLOSED)), rtol=1e-5)
        rows[ep] = mapped
    valid = np.load(bundle / "actions/ep00000.mask.npy")
    assert valid.sum() == 14 and not valid[ACTION_NAMES.index("left.ee_pos_x")] and not valid[48:].any()
    train = [int(e[2:]) for e in sorted({r["episode_id"] for r in b.samples if r["split"] == "train"})]
    expected = asinh_scale(np.concatenate([rows[e] for e in train]), valid)
    np.testing.assert_allclose(b.manifest["stats"]["scale"], expected, rtol=1e-6)
    everything = asinh_scale(np.concatenate(list(rows.values())), valid)
    assert not np.allclose(everything, expected)  # the held-out episode would have changed them


def test_media_tiles_the_cameras(aloha, bundle):
    ds = LeRobotV3Dataset(aloha)
    frames = [5, 40]
    views = [torch.from_numpy(ds.decode_frames(1, k, frames)) for k in CAMERAS]
    expected = compose_frames(views, "side_by_side", 0).numpy().astype(int)
    got = decode_at_times(bundle / "media/ep00001.mp4", np.array(frames) / 25.0, 25.0).astype(int)
    assert got.shape == expected.shape and np.abs(got - expected).mean() < 3.0  # one lossy re-encode
    assert np.abs(got[:, :, :64] - expected[:, :, 64:]).mean() > 10  # cameras in the order asked


def test_bad_input_errors(aloha, demo_root, tmp_path):
    with pytest.raises(DataError, match="--chunk-length"):
        convert_lerobot(aloha, tmp_path / "a", 10)
    with pytest.raises(DataError, match="cameras"):
        convert_lerobot(aloha, tmp_path / "b", 8, cameras=["observation.images.front"])
    with pytest.raises(DataError, match="--caption"):
        convert_lerobot(aloha, tmp_path / "c", 8, caption="{robot}: {task}")
    with pytest.raises(DataError, match=r"T\+1 = 1001 frames"):
        convert_lerobot(aloha, tmp_path / "d", 1000)
    with pytest.raises(DataError, match=r"features\['action'\].names.*not the ALOHA"):
        convert_lerobot(demo_root, tmp_path / "e", 8)
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "x").write_text("")
    with pytest.raises(DataError, match="not an empty directory"):
        convert_lerobot(aloha, tmp_path / "f", 8)


def test_cli_reports_errors_without_traceback(aloha, tmp_path, capsys):
    assert main(["data", "bundle", str(aloha), str(tmp_path / "x"), "--chunk-length", "6"]) == 2
    err = capsys.readouterr().err
    assert "--chunk-length" in err and "fix:" in err and "Traceback" not in err


def test_single_camera_env_refuses_several():
    with pytest.raises(SimError, match="renders one"):
        make_env("so101/pick-place", camera="front,top")


def test_cli_bundle_output_is_json(aloha, tmp_path, capsys):
    assert main(["data", "bundle", str(aloha), str(tmp_path / "y"), "--chunk-length", "32", "--stride", "24",
                 "--val-fraction", "0"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["validate"]["passed"] and printed["bundle"]["episodes"]["val"] == []
    assert printed["bundle"]["cameras"] == sorted(CAMERAS)
    starts = {r["frame_start"] for r in open_bundle(tmp_path / "y").samples}
    assert starts >= {0, 24, 48}
