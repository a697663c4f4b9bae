"""LeRobot v3.0 reader: round trip against the writer's ground truth, multi-file layout, codecs, errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wamkit.data import LeRobotV3Dataset, generate_episodes, write_demo_dataset
from wamkit.data.synth import CAMERA_KEY, TASKS
from wamkit.data.video import close_all
from wamkit.errors import DataError

from .framecheck import check_frames as _check_frames


def test_metadata(demo_ds, demo_truth):
    assert demo_ds.fps == 10.0
    assert demo_ds.info["codebase_version"] == "v3.0"
    assert demo_ds.camera_keys == [CAMERA_KEY]
    assert demo_ds.episode_indices == list(range(8))
    assert [demo_ds.episode_length(e) for e in range(8)] == [len(t.states) for t in demo_truth]
    assert [demo_ds.episode_task(e) for e in range(8)] == [TASKS[t.task_index] for t in demo_truth]
    assert demo_ds.feature_dim("observation.state") == 4 and demo_ds.feature_dim("action") == 3
    assert demo_ds.tasks == dict(enumerate(TASKS))
    assert set(demo_ds.stats) == {"observation.state", "action"}
    assert demo_ds.stats["action"]["q99"].shape == (3,)


def test_parquet_round_trip_exact(demo_ds, demo_truth):
    for ep, truth in enumerate(demo_truth):
        cols = demo_ds.episode_columns(ep, ["observation.state", "action", "timestamp", "task_index"])
        np.testing.assert_array_equal(cols["observation.state"], truth.states)
        np.testing.assert_array_equal(cols["action"], truth.actions)
        np.testing.assert_array_equal(cols["timestamp"], (np.arange(len(truth.states)) / 10).astype(np.float32))
        assert set(cols["task_index"].tolist()) == {truth.task_index}


def test_episodes_spread_over_files(demo_ds):
    files = {demo_ds._data_path(e).name for e in demo_ds.episode_indices}
    videos = {demo_ds.video_path(e, CAMERA_KEY).name for e in demo_ds.episode_indices}
    assert files == {f"file-00{i}.parquet" for i in range(3)}
    assert videos == {f"file-00{i}.mp4" for i in range(3)}


def test_frames_round_trip_first_file(demo_ds, demo_truth):
    truth = demo_truth[1]
    _check_frames(demo_ds.decode_frames(1, CAMERA_KEY, range(len(truth.states))), truth)


def test_frames_located_in_later_files(demo_ds, demo_truth):
    """Episodes 4 (middle of file-001) and 7 (file-002) start at a non-zero from_timestamp."""
    for ep in (4, 7):
        assert demo_ds.video_path(ep, CAMERA_KEY).name != "file-000.mp4"
        assert demo_ds._episode(ep)[f"videos/{CAMERA_KEY}/from_timestamp"] > 0
        truth = demo_truth[ep]
        _check_frames(demo_ds.decode_frames(ep, CAMERA_KEY, range(len(truth.states))), truth)
        # a sparse, unordered request returns frames in request order
        idx = [len(truth.states) - 1, 0, 3, 2]
        _check_frames(demo_ds.decode_frames(ep, CAMERA_KEY, idx), truth, idx)


def test_av1_decoding(tmp_path):
    root = write_demo_dataset(tmp_path / "av1", num_episodes=3, episodes_per_file=2, seed=1, codec="libsvtav1")
    ds = LeRobotV3Dataset(root)
    assert ds.features[CAMERA_KEY]["info"]["video.codec"] == "av1"
    truth = generate_episodes(3, seed=1)
    for ep in (0, 2):
        _check_frames(ds.decode_frames(ep, CAMERA_KEY, range(ds.episode_length(ep))), truth[ep])


def test_variable_length_list_columns(demo_copy, demo_truth):
    """HF datasets may store vectors as list<float> instead of fixed_size_list."""
    path = demo_copy / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    i = table.column_names.index("action")
    pq.write_table(table.set_column(i, "action", table.column("action").cast(pa.list_(pa.float32()))), path)
    ds = LeRobotV3Dataset(demo_copy)
    np.testing.assert_array_equal(ds.episode_columns(2, ["action"])["action"], demo_truth[2].actions)


# ---- errors -------------------------------------------------------------------------------------
def _raises(match: str):
    return pytest.raises(DataError, match=match)


def test_missing_info(demo_copy):
    (demo_copy / "meta/info.json").unlink()
    with _raises("meta/info.json is missing"):
        LeRobotV3Dataset(demo_copy)


def test_wrong_codebase_version(demo_copy):
    path = demo_copy / "meta/info.json"
    info = json.loads(path.read_text())
    info["codebase_version"] = "v2.1"
    path.write_text(json.dumps(info))
    with _raises(r"info.json: codebase_version.*'v2.1'"):
        LeRobotV3Dataset(demo_copy)


def test_missing_video_file(demo_copy):
    video = demo_copy / f"videos/{CAMERA_KEY}/chunk-000/file-001.mp4"
    video.unlink()
    ds = LeRobotV3Dataset(demo_copy)
    ds.decode_frames(0, CAMERA_KEY, [0])  # other files still work
    with pytest.raises(DataError, match="video file is missing") as err:
        ds.decode_frames(4, CAMERA_KEY, [0])
    assert err.value.where == str(video)


def test_missing_data_parquet(demo_copy):
    path = demo_copy / "data/chunk-000/file-002.parquet"
    path.unlink()
    ds = LeRobotV3Dataset(demo_copy)
    with pytest.raises(DataError, match="parquet file is missing") as err:
        ds.episode_columns(7, ["action"])
    assert err.value.where == str(path)


def test_missing_episodes_and_tasks_metadata(demo_copy):
    (demo_copy / "meta/tasks.parquet").unlink()
    with _raises("tasks.parquet: parquet file is missing"):
        LeRobotV3Dataset(demo_copy)


def test_missing_feature(demo_ds):
    with _raises(r"info.json: features.*'observation.joints' is missing"):
        demo_ds.episode_columns(0, ["observation.joints"])
    with _raises("'observation.joints' is missing"):
        demo_ds.decode_frames(0, "observation.joints", [0])


def test_length_mismatch(demo_copy):
    path = demo_copy / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    lengths = table.column("length").to_pylist()
    lengths[1] += 1
    pq.write_table(table.set_column(table.column_names.index("length"), "length", pa.array(lengths)), path)
    ds = LeRobotV3Dataset(demo_copy)
    with _raises(r"file-000.parquet: episode 1.*meta/episodes length"):
        ds.episode_columns(1, ["action"])


def test_feature_width_mismatch(demo_copy):
    path = demo_copy / "meta/info.json"
    info = json.loads(path.read_text())
    info["features"]["action"]["shape"] = [7]
    path.write_text(json.dumps(info))
    with _raises(r"'action'.*3 values but info.json shape is \[7\]"):
        LeRobotV3Dataset(demo_copy).episode_columns(0, ["action"])


def test_bad_from_timestamp(demo_copy):
    """An offset pointing past the video is caught instead of returning the wrong frames."""
    path = demo_copy / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    col = f"videos/{CAMERA_KEY}/from_timestamp"
    shifted = pa.array([t + 100.0 for t in table.column(col).to_pylist()])
    pq.write_table(table.set_column(table.column_names.index(col), col, shifted), path)
    with _raises("no frame within half a frame period"):
        LeRobotV3Dataset(demo_copy).decode_frames(0, CAMERA_KEY, [0])
    close_all()
