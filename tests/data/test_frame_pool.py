"""Reused shared-memory frame buffers (wamkit.data.frame_pool): a worker rewrites a buffer only once no
tensor in the worker or in the training process can still read it; every other way out is a copy."""

from __future__ import annotations

import copy
import gc
import math
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from wamkit.data import Normalizer, SampleTransform, Window, WindowDataset, frame_pool
from wamkit.data.frame_pool import frame_buffer
from wamkit.data.synth import CAMERA_KEY

SHAPE = (3, 4, 5, 3)


@pytest.fixture
def pool(monkeypatch):
    """This process acting as a DataLoader worker, with an empty pool."""
    monkeypatch.setattr(frame_pool, "get_worker_info", lambda: object())
    monkeypatch.setattr(frame_pool, "_pool", frame_pool._Pool(frame_pool.MAX_POOL_BYTES))
    return frame_pool._pool


def _window(video: torch.Tensor) -> Window:
    return Window(video, None, torch.zeros(2, 1), "task", 0, 0)


def _send(obj):
    """What a DataLoader worker's result queue does: ForkingPickler in the worker, unpickle in the trainer."""
    return pickle.loads(ForkingPickler.dumps(obj))


def test_a_lent_slot_is_reused_only_after_the_consumer_drops_its_last_view(pool):
    got = _send(_window(frame_buffer(SHAPE).fill_(1)))
    view = got.video[1:, :, 2:]  # a view outlives the received tensor
    del got
    frame_buffer(SHAPE).fill_(2)
    assert len(pool.slots) == 2 and bool((view == 1).all())  # a second slot, not the lent one
    del view
    gc.collect()
    frame_buffer(SHAPE).fill_(3)
    assert len(pool.slots) == 2  # the given-back slot is reused


def test_a_slot_the_worker_still_reads_is_not_reused(pool):
    view = frame_buffer(SHAPE).fill_(1)[0]
    frame_buffer(SHAPE).fill_(2)
    assert len(pool.slots) == 2 and bool((view == 1).all())
    del view
    frame_buffer(SHAPE)
    assert len(pool.slots) == 2


def test_every_other_way_out_is_a_copy(pool):
    """Ordinary pickling, a second send while the first is held, and torch's own reducer on a bare tensor."""
    window = _window(frame_buffer(SHAPE).fill_(5))
    assert copy.copy(window).video is window.video
    on_disk = pickle.loads(pickle.dumps(window))
    first, second = _send(window), _send(window)
    bare = _send(frame_buffer(SHAPE).fill_(7))
    del window, first
    gc.collect()
    frame_buffer(SHAPE).fill_(6)
    frame_buffer(SHAPE).fill_(8)
    assert len(pool.slots) == 2  # both reused: only `first` was a slot itself, and it was given back
    assert bool((on_disk.video == 5).all()) and bool((second.video == 5).all()) and bool((bare == 7).all())


def test_small_tensors_travel_by_value(pool):
    sample = _send(_window(frame_buffer(SHAPE)))
    assert not sample.action.is_shared() and sample.action.shape == (2, 1)


def test_the_pool_is_capped(pool):
    pool.max_bytes = 2 * math.prod(SHAPE)
    held = [frame_buffer(SHAPE) for _ in range(3)]
    assert len(pool.slots) == 2 and frame_pool.lend(held[2]) is held[2]  # past the cap: a fresh, unpooled buffer


class _Samples(torch.utils.data.Dataset):
    """(index, TrainingSample, the worker's pool size) -- the training stream's path."""

    def __init__(self, windows, transform):
        self.windows, self.transform = windows, transform

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        sample = self.transform(self.windows[i])
        return i, sample, len(frame_pool._pool.slots)


def test_dataloader_consumer_keeps_correct_frames_while_workers_reuse_buffers(demo_ds):
    """The trainer holds some samples for a while and some for good; workers keep producing. A buffer
    rewritten while the trainer still holds it would show up as a held sample's frames changing."""
    windows = WindowDataset(demo_ds, demo_ds.episode_indices, chunk_length=4, camera_keys=[CAMERA_KEY] * 2)
    transform = SampleTransform(Normalizer.from_stats(demo_ds.stats, "action", "minmax"), None, 4, False, 0)
    order = [(7 * k) % len(windows) for k in range(96)]
    expected = {i: transform(windows[i]).video.clone() for i in set(order)}
    loader = torch.utils.data.DataLoader(_Samples(windows, transform), batch_size=2, num_workers=2,
                                         collate_fn=list, sampler=order, prefetch_factor=2)
    recent, kept, pool_sizes = [], [], []
    for batch in loader:
        for i, sample, pool_size in batch:
            assert torch.equal(sample.video, expected[i])
            pool_sizes.append(pool_size)
            (kept if len(pool_sizes) % 16 == 0 else recent).append((i, sample.video[:, :, 64:]))
        while len(recent) > 6:
            i, video = recent.pop(0)
            assert torch.equal(video, expected[i][:, :, 64:]), f"window {i} changed while held"
    for i, video in kept + recent:
        assert torch.equal(video, expected[i][:, :, 64:]), f"window {i} changed while held"
    assert max(pool_sizes) < len(order) // 4  # buffers were reused (48 windows per worker)


def test_a_slot_is_attached_once_and_later_windows_over_it_travel_by_name(pool, monkeypatch):
    """The training process attaches a slot's shared memory the first time it arrives and keeps it:
    fetching a file descriptor per window (torch's default) cost 1.2-1.7 ms a window."""
    attaches, real = [], frame_pool.rebuild_storage_filename
    monkeypatch.setattr(frame_pool, "rebuild_storage_filename", lambda *a: attaches.append(a) or real(*a))
    monkeypatch.setattr(frame_pool, "_attached", frame_pool._Attached(frame_pool.MAX_POOL_BYTES))
    for value in (3, 4, 5):
        got = _send(_window(frame_buffer(SHAPE).fill_(value)))
        assert bool((got.video == value).all())
        del got
        gc.collect()
    assert len(pool.slots) == 1 and len(attaches) == 1


def test_receiving_a_window_over_an_attached_slot_costs_one_tensor_op(pool, monkeypatch):
    """The training process receives a batch's windows one by one; over an attached slot each is cut from
    numpy views made at attach time (a tensor's .numpy() is four host ops, ~13 a window before), so a
    batch of 256 adds ~256 ops to a step, not ~3,300."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setattr(frame_pool, "_attached", frame_pool._Attached(frame_pool.MAX_POOL_BYTES))
    got = _send(_window(frame_buffer(SHAPE).fill_(1)))  # attaches the slot
    del got
    gc.collect()
    payload = ForkingPickler.dumps(_window(frame_buffer(SHAPE).fill_(2)))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = pickle.loads(payload)
    assert bool((got.video == 2).all())
    ops = [e.name for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    by_value = ops.count("aten::lift_fresh")  # the window's small tensors (torch.from_numpy)
    assert ops.count("aten::as_strided") == 1 and len(ops) == 1 + by_value, ops


def test_a_transforms_new_frames_travel_in_a_slot(pool, monkeypatch):
    """Frames kept by a future-video stride are a new tensor: copied into a slot of the pool, they are lent
    by name like a decoded window instead of torch's fresh shared-memory file per sample (a socket
    handshake each in the training process: 0.3 s of every MT10 step's data wait)."""
    attaches, real = [], frame_pool.rebuild_storage_filename
    monkeypatch.setattr(frame_pool, "rebuild_storage_filename", lambda *a: attaches.append(a) or real(*a))
    monkeypatch.setattr(frame_pool, "_attached", frame_pool._Attached(frame_pool.MAX_POOL_BYTES))
    norm = Normalizer("action", "none", {})
    transform = SampleTransform(norm, None, 2, False, 0, frame_indices=[0, 2])
    for value in (1, 2, 3):
        video = frame_buffer((1, *SHAPE)).copy_(torch.arange(math.prod(SHAPE)).view(1, *SHAPE) % 100 + value)
        window = Window(video, None, torch.zeros(2, 2), "task", 0, 0)
        sample = transform(window)
        assert pool.slot_of(sample.video) is not None  # the kept frames sit in a slot
        got = _send(sample)
        assert torch.equal(got.video, video[0, [0, 2]])
        del got, sample, window, video
        gc.collect()
    assert len(attaches) <= 2  # each slot attached once: the window's and the kept frames'
    outside = frame_pool.pooled(torch.zeros(2, 3, dtype=torch.uint8))
    monkeypatch.setattr(frame_pool, "get_worker_info", lambda: None)
    plain = torch.zeros(2, 3, dtype=torch.uint8)
    assert frame_pool.pooled(plain) is plain and pool.slot_of(outside) is not None
