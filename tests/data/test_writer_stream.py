"""The LeRobot writer streams: a recording hands it one episode at a time, each episode's frames go to the
open video file as it arrives and are not kept (peak memory of `wamkit sim record` stays flat from 50 to 500
episodes: benchmarks/RESULTS.md), and the dataset is the one the all-at-once writer makes."""

import gc
import weakref

import numpy as np

from wamkit.data.writer import LeRobotWriter, RecordedEpisode, write_lerobot_dataset

NAMES = dict(state_names=("a", "b"), action_names=("x",), robot_type="test", episodes_per_file=2)


def _episode(seed: int, length: int) -> RecordedEpisode:
    rng = np.random.default_rng(seed)
    return RecordedEpisode("reach", rng.normal(size=(length, 2)).astype(np.float32),
                           rng.normal(size=(length, 1)).astype(np.float32),
                           rng.integers(0, 256, (length, 16, 16, 3), dtype=np.uint8))


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
