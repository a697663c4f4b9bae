"""The action queue of asynchronous chunked execution (Black et al. 2025, Algorithm 1).

A chunk's actions run one per control tick. After `execution_horizon` of them the next chunk is
requested from the current observation while the rest keep running; when it arrives, `elapsed` ticks
later, it takes over at index `elapsed` (its index 0 belongs to the tick its observation was taken).
The same queue drives the robot client (real latency) and `wamkit eval sim --inference-delay`
(simulated latency), so what is measured in simulation is what a robot runs."""

from __future__ import annotations

import numpy as np


class ChunkBuffer:
    def __init__(self, chunk_length: int, execution_horizon: int):
        if not 1 <= execution_horizon <= chunk_length:
            raise ValueError(f"execution_horizon {execution_horizon} is outside [1, {chunk_length}] (the chunk length)")
        self.chunk_length, self.execution_horizon = int(chunk_length), int(execution_horizon)
        self.chunk: np.ndarray | None = None
        self.index = 0
        self._seam = False

    @property
    def remaining(self) -> int:
        return 0 if self.chunk is None else len(self.chunk) - self.index

    def due(self, lead: int = 0) -> bool:
        """Time to request the next chunk: no chunk yet, `execution_horizon` actions executed, or
        fewer than `lead` (the expected latency in ticks) left, whichever comes first."""
        return self.chunk is None or self.index >= min(self.execution_horizon, len(self.chunk) - lead)

    def committed(self) -> np.ndarray:
        """The actions not yet executed, which the robot will run while the next chunk is computed."""
        if self.chunk is None:
            raise ValueError("no chunk yet: nothing is committed before the first chunk arrives")
        return np.array(self.chunk[self.index:])

    def switch(self, chunk: np.ndarray, elapsed: int) -> None:
        """Take over from a chunk whose observation was taken `elapsed` ticks ago."""
        if not 0 <= elapsed < len(chunk):
            raise ValueError(f"the chunk arrived {elapsed} ticks after its observation; it only covers {len(chunk)}")
        self._seam = self.chunk is not None
        self.chunk, self.index = np.asarray(chunk), int(elapsed)

    def pop(self) -> tuple[np.ndarray, bool] | None:
        """(this tick's action, whether it is the first of a new chunk after another), or None when
        the buffer has run dry (the next chunk is late)."""
        if self.remaining == 0:
            return None
        action, seam = self.chunk[self.index], self._seam
        self.index += 1
        self._seam = False
        return action, seam
