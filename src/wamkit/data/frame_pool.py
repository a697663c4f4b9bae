"""How decoded windows leave a DataLoader worker: the frames in shared-memory buffers that the worker
reuses across windows, lent to the training process without a copy and rewritten only once nobody can
still read them; the small tensors (actions, state, masks) by value inside the pickle.

Why: a fresh shared-memory buffer per window costs its creation and a zero-filled page fault per 4 KB
page at the first write (8.8 ms for the 16.6 MB of a 480p window, a third of the window's CPU on the
2-core dev VM), while rewriting a buffer that is already mapped costs almost nothing. And every tensor
that torch pickles for a queue travels as its own shared-memory file whose descriptor the training
process fetches from the worker over a socket with an authentication handshake (4 per sample before):
for a few KB of actions, copying the bytes through the queue's pipe is far cheaper. The slots
themselves are shared memory with a name (torch's file_system sharing): a lent slot travels as its
name, and the training process attaches each slot once and keeps it attached (`_Attached`), where a
descriptor per window cost 1.2-1.7 ms (0.12 s of a 256-window MT10 batch on an H200 host).

A frame buffer (a *slot*) may be rewritten only when no tensor anywhere can still read it:

* In the worker, tensors over a slot are built with `torch.frombuffer` on a *holder* (a numpy view of
  the slot): torch keeps the holder alive while any tensor or view over that memory exists, so a dead
  holder (a weak reference) proves that no worker-side tensor is left.
* A slot reaches the training process only through `lend` (when a multiprocessing queue pickles a
  Window or TrainingSample, see `ship_from_workers`), which sets the slot's *lent mark*, a byte in
  shared memory after the frames. The training process rebuilds the tensors on a holder of its own,
  whose finalizer clears the mark once the last tensor or view over it is gone.

A slot is reused only when its holder is dead and then its mark is clear (in that order: from the
moment `lend` sets the mark until pickling is over the holder is kept alive, so a dead holder means
that any lending has been marked). Every other way out is a copy: torch's own reducer, which pickles
a tensor over a slot that is still lent or that travels outside a Window/TrainingSample, first moves
the tensor's storage into fresh shared memory (`frombuffer` memory cannot be shared in place), and
ordinary pickling serializes the bytes.
"""

from __future__ import annotations

import math
import os
import weakref
from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import torch
from multiprocessing.reduction import ForkingPickler
from torch.multiprocessing.reductions import rebuild_storage_filename
from torch.utils.data import get_worker_info

MAX_BY_VALUE_BYTES = 1 << 20  # tensors up to this size are pickled by value, larger ones through shared memory
MAX_POOL_BYTES = 1 << 30  # per worker; the pool grows to the most windows in flight at once, up to this
_NUMPY_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.float32, torch.float64}
_TRAILER = 64  # bytes after the frames; the first is the lent mark (1: the training process may read the slot)


class _Slot:
    """One reusable shared-memory buffer of `nbytes` frame bytes plus the trailer."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.flat = _named_shared_bytes(nbytes + _TRAILER)
        self.mark = self.flat[nbytes:nbytes + 1].numpy()  # a view of the lent mark in shared memory
        self.holder: weakref.ref | None = None

    def free(self) -> bool:
        """True when no tensor in this worker nor in the training process can read the slot. The holder
        is checked first: it dies only after any `lend` of it has set the mark."""
        if self.holder is not None and self.holder() is not None:
            return False
        return not self.mark[0]

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A uint8 tensor of `shape` over the slot, built on a fresh holder."""
        holder = self.flat[:self.nbytes].numpy()
        self.holder = weakref.ref(holder)
        return torch.frombuffer(holder, dtype=torch.uint8).view(shape)


class _Pool:
    """This worker's slots. Grows while every slot of the needed size is in use, up to `max_bytes`;
    past that, a window gets a fresh shared-memory buffer that is never reused."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.slots = max_bytes, []

    def buffer(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A uint8 tensor of `shape`: a free slot of that size, a new one, or past the cap a fresh buffer."""
        nbytes = math.prod(shape)
        slot = next((s for s in self.slots if s.nbytes == nbytes and s.free()), None) or self._grow(nbytes)
        if slot is None:
            return _shared_bytes(nbytes).view(shape)
        return slot.take(shape)

    def _grow(self, nbytes: int) -> _Slot | None:
        """A new slot, after dropping free slots of other sizes if the pool would exceed its cap."""
        if self._bytes() + nbytes > self.max_bytes:
            self.slots = [s for s in self.slots if s.nbytes == nbytes or not s.free()]
        if self._bytes() + nbytes > self.max_bytes:
            return None
        self.slots.append(_Slot(nbytes))
        return self.slots[-1]

    def _bytes(self) -> int:
        return sum(s.nbytes for s in self.slots)

    def slot_of(self, tensor: torch.Tensor) -> _Slot | None:
        """The slot whose memory `tensor` views, if any."""
        ptr = tensor.untyped_storage().data_ptr()
        return next((s for s in self.slots if s.flat.data_ptr() == ptr), None)


_pool = _Pool(MAX_POOL_BYTES)


def _forget_pool() -> None:
    """A forked child must not rewrite its parent's slots: it starts with an empty pool."""
    global _pool
    _pool = _Pool(_pool.max_bytes)


os.register_at_fork(after_in_child=_forget_pool)


def _shared_bytes(nbytes: int) -> torch.Tensor:
    """A fresh flat uint8 tensor in shared memory."""
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))


def _named_shared_bytes(nbytes: int) -> torch.Tensor:
    """A fresh flat uint8 tensor in shared memory that has a name (torch's file_system sharing), so a
    lent slot travels as its name and the training process attaches it once: torch's default sends a
    file descriptor, which the receiver fetches over a socket with a handshake, 1.2-1.7 ms per window
    (0.12 s of every 256-window batch of an MT10 step on an H200 host, 2026-12-03)."""
    storage = torch.zeros(nbytes, dtype=torch.uint8).untyped_storage()  # zeros: the lent mark starts clear
    storage._share_filename_cpu_()  # moves it into named shared memory (the first call starts torch's shm manager)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def frame_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    """Empty uint8 tensor of `shape` for decoded frames: in a DataLoader worker a reused slot of
    shared memory (see the module docstring), elsewhere ordinary memory."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    return _pool.buffer(tuple(shape))


def pooled(video):
    """`video` over a slot of this worker's pool, so that it is lent by name (`lend`). A transform's new
    tensor (the frames a future-video stride keeps, a composed canvas) is copied into a slot here: torch's
    reducer would otherwise move it into a fresh shared-memory file per sample whose descriptor the
    training process fetches over a socket (0.26-0.33 s of data wait in every 256-sample MT10 step with
    `diffusion.future_video_stride`, one H100, 2026-12-05). Outside a worker, for a tensor already over a
    slot, or for anything but one uint8 tensor, `video` itself."""
    if not isinstance(video, torch.Tensor) or video.dtype != torch.uint8 or get_worker_info() is None:
        return video
    if _pool.slot_of(video) is not None:
        return video
    return frame_buffer(tuple(video.shape)).copy_(video)


def ship_from_workers(cls):
    """Class decorator (Window, TrainingSample): pickled for a multiprocessing queue, as a DataLoader
    worker's results are, an instance sends its frames (`video`) lent from the worker's pool and its
    other small tensors by value. Ordinary pickling and copying are left as they are."""
    ForkingPickler.register(cls, _reduce_for_queue)
    return cls


def _reduce_for_queue(obj):
    return _rebuild, (type(obj), {key: lend(value) if key == "video" else _by_value(value)
                                  for key, value in obj.__dict__.items()})


def _rebuild(cls, state: dict):
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def lend(video):
    """`video` (a tensor, a list of tensors or None) for a multiprocessing queue: a tensor over a slot of
    this worker's pool becomes a `_Lent` (the slot itself is sent and marked lent) unless the slot is
    still lent, then it stays a tensor that torch's reducer copies into fresh shared memory."""
    if isinstance(video, list):
        return [lend(v) for v in video]
    slot = _pool.slot_of(video) if isinstance(video, torch.Tensor) else None
    if slot is None:
        return video
    holder = slot.holder and slot.holder()
    if holder is None:  # cannot happen (a tensor over a slot keeps its holder alive): a copy is the safe answer
        return video.clone()
    if slot.mark[0]:  # still lent: torch's reducer sends a copy in fresh shared memory
        return video
    slot.mark[0] = 1
    return _Lent(video, slot, holder)


class _Lent:
    """A tensor over a slot being pickled. It keeps the slot's holder alive until pickling is over, so
    the slot is not reused meanwhile even if torch moves the tensor's storage elsewhere (pickling
    another view of it); the mark, set by `lend`, then keeps it until the training process is done."""

    def __init__(self, tensor: torch.Tensor, slot: _Slot, holder: np.ndarray):
        self.tensor, self.slot, self.holder = tensor, slot, holder

    def __reduce__(self):
        t = self.tensor
        storage = self.slot.flat.untyped_storage()
        name = storage._share_filename_cpu_()  # (manager, handle, size); its receipt drops the reference taken here
        storage._shared_incref()
        return _receive, (name, self.slot.nbytes, t.storage_offset(), tuple(t.shape), t.stride())


class _ByValue:
    """A small tensor pickled as its bytes (a numpy array), not through a shared-memory file."""

    def __init__(self, tensor: torch.Tensor):
        self.array = tensor.numpy()

    def __reduce__(self):
        return torch.from_numpy, (self.array,)


def _by_value(value):
    """`value` wrapped to pickle by value when it is a small dense CPU tensor numpy can hold."""
    if (isinstance(value, torch.Tensor) and value.layout == torch.strided and value.device.type == "cpu"
            and not value.requires_grad and value.dtype in _NUMPY_DTYPES and value.nbytes <= MAX_BY_VALUE_BYTES):
        return _ByValue(value)
    return value


def _receive(name: tuple, nbytes: int, offset: int, shape: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    """In the training process: the lent tensor, on a holder whose death clears the slot's lent mark. The
    slot's memory is attached by name the first time it arrives and stays attached (`_Attached`)."""
    slot = _attached.get(name)
    if slot is None:
        slot = _attached.put(name, rebuild_storage_filename(torch.UntypedStorage, *name))
    else:
        slot.storage._shared_decref()  # the reference the worker took for this sending
    # numpy views of the slot's bytes, cut from the array made once at attach time: a tensor's .numpy() is four
    # host ops, a tensor slice one more, ~13 a sample that a batch of 256 paid in the training process each step
    holder = slot.array[:nbytes]
    weakref.finalize(holder, _give_back, slot.array[nbytes:nbytes + 1])
    return torch.frombuffer(holder, dtype=torch.uint8).as_strided(shape, stride, offset)


class _AttachedSlot(NamedTuple):
    storage: torch.UntypedStorage
    array: np.ndarray  # uint8 over all of the storage's bytes


class _Attached:
    """Slots attached in the training process, kept attached (most recently used first, up to
    `max_bytes`): attaching by name costs ~0.2 ms, and a slot comes back every few batches. A slot of
    a live worker is memory the worker holds anyway; only those of exited workers (a finished
    validation pass) cost, until they age out."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self._storages = max_bytes, OrderedDict()

    def get(self, name: tuple) -> _AttachedSlot | None:
        slot = self._storages.get(name)
        if slot is not None:
            self._storages.move_to_end(name)
        return slot

    def put(self, name: tuple, storage: torch.UntypedStorage) -> _AttachedSlot:
        slot = _AttachedSlot(storage, torch.empty(0, dtype=torch.uint8).set_(storage).numpy())
        self._storages[name] = slot
        while sum(s.storage.nbytes() for s in self._storages.values()) > self.max_bytes and len(self._storages) > 1:
            self._storages.popitem(last=False)
        return slot


_attached = _Attached(2 * MAX_POOL_BYTES)


def _give_back(mark: np.ndarray) -> None:
    """Runs when the last tensor over a lent slot is gone: the worker may rewrite it."""
    mark[0] = 0
