"""Warm a policy server up before it reports ready.

The first forward at each batch size compiles kernels and captures CUDA graphs (seconds each on a
GPU); without a warm-up the first clients of every batch size pay for it, and a load balancer that
trusts `/healthz` sends them there. The warm-up runs, for every batch size from 1 to `--max-batch`,
one plain batch and one with real-time chunking's fields (its guided sampling differentiates through
the model: other graphs; measured on an H200, its first request took 15.6 s unwarmed), through the
server's own inference path, with camera images of the training sizes (the data contract's
`camera_sizes`, or `--warmup-size HxW`), and `/healthz` answers 503 until it is done."""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from wamkit.errors import WamkitError

log = logging.getLogger("wamkit.serve")


def camera_sizes(policy, override: tuple[int, int] | None) -> list[tuple[int, int]] | None:
    """(H, W) per camera: `override` for every camera, else the training data's sizes from the data
    contract (runs trained before it recorded them have none: None)."""
    cameras = max(1, len(policy.camera_keys))
    if override is not None:
        return [tuple(override)] * cameras
    sizes = policy.contract.get("camera_sizes")
    return [tuple(s) for s in sizes] if sizes and len(sizes) == cameras else None


def warmup_observation(policy, sizes: list[tuple[int, int]]) -> dict:
    """One valid observation: mid-grey frames of the training sizes, the state at its middle, a prompt."""
    images = [np.full((h, w, 3), 128, dtype=np.uint8) for h, w in sizes]
    obs = {"image": images[0] if len(images) == 1 else images, "prompt": "warm up"}
    if policy.use_state:
        obs["state"] = np.zeros(policy.state_dim, dtype=np.float32)
    return obs


def continuing(policy, obs: dict) -> dict:
    """`obs` as a real-time-chunking request: half a chunk of committed (raw) actions, one of them
    executed while this chunk is computed."""
    committed = max(1, policy.chunk_length // 2)
    return {**obs, "committed_actions": np.zeros((committed, policy.action_dim), dtype=np.float32),
            "inference_delay": min(1, policy.chunk_length - 1)}


def warm_up(policy, predict_batch: Callable[..., list], max_batch: int, num_steps: int,
            sizes: list[tuple[int, int]]) -> list[tuple[int, float]]:
    """Run every batch size once plain and once with real-time chunking; returns (batch size,
    seconds of both). A failing warm-up is an error: a server that cannot answer its own request must
    not report ready."""
    plain = warmup_observation(policy, sizes)
    timings = []
    for batch in range(1, max_batch + 1):
        seconds = [_run_batch(policy, predict_batch, obs, batch, num_steps) for obs in (plain, continuing(policy, plain))]
        timings.append((batch, sum(seconds)))
        log.info("wamkit serve: warmed up batch size %d in %.2f s (plain %.2f, real-time chunking %.2f)", batch, sum(seconds), *seconds)
    return timings


def _run_batch(policy, predict_batch: Callable[..., list], obs: dict, batch: int, num_steps: int) -> float:
    start = time.perf_counter()
    results = predict_batch(policy, [obs] * batch, list(range(batch)), num_steps)
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        kind = "real-time chunking" if "committed_actions" in obs else "plain"
        raise WamkitError("wamkit serve --warmup", f"batch size {batch} ({kind}) failed: {failed}",
                          "check the export with `wamkit eval`, or start with --no-warmup to debug requests")
    return time.perf_counter() - start


def parse_size(text: str) -> tuple[int, int]:
    """`--warmup-size 480x640` -> (480, 640)."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
        if h > 0 and w > 0:
            return h, w
    except ValueError:
        pass
    raise WamkitError("--warmup-size", f"is {text!r}", "give the camera frame size as HxW, e.g. 480x640")
