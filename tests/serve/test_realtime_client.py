"""The robot client against a real `wamkit serve` process: actions come out one per tick from the
right chunk at the right index, later requests carry the committed actions and the measured delay,
and the reply continues them; the client imports without torch."""

import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from tests.helpers import REPO
from tests.serve.serve_helpers import NUM_STEPS, make_obs
from wamkit.client import ChunkBuffer, RealtimeClient


@pytest.fixture(scope="module")
def serve_process(export_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "wamkit.cli", "serve", str(export_dir), "--port", str(port),
                             "--num-steps", str(NUM_STEPS), "--device", "cpu"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_healthy(proc, port)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def _wait_healthy(proc, port, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"wamkit serve exited {proc.returncode}:\n{proc.stdout.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("wamkit serve did not become healthy")


def _active(history, tick):
    """The exchange whose chunk was in use at `tick` (the last one switched to by then)."""
    return [e for e in history if e.sent_tick + e.elapsed <= tick][-1]


def test_client_hands_out_aligned_actions_and_sends_rtc_requests(serve_process):
    """Ticks, not seconds: the loop steps as fast as it can (no sleeping), so every reply arrives after the
    committed actions ran out and its delay is that count of ticks whatever the machine's load (a control
    rate of 1 tick per 1000 s makes the seconds-based estimate one tick). The requests, the delays and the
    replies are then the same on every run, and the frozen head can be held to a tight bound."""
    obs = make_obs(7)
    actions = []
    with RealtimeClient("127.0.0.1", serve_process, control_hz=1e-3) as client:
        assert client.buffer.execution_horizon == 4 and client.metadata["chunk_length"] == 8
        for _ in range(40):
            actions.append(client.step(obs))
        history = list(client.history)
    assert len(actions) == 40 and all(a.shape == (3,) and np.isfinite(a).all() for a in actions)
    assert len(history) >= 40 // 8 + 1
    for tick, action in enumerate(actions):
        e = _active(history, tick)
        np.testing.assert_array_equal(action, e.chunk[tick - e.sent_tick])  # index = ticks since its observation
    steered = [e for e in history[1:] if e.delay_sent]
    assert steered, f"no request carried a delay: {[(e.delay_sent, e.elapsed, e.latency_ms) for e in history]}"
    for e in history[1:]:  # the reply came once the committed actions were spent: elapsed = their count
        assert e.elapsed == len(e.committed), [(x.elapsed, len(x.committed)) for x in history[1:]]
    for e in steered:  # the frozen head of the reply continues what the robot was executing
        d = e.delay_sent
        gap = np.abs(e.chunk[:d] - e.committed[:d]).mean()
        # 3 denoising steps (tests/policy/test_rtc.py checks the inpainting itself at fixed delays)
        assert gap < 0.1 * np.abs(e.committed[:d]).mean() + 1e-3, (d, gap, np.abs(e.committed[:d]).mean())


def test_plain_client_sends_no_rtc_fields(serve_process):
    with RealtimeClient("127.0.0.1", serve_process, control_hz=50.0, rtc=False, execution_horizon=8) as client:
        for _ in range(12):
            client.step(make_obs(1))
        assert all(e.delay_sent is None and e.committed is None for e in client.history)
        assert len(client.history) >= 2


def test_chunk_buffer_switches_at_the_elapsed_index():
    buf = ChunkBuffer(8, 3)
    assert buf.due()  # no chunk yet
    buf.switch(np.arange(8.0)[:, None], 0)
    assert [buf.pop()[0][0] for _ in range(3)] == [0.0, 1.0, 2.0] and buf.due() and buf.remaining == 5
    np.testing.assert_array_equal(buf.committed()[:, 0], [3, 4, 5, 6, 7])
    assert buf.pop()[1] is False
    buf.switch(10 + np.arange(8.0)[:, None], 2)  # its observation was taken 2 ticks ago
    action, seam = buf.pop()
    assert action[0] == 12.0 and seam and buf.pop()[1] is False
    buf.switch(np.arange(8.0)[:, None], 0)
    assert buf.due(lead=8) and not buf.due(lead=2)  # a long expected latency asks early
    with pytest.raises(ValueError, match="only covers"):
        buf.switch(np.zeros((8, 1)), 8)


def test_client_imports_without_torch():
    code = "import sys, wamkit.client; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
