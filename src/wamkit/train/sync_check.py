"""Where a training step makes the host wait for the GPU: a diagnostic (WAMKIT_SYNC_DEBUG=1).

A step that synchronises stops the host from queueing work ahead of the GPU, so small kernels run
one after the other with the host's overhead between them; at small widths that, not arithmetic,
sets the step time. torch reports every synchronising CUDA call when its sync debug mode is on;
this counts them over one step and names the Python lines they came from."""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter

import torch

ENV = "WAMKIT_SYNC_DEBUG"


@contextlib.contextmanager
def counting_syncs(device: torch.device):
    """Yields a Counter that, after the block, holds `file:line` -> synchronising calls made there
    (empty off CUDA)."""
    found: Counter = Counter()
    if device.type != "cuda":
        yield found
        return
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    found.update(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))


def sync_line(step: int, found: Counter) -> str:
    where = ", ".join(f"{place} x{n}" for place, n in found.most_common(6))
    return f"step {step} synchronised host and GPU {sum(found.values())} times" + (f": {where}" if where else "")
