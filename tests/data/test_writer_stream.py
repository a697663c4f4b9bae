"""The LeRobot writer streams: a recording hands it one episode at a time, each episode's frames go to the
open video file as it arrives and are not kept (peak memory of `wamkit sim record` stays flat from 50 to 500
episodes: benchmarks/RESULTS.md), and the dataset is the one the all-at-once writer makes."""

import gc
import weakref

import numpy as np

from wamkit.data.writer import LeRobotWriter, RecordedEpisode, write_lerobot_dataset

NAMES = dict(state_names=("a", "b"), action_names=("x",), robot_type="test", episodes_per_file=2)


def _episode(seed: int, length: int) -> RecordedEpisode:
    """Random frames at 64 px, a recording's size: 16 px videos came out with other bytes in about one run in
    ten under load (in- and out-of-process alike; not pinned down), which made the byte comparison flaky."""
    rng = np.random.default_rng(seed)
    return RecordedEpisode("reach", rng.normal(size=(length, 2)).astype(np.float32),
                           rng.normal(size=(length, 1)).astype(np.float32),
                           rng.integers(0, 256, (length, 64, 64, 3), dtype=np.uint8))


def test_streamed_dataset_equals_the_all_at_once_one_and_keeps_no_frames(tmp_path):
    lengths = [5, 7, 3, 6, 4]
    write_lerobot_dataset(tmp_path / "whole", [_episode(i, n) for i, n in enumerate(lengths)], 10, **NAMES)
    writer = LeRobotWriter(tmp_path / "streamed", 10, tasks=["reach"], **NAMES)
    alive = []
    for i, n in enumerate(lengths):
        episode = _episode(i, n)
        writer.add(episode)
        alive.append(weakref.ref(episode.frames))
        del episode
        gc.collect()
    assert not any(ref() is not None for ref in alive)  # no episode's frames outlive its add()
    writer.finish()
    whole = sorted(p.relative_to(tmp_path / "whole") for p in (tmp_path / "whole").rglob("*") if p.is_file())
    streamed = sorted(p.relative_to(tmp_path / "streamed") for p in (tmp_path / "streamed").rglob("*") if p.is_file())
    assert whole == streamed and len(whole) == 3 * 3 + 3  # 3 files each of data, videos, episodes; tasks, stats, info
    for rel in whole:
        assert (tmp_path / "whole" / rel).read_bytes() == (tmp_path / "streamed" / rel).read_bytes(), rel


def test_an_aborted_recording_leaves_nothing(tmp_path):
    writer = LeRobotWriter(tmp_path / "out", 10, tasks=["reach"], **NAMES)
    writer.add(_episode(0, 5))
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def _marker_episode(length: int) -> RecordedEpisode:
    """Grey frames with a one-pixel red marker: the kind of cue 4:2:0 chroma smears at low resolution."""
    frames = np.full((length, 16, 16, 3), 128, np.uint8)
    frames[:, 7, 7] = (230, 20, 20)
    episode = _episode(0, length)
    return RecordedEpisode(episode.task, episode.states, episode.actions, frames)


def test_yuv444p_keeps_the_colour_that_yuv420p_smears_and_loads_back(tmp_path):
    from wamkit.data import LeRobotV3Dataset
    from wamkit.data.doctor import diagnose
    from wamkit.data.writer import DEFAULT_CAMERA_KEY

    errors = {}
    for pix_fmt in ("yuv420p", "yuv444p"):
        root = tmp_path / pix_fmt
        write_lerobot_dataset(root, [_marker_episode(40)], 10, pix_fmt=pix_fmt, **NAMES)
        ds = LeRobotV3Dataset(root)
        assert ds.info["features"][DEFAULT_CAMERA_KEY]["info"]["video.pix_fmt"] == pix_fmt
        frames = ds.decode_frames(0, DEFAULT_CAMERA_KEY, range(40)).astype(int)
        errors[pix_fmt] = np.abs(frames[:, 7, 7] - (230, 20, 20)).max()
        assert diagnose(root).ok, pix_fmt
    assert errors["yuv444p"] <= 8 < errors["yuv420p"], errors


def test_unsupported_pixel_formats_are_refused_before_anything_is_written(tmp_path):
    import pytest

    from wamkit.cli import SIM_PIXEL_FORMATS
    from wamkit.data.writer import PIXEL_FORMATS
    from wamkit.errors import DataError

    assert set(SIM_PIXEL_FORMATS) == set(PIXEL_FORMATS)  # the CLI offers exactly what the writer takes
    with pytest.raises(DataError, match="(?s)pix_fmt.*'yuv444p' is not supported with 'av1'.*yuv420p"):
        LeRobotWriter(tmp_path / "av1", 10, tasks=["reach"], codec="av1", pix_fmt="yuv444p", **NAMES)
    with pytest.raises(DataError, match="pix_fmt.*'rgb24'"):
        LeRobotWriter(tmp_path / "rgb", 10, tasks=["reach"], pix_fmt="rgb24", **NAMES)
    assert list(tmp_path.iterdir()) == []
