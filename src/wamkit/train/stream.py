"""The order in which training windows are seen, derived from one number: how many samples have
been consumed. Epoch e is a seeded permutation of all windows, so resuming at `consumed` replays
nothing and skips nothing, whatever the worker count."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class SampleOrder:
    def __init__(self, num_windows: int, seed: int):
        self.num_windows, self.seed = num_windows, seed
        self._cache: dict[int, list[int]] = {}

    def epoch(self, e: int) -> list[int]:
        if e not in self._cache:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + e)
            self._cache = {e: torch.randperm(self.num_windows, generator=gen).tolist()}
        return self._cache[e]

    def index(self, position: int) -> int:
        e, offset = divmod(position, self.num_windows)
        return self.epoch(e)[offset]


class _RankSlice(Sampler[int]):
    """This rank's share of the stream from `start`: of every `batch * world` consecutive positions,
    rank r reads the r-th block of `batch`. With world 1 it is the stream itself."""

    def __init__(self, order: SampleOrder, start: int, batch: int, rank: int, world: int):
        self.order, self.start, self.batch, self.rank, self.world = order, start, batch, rank, world

    def __iter__(self):
        block = self.start + self.rank * self.batch
        while True:
            for j in range(self.batch):
                yield self.order.index(block + j)
            block += self.batch * self.world


def batch_stream(samples: Dataset, order: SampleOrder, start: int, batch_size: int, num_workers: int, rank: int = 0, world: int = 1):
    """Infinite iterator of lists of TrainingSamples for this rank, from global position `start`."""
    loader = DataLoader(
        samples, batch_size=batch_size, sampler=_RankSlice(order, start, batch_size, rank, world),
        num_workers=num_workers, collate_fn=list, persistent_workers=num_workers > 0,
        prefetch_factor=2 if num_workers > 0 else None,
    )
    return iter(loader)
