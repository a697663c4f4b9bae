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


def test_side_by_side_canvas_of_a_window_is_a_view(demo_ds):
    """Cameras are decoded into one side-by-side buffer: the native canvas tiles them without a copy."""
    from wamkit.data import CanvasTransform
    w = WindowDataset(demo_ds, [2], chunk_length=4, camera_keys=[CAMERA_KEY, CAMERA_KEY])[1]
    canvas = CanvasTransform()(w.video)
    assert torch.equal(canvas, torch.cat(list(w.video), dim=2)) and canvas.is_contiguous()
    assert canvas.data_ptr() == w.video.data_ptr()


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
    with pytest.raises(DataError, match=r"'observation.images.wrist'.*not a camera \(video or image\) feature"):
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


def test_cameras_of_different_sizes(tmp_path):
    """A 64x64 front and a 32x48 wrist camera: each view decoded at its own size, tiled by the canvas after
    the taller view is shrunk to the shorter one's height (never upscaling), then fitted to the tier."""
    from wamkit.data import (CanvasTransform, LeRobotV3Dataset, Normalizer, RecordedEpisode, SampleTransform,
                             generate_episodes, write_lerobot_dataset)
    from .framecheck import check_frames
    truth = generate_episodes(2, 10, 64, seed=5)
    wrist = "observation.images.wrist"
    episodes = [RecordedEpisode(TASKS[e.task_index], e.states, e.actions,
                                {CAMERA_KEY: e.frames, wrist: np.ascontiguousarray(e.frames[:, ::2, 8:56])}) for e in truth]
    write_lerobot_dataset(tmp_path / "ds", episodes, 10, state_names=("x", "y", "vx", "vy"),
                          action_names=("dx", "dy", "grip"), robot_type="t", tasks=TASKS)
    ds = LeRobotV3Dataset(tmp_path / "ds")
    windows = WindowDataset(ds, ds.episode_indices, chunk_length=4, camera_keys=[CAMERA_KEY, wrist])
    w = windows[6]
    front, side = w.video
    assert front.shape == (5, 64, 64, 3) and side.shape == (5, 32, 48, 3)
    check_frames(front.numpy(), truth[w.episode_index], np.arange(w.start, w.start + 5))
    half = truth[w.episode_index].frames[w.start:w.start + 5, ::2, 8:56].astype(np.int16)
    assert np.abs(side.numpy().astype(np.int16) - half).mean() < 8.0
    norm = Normalizer.from_stats(ds.stats, "action", "minmax")
    for tier, size in ((0, (32, 80)), (256, (192, 320))):
        canvas = CanvasTransform("side_by_side", tier, padding="zero")
        assert canvas.size([(64, 64), (32, 48)]) == size
        video = SampleTransform(norm, None, 8, False, 0, canvas=canvas)(w).video
        assert video.shape == (5, *size, 3)
        assert torch.equal(video[:, :32, 32:80], side)  # the shorter view is never resized
        assert not video[:, 32:].any() and not video[:, :, 80:].any()  # padded, not upscaled
    loader = torch.utils.data.DataLoader(windows, batch_size=2, num_workers=1, collate_fn=_keep, sampler=[6, 0])
    got = next(iter(loader))[0]
    assert all(torch.equal(a, b) for a, b in zip(got.video, w.video))
