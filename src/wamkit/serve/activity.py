"""What `wamkit serve` says on its console: what it serves (once, at startup), every failed request
(one line each), and every `--stats-every` seconds how many requests it answered and how fast. An
operator reads these to tell a server that works from one that answers wrongly, slowly or not at
all, without attaching a client."""

from __future__ import annotations

import threading
import time

import numpy as np


def startup_summary(policy, num_steps: int, camera_sizes, resize: bool) -> list[str]:
    """The lines printed before `listening`: where the weights came from and what a request must hold."""
    from wamkit.policy.policy import sampler_text

    source = dict(policy.loaded.source)
    origin = source.get("export") or source.get("checkpoint") or "?"
    step = source.get("step", "?")
    weights = {"ema": "EMA", "raw": "raw"}.get(source.get("weights"), source.get("weights", "?"))
    device = next(policy.model.parameters()).device
    cameras = ", ".join(f"{key} {h}x{w}" for key, (h, w) in zip(policy.camera_keys, camera_sizes)) if camera_sizes else \
        ", ".join(policy.camera_keys) + " (training sizes not recorded: not checked)"
    other = "another size is resized to it (--resize-images)" if resize else "another size is refused (--resize-images resizes it)"
    state = f"state {policy.state_dim}-D" if policy.use_state else "no state"
    return [
        f"wamkit serve: {origin} (step {step}, {weights} weights) on {device}",
        f"wamkit serve: cameras {cameras} (HxW px; {other}); {state}",
        f"wamkit serve: action {policy.action_dim}-D x {policy.chunk_length} steps per chunk at {policy.fps:g} fps, "
        + sampler_text(num_steps, policy.noise_scale),
    ]


class RequestLog:
    """Counts and latencies since the last report; thread-safe (the event loop writes, a timer reads)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._latencies_ms: list[float] = []
        self._errors = 0
        self.total, self.total_errors = 0, 0
        self._since = time.monotonic()

    def answered(self, latency_ms: float) -> None:
        with self._lock:
            self._latencies_ms.append(latency_ms)
            self.total += 1

    def failed(self) -> None:
        with self._lock:
            self._errors += 1
            self.total_errors += 1

    def report(self) -> str | None:
        """One line for the interval since the last call; None when nothing arrived."""
        with self._lock:
            latencies, errors, since = self._latencies_ms, self._errors, self._since
            self._latencies_ms, self._errors, self._since = [], 0, time.monotonic()
        if not latencies and not errors:
            return None
        seconds = time.monotonic() - since
        line = f"wamkit serve: last {seconds:.1f} s: {len(latencies)} answered ({len(latencies) / max(seconds, 1e-9):.2f} req/s), {errors} failed"
        if latencies:
            p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
            line += f"; latency p50 {p50:.1f} ms, p90 {p90:.1f} ms, p99 {p99:.1f} ms"
        return line

    def final(self, reason: str) -> str:
        return f"wamkit serve: stopped ({reason}) after {self.total} answered and {self.total_errors} failed requests"
