"""Whole-episode frame cache (data.frame_cache_mb): the same frames as seeking window by window,
each episode decoded once per process, off when the dataset's decoded video does not fit, and empty
again in each DataLoader worker's copy."""

from __future__ import annotations

import pickle

import numpy as np

import wamkit.data.lerobot_v3 as lerobot_v3
from wamkit.data import LeRobotV3Dataset, WindowDataset


def _decode_calls(monkeypatch) -> list:
    calls, real = [], lerobot_v3.decode_at_times

    def counting(path, times, fps, out=None):
        calls.append(len(times))
        return real(path, times, fps, out)

    monkeypatch.setattr(lerobot_v3, "decode_at_times", counting)
    return calls


def test_cached_windows_equal_seeked_windows_and_decode_each_episode_once(demo_root, monkeypatch):
    plain, cached = LeRobotV3Dataset(demo_root), LeRobotV3Dataset(demo_root)
    assert cached.enable_frame_cache(64)  # 8 short 64 px episodes: well under 64 MiB
    calls = _decode_calls(monkeypatch)
    windows = WindowDataset(cached, [1, 4], chunk_length=8)
    reference = WindowDataset(plain, [1, 4], chunk_length=8)
    order = np.random.default_rng(0).permutation(len(windows))[:12]
    for i in order:
        np.testing.assert_array_equal(windows[int(i)].video.numpy(), reference[int(i)].video.numpy())
    whole = [n for n in calls if n == cached.episode_length(1) or n == cached.episode_length(4)]
    assert len(whole) == 2  # one whole-episode decode per episode, then slices
    out = np.zeros((3, 64, 64, 3), dtype=np.uint8)
    got = cached.decode_frames(4, cached.camera_keys[0], [5, 0, 7], out=out)
    assert got is out and np.array_equal(out, plain.decode_frames(4, plain.camera_keys[0], [5, 0, 7]))


def test_cache_stays_off_when_the_decoded_video_does_not_fit(demo_root, monkeypatch):
    ds = LeRobotV3Dataset(demo_root)
    need_mb = ds.decoded_video_bytes() / 2**20
    assert not ds.enable_frame_cache(need_mb * 0.9) and not ds.enable_frame_cache(0)
    calls = _decode_calls(monkeypatch)
    ds.decode_frames(2, ds.camera_keys[0], [3, 4])
    assert calls == [2]  # only the frames asked for
    assert ds.enable_frame_cache(need_mb * 1.01)


def test_a_worker_copy_starts_with_an_empty_cache(demo_root):
    ds = LeRobotV3Dataset(demo_root)
    ds.enable_frame_cache(64)
    ds.decode_frames(0, ds.camera_keys[0], [0])
    assert ds._decoded.held_bytes > 0
    worker = pickle.loads(pickle.dumps(ds))
    assert worker._decoded is not None and worker._decoded.held_bytes == 0


def test_training_says_when_the_cache_stays_off_and_what_fixes_it(demo_root):
    from wamkit.data.episode_frames import cache_off_note

    need = LeRobotV3Dataset(demo_root).decoded_video_bytes()
    need_mb = -(-need // 2**20)
    note = cache_off_note(need, need_mb * 0.5, workers=6)
    assert note is not None and f"data.frame_cache_mb={need_mb + 1}" in note and f"{need_mb * 6:,} MiB" in note
    assert "6 loader processes" in note
    assert cache_off_note(need, need_mb + 1, workers=6) is None  # it fits: the cache is on
    assert cache_off_note(need, 0, workers=6) is None  # switched off on purpose
