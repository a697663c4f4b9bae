"""Episode-shuffle order (`data.shuffle = "episodes"`): the same interface as
wamkit.train.stream.SampleOrder (`index(position) -> window index`), position = global sample count.

Epoch e = position // num_windows permutes the episodes with a generator seeded by (seed, e); inside
an episode its windows are read in order (start ascending). The order is a pure function of the
position, so resuming at `consumed` is exact.
"""

from __future__ import annotations

import numpy as np
import torch

from wamkit.errors import DataError


class EpisodeShuffleOrder:
    def __init__(self, window_episodes, seed: int):
        """`window_episodes[i]` is the episode of window i; windows of one episode must be contiguous and
        in reading order (WindowDataset.index is)."""
        eps = np.asarray(window_episodes, dtype=np.int64).reshape(-1)
        if eps.size == 0:
            raise DataError("EpisodeShuffleOrder", "no windows", "build the order from a non-empty WindowDataset")
        change = np.flatnonzero(np.diff(eps)) + 1
        self._starts = np.concatenate([[0], change]).astype(np.int64)
        self._ends = np.concatenate([change, [eps.size]]).astype(np.int64)
        if len(set(eps[self._starts].tolist())) != len(self._starts):
            raise DataError("EpisodeShuffleOrder", "an episode's windows are not contiguous in the index",
                            "group windows by episode (WindowDataset does)")
        self.num_windows, self.seed = int(eps.size), int(seed)
        self._cache: dict[int, np.ndarray] = {}

    @classmethod
    def from_windows(cls, windows, seed: int) -> "EpisodeShuffleOrder":
        """From a WindowDataset (its `index` rows are (episode, start))."""
        return cls(np.asarray(windows.index)[:, 0], seed)

    def epoch(self, e: int) -> np.ndarray:
        if e not in self._cache:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + e)
            perm = torch.randperm(len(self._starts), generator=gen).numpy()
            self._cache = {e: np.concatenate([np.arange(self._starts[k], self._ends[k]) for k in perm])}
        return self._cache[e]

    def index(self, position: int) -> int:
        e, offset = divmod(int(position), self.num_windows)
        return int(self.epoch(e)[offset])
