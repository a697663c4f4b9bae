"""Where a training step's time goes: data wait, video encode, forward+backward, optimizer, EMA.

On a GPU the phases are bracketed with CUDA events, which cost no synchronisation; they are read
once per step, after the step's own synchronisation (the loss read-back). Time the GPU sits idle
waiting for the host (a slow loader, host-side packing) falls into the phase the host was in, so the
phases add up to the step's wall time. On the CPU a host clock does the same job."""

from __future__ import annotations

import time
from collections import defaultdict

import torch

PHASES = ("data", "encode", "forward_backward", "optimizer", "ema", "other")


class StepTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, object]] = []

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        self._marks = [("", self._now())]

    def mark(self, phase: str) -> None:
        """The step has just finished `phase` (a phase may recur, e.g. per micro-batch)."""
        if self._marks:
            self._marks.append((phase, self._now()))

    def read(self) -> dict[str, float]:
        """Seconds per phase since `start` (phases never marked read 0). Synchronises on a GPU."""
        if self.cuda and self._marks:
            self._marks[-1][1].synchronize()
        seconds: dict[str, float] = defaultdict(float)
        for (_, before), (phase, after) in zip(self._marks, self._marks[1:]):
            seconds[phase] += before.elapsed_time(after) / 1e3 if self.cuda else after - before
        return {phase: seconds.get(phase, 0.0) for phase in PHASES}
