"""The rates logged every step, as torchtitan logs them: samples/s and tokens/s per GPU, MFU against
the device's measured bf16 matmul rate, peak memory, and the graphs dynamo has compiled so far (a
count that keeps rising after warm-up means recompiles)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from wamkit.model.flops import matmul_rate


class Throughput:
    def __init__(self, device: torch.device, world_size: int):
        self.device = device
        self.world_size = world_size

    def measure(self, record: dict, seconds: float, samples: int, steps: int = 1) -> dict:
        """Rates of `steps` steps of `seconds` in all that trained `samples` per rank; takes their
        "flops" and "tokens" (useful work on this rank) and "encode_flops" (the online video encode)
        out of `record`. "step_s" is the mean step; "mfu" counts the transformer's work only,
        "mfu_with_encode" adds the encode's."""
        flops, tokens, encode = record.pop("flops", 0.0), record.pop("tokens", 0), record.pop("encode_flops", 0.0)
        out = {"step_s": seconds / steps, "samples_per_s": samples / seconds, "tokens_per_s": tokens / seconds,
               "compiled_graphs": compiled_graphs()}
        if self.device.type == "cuda":
            out["mfu"] = flops / seconds / matmul_rate(self.device)
            out["tflops_per_s"] = flops / seconds / 1e12
            if encode:
                out["mfu_with_encode"] = (flops + encode) / seconds / matmul_rate(self.device)
            out["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            out["peak_reserved_gib"] = torch.cuda.max_memory_reserved(self.device) / 2**30
        return out


class StepInterval:
    """The steps since the last one that waited for the GPU (a logged step). Between them the host
    queues work ahead of the GPU, so one step's wall time says nothing; the interval's does, and its
    rates are the mean over its steps (every step, with trainer.log_every = 1). `steps` back at 0
    ends it: the next step restarts the clock."""

    def __init__(self):
        self.restart()

    def restart(self) -> None:
        self.start, self.steps, self.flops, self.tokens, self.encode_flops = time.perf_counter(), 0, 0.0, 0, 0.0

    def add(self, record: dict) -> None:
        """Count a step's useful work (taken out of its record)."""
        self.steps += 1
        self.flops += record.pop("flops", 0.0)
        self.tokens += record.pop("tokens", 0)
        self.encode_flops += record.pop("encode_flops", 0.0)

    def work(self) -> dict:
        return {"flops": self.flops, "tokens": self.tokens, "encode_flops": self.encode_flops}

    def seconds(self) -> float:
        return time.perf_counter() - self.start


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (recompiles included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def seconds_since_launch() -> float:
    """Age of this process (Linux), so "first step after launch" includes imports and setup."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start
    except (OSError, ValueError, IndexError):
        return float("nan")


class StartupTimeline:
    """Seconds since launch at each setup milestone: what the wait for a first step is made of (a
    cold machine's launch -> first step is a number we own, issue 24)."""

    def __init__(self, first: str = "imports and process setup"):
        self.marks: list[tuple[str, float]] = [("launch", 0.0)]
        self.mark(first)

    def mark(self, name: str) -> None:
        self.marks.append((name, seconds_since_launch()))

    def line(self) -> str:
        spans = [f"{name} {end - start:.1f} s" for (_, start), (name, end) in zip(self.marks, self.marks[1:])]
        return "startup: " + ", ".join(spans)
