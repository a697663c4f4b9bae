"""WindowDataset: index over episodes, shapes, content against ground truth, errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from wamkit.data import Window, WindowDataset
from wamkit.data.synth import CAMERA_KEY, TASKS
from wamkit.errors import DataError

from .framecheck import robot_centroid

T = 8


def test_index_covers_every_start(demo_ds, demo_truth):
    windows = WindowDataset(demo_ds, demo_ds.episode_indices, chunk_length=T)
    assert len(windows) == sum(len(t.states) - T for t in demo_truth)
    strided = WindowDataset(demo_ds, [2, 5], chunk_length=T, stride=4)
    assert len(strided) == sum(len(range(0, len(demo_truth[e].states) - T, 4)) for e in (2, 5))
    assert {int(e) for e, _ in strided.index} == {2, 5}


def test_window_shapes_and_content(demo_ds, demo_truth):
    windows = WindowDataset(demo_ds, [1, 7], chunk_length=T)
    for i in (0, len(windows) - 1, len(windows) // 2):
        w = windows[i]
        assert isinstance(w, Window)
        truth, s = demo_truth[w.episode_index], w.start
        assert w.video.dtype == torch.uint8 and w.video.shape == (1, T + 1, 64, 64, 3)
        assert w.state.dtype == torch.float32 and w.state.shape == (T + 1, 4)
        assert w.action.dtype == torch.float32 and w.action.shape == (T, 3)
        np.testing.assert_array_equal(w.state.numpy(), truth.states[s:s + T + 1])
        np.testing.assert_array_equal(w.action.numpy(), truth.actions[s:s + T])
        assert w.task == TASKS[truth.task_index]
        expected = truth.states[s:s + T + 1, :2] * 64 - 0.5
        assert np.hypot(*(robot_centroid(w.video[0].numpy()) - expected).T).max() < 1.0
    assert windows[len(windows) - 1].start == len(demo_truth[7].states) - T - 1


def test_multi_camera_and_no_state(demo_ds):
    windows = WindowDataset(demo_ds, [0], chunk_length=4, camera_keys=[CAMERA_KEY, CAMERA_KEY], state_key=None)
    w = windows[3]
    assert w.video.shape == (2, 5, 64, 64, 3) and w.state is None and w.action.shape == (4, 3)
    assert torch.equal(w.video[0], w.video[1])


def test_picklable_for_dataloader_workers(demo_ds):
    windows = WindowDataset(demo_ds, [0, 3], chunk_length=T)
    windows[0]
    clone = pickle.loads(pickle.dumps(windows))
    assert torch.equal(clone[5].action, windows[5].action)


def test_chunk_longer_than_every_episode(demo_ds, demo_truth):
    longest = max(len(t.states) for t in demo_truth)
    with pytest.raises(DataError, match=rf"no episode has {longest + 1} frames.*chunk_length={longest}") as err:
        WindowDataset(demo_ds, demo_ds.episode_indices, chunk_length=longest)
    assert f"at most {longest - 1}" in err.value.fix
    WindowDataset(demo_ds, demo_ds.episode_indices, chunk_length=longest - 1)  # the suggested fix works


def test_bad_keys_and_episodes(demo_ds):
    with pytest.raises(DataError, match="'observation.images.wrist'.*not a video feature"):
        WindowDataset(demo_ds, [0], T, camera_keys=["observation.images.wrist"])
    with pytest.raises(DataError, match=r"info.json: features.*'observation.joints' is missing"):
        WindowDataset(demo_ds, [0], T, state_key="observation.joints")
    with pytest.raises(DataError, match="episode 99 not found"):
        WindowDataset(demo_ds, [0, 99], T)
    with pytest.raises(DataError, match="chunk_length=0"):
        WindowDataset(demo_ds, [0], 0)


def _keep(batch):
    return batch


def test_dataloader_workers_decode_like_main_process(demo_ds):
    """Forked workers must not reuse the parent's open video containers (the cache resets per pid)."""
    windows = WindowDataset(demo_ds, [3, 4], chunk_length=T, stride=7)
    expected = [windows[i] for i in range(len(windows))]  # fills the parent's container cache first
    loader = torch.utils.data.DataLoader(windows, batch_size=2, num_workers=2, collate_fn=_keep)
    got = [w for batch in loader for w in batch]
    assert [(w.episode_index, w.start) for w in got] == [(w.episode_index, w.start) for w in expected]
    assert all(torch.equal(a.video, b.video) and torch.equal(a.action, b.action) for a, b in zip(got, expected))
