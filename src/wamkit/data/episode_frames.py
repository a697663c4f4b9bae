"""Whole episodes' decoded frames, kept in the process that decoded them (each DataLoader worker).

A training window of T+1 frames at a random start costs a seek to the keyframe before it and the
decoding of every frame from there: ~2.4 frames decoded per frame used on the Meta-World recordings,
85% of a 64 px window's CPU time. Where a dataset's whole decoded video fits the budget
(`data.frame_cache_mb` per loader process), every episode is decoded once, in full, on first use, and
each later window is a slice. Where it does not fit, nothing is cached: whole-episode decoding for a
window that is then evicted would cost more than the seek it saves."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class DecodedEpisodes:
    """Frames [n, H, W, 3] uint8 by (episode, camera), decoded on first use. No eviction: it is only
    switched on for datasets whose decoded video fits the budget whole."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = int(budget_bytes)
        self._frames: dict[tuple[int, str], np.ndarray] = {}

    def frames(self, ep: int, camera_key: str, decode_episode: Callable[[], np.ndarray]) -> np.ndarray:
        key = (ep, camera_key)
        found = self._frames.get(key)
        if found is None:
            found = self._frames[key] = decode_episode()
        return found

    def empty_copy(self) -> "DecodedEpisodes":
        """The same budget and nothing decoded: what a DataLoader worker starts from."""
        return DecodedEpisodes(self.budget_bytes)

    @property
    def held_bytes(self) -> int:
        return sum(f.nbytes for f in self._frames.values())


def fits(decoded_bytes: int, budget_mb: float) -> bool:
    return budget_mb > 0 and decoded_bytes <= budget_mb * 2**20


def cache_off_note(decoded_bytes: int, budget_mb: float, workers: int) -> str | None:
    """Why training decodes window by window although it could decode each episode once: a dataset whose
    decoded video outgrows the default budget (128 px MT10: 2 GB) silently ran 4-5x slower a step on an H200
    host than the same tokens from 64 px frames (RESULTS.md, seventeenth session). None when the cache is on
    or switched off on purpose (budget 0)."""
    if budget_mb <= 0 or fits(decoded_bytes, budget_mb):
        return None
    need_mb = -(-decoded_bytes // 2**20)
    processes = max(workers, 1)
    return (f"[wamkit] frame cache off: the decoded video is {need_mb:,} MiB, over data.frame_cache_mb "
            f"{budget_mb:g} (per loader process), so every window seeks and decodes anew; "
            f"--set data.frame_cache_mb={need_mb + 1} decodes each episode once, holding {need_mb * processes:,} MiB "
            f"of host memory over {processes} loader process{'es' if processes > 1 else ''}")
