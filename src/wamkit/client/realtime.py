"""A robot-side client for `wamkit serve`: one action per control tick, the next chunk already on its way.

`RealtimeClient.step(obs)` is called once per control tick with the newest observation and returns
that tick's action at once. Inference runs in a background thread: when the chunk buffer reaches
its execution horizon, or holds no more than the expected latency, the client sends the current
observation and keeps handing out the remaining actions. With `rtc` (default) the request carries
those remaining actions and the expected delay in ticks, so the server samples a chunk that
continues them (real-time chunking). The delay is measured, not configured: the ticks that passed
between sending a request and using its reply, the maximum over the last few (the paper's choice:
a too-short estimate lets the chunk change actions that already ran).

Wire format: openpi's msgpack-numpy over one websocket (wamkit.serve.protocol); needs numpy,
msgpack and websockets, not torch."""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from wamkit.client.buffer import ChunkBuffer
from wamkit.serve.protocol import packb, unpackb


@dataclass
class Exchange:
    """One request and its reply, kept for inspecting seams (`RealtimeClient.history`)."""

    sent_tick: int
    delay_sent: int | None  # the inference_delay the request carried (None: plain request)
    committed: np.ndarray | None
    chunk: np.ndarray | None = None
    elapsed: int | None = None  # ticks between sending and using the reply
    latency_ms: float | None = None


class RealtimeClient:
    def __init__(self, host: str = "127.0.0.1", port: int | None = 8000, *, execution_horizon: int | None = None,
                 rtc: bool = True, control_hz: float | None = None, latency_window: int = 10,
                 open_timeout: float = 30.0, history: int = 64):
        """`execution_horizon`: actions executed per chunk before the next is requested (default
        half the chunk); `control_hz`: the tick rate of `run` and of the first latency estimate
        (default: the model's fps from the server's metadata)."""
        from websockets.sync.client import connect

        uri = host if host.startswith("ws") else f"ws://{host}" + (f":{port}" if port is not None else "")
        self._ws = connect(uri, compression=None, max_size=None, open_timeout=open_timeout)
        self.metadata = unpackb(self._ws.recv())
        chunk_length = int(self.metadata["chunk_length"])
        self.buffer = ChunkBuffer(chunk_length, int(execution_horizon or max(1, chunk_length // 2)))
        self.control_hz = float(control_hz or self.metadata["fps"])
        self.rtc = bool(rtc)
        self.tick = 0
        self.underruns = 0  # ticks that had to wait for a late chunk
        self.history: deque[Exchange] = deque(maxlen=history)
        self._delays: deque[int] = deque(maxlen=latency_window)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="wamkit-client")
        self._pending: tuple[concurrent.futures.Future, Exchange] | None = None

    # ---- the control loop ---------------------------------------------------------------------
    def step(self, observation: dict) -> np.ndarray:
        """This tick's action (float32 [action_dim], raw robot units) for the newest observation."""
        if self._pending is not None and self._pending[0].done():
            self._take()
        if self._pending is None and self.buffer.due(lead=self.expected_delay + 1):
            self._send(observation)
        popped = self.buffer.pop()
        if popped is None:  # the next chunk is late (or this is the first tick): wait for it
            self.underruns += self.buffer.chunk is not None
            self._take()
            popped = self.buffer.pop()
        self.tick += 1
        return popped[0]

    def run(self, get_observation: Callable[[], dict], apply_action: Callable[[np.ndarray], None], ticks: int) -> None:
        """Drive a robot at `control_hz` for `ticks` ticks (sleeping off what is left of each period)."""
        period, deadline = 1.0 / self.control_hz, time.monotonic()
        for _ in range(ticks):
            apply_action(self.step(get_observation()))
            deadline += period
            time.sleep(max(0.0, deadline - time.monotonic()))

    @property
    def expected_delay(self) -> int:
        """Ticks a reply is expected to take: the largest of the recent measurements."""
        return max(self._delays, default=0)

    # ---- requests -----------------------------------------------------------------------------
    def _send(self, observation: dict) -> None:
        request, exchange = dict(observation), Exchange(self.tick, None, None)
        if self.rtc and self.buffer.chunk is not None:
            committed = self.buffer.committed().astype(np.float32)
            if len(committed):
                exchange.committed, exchange.delay_sent = committed, min(self.expected_delay, len(committed))
                request.update(committed_actions=committed, inference_delay=exchange.delay_sent)
        self._pending = (self._executor.submit(self._infer, request), exchange)

    def _infer(self, request: dict) -> tuple[np.ndarray, float]:
        start = time.perf_counter()
        self._ws.send(packb(request))
        reply = self._ws.recv()
        if isinstance(reply, str):
            raise RuntimeError(f"Error in inference server:\n{reply}")
        return np.asarray(unpackb(reply)["action"]), (time.perf_counter() - start) * 1e3

    def _take(self) -> None:
        """Switch to the pending reply (waiting for it if need be) at the index of the ticks that passed."""
        future, exchange = self._pending
        self._pending = None
        exchange.chunk, exchange.latency_ms = future.result()
        exchange.elapsed = self.tick - exchange.sent_tick
        # a reply waited for (first request, late chunk) counts fewer ticks than it took: take its seconds too
        self._delays.append(max(exchange.elapsed, math.ceil(exchange.latency_ms / 1e3 * self.control_hz)))
        self.history.append(exchange)
        self.buffer.switch(exchange.chunk, min(exchange.elapsed, len(exchange.chunk) - 1))

    # ---- lifecycle ----------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new episode: drop the buffer and any reply still on its way."""
        if self._pending is not None:
            self._pending[0].result()
            self._pending = None
        self.buffer = ChunkBuffer(self.buffer.chunk_length, self.buffer.execution_horizon)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._ws.close()

    def __enter__(self) -> "RealtimeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
