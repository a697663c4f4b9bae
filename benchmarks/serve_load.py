"""Load on a `wamkit serve` process, through openpi's websocket client: the process itself, timed
requests from N clients, bad requests that must each get a named error, and a per-minute soak.
benchmarks/serve_export.py reports what these return."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from g1_export import CAMERA, REPO

PROMPT = "pick up the red cube and place it in the bowl"
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", flush=True)


# ---- requests ---------------------------------------------------------------------------------

def observation(rng: np.random.Generator, size: int, rtc: tuple[int, int] | None) -> dict:
    obs = {"images": {CAMERA: rng.integers(0, 256, (size, size, 3), dtype=np.uint8)},
           "state": rng.uniform(-0.5, 0.5, 32).astype(np.float32), "prompt": PROMPT}
    if rtc is not None:  # the rest of the previous chunk, raw units, and the ticks that run before this reply
        committed, delay = rtc
        obs["committed_actions"] = rng.uniform(-0.5, 0.5, (committed, 36)).astype(np.float32)
        obs["inference_delay"] = int(delay)
    return obs


def connect(port: int):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    return WebsocketClientPolicy("127.0.0.1", port)


@dataclasses.dataclass
class Timed:
    latency_ms: list
    infer_ms: list
    batch: list
    errors: int
    wall_s: float
    first_ms: float | None = None
    first_error: str | None = None


def run_clients(port: int, clients: int, requests: int, size: int, rtc, seed: int, first_separately: bool = False) -> Timed:
    """`clients` openpi connections, each sending `requests` back to back after a common start.
    With first_separately, client 0's first request is timed on its own before the others start."""
    conns = [connect(port) for _ in range(clients)]
    out = Timed([], [], [], 0, 0.0)
    lock, barrier = threading.Lock(), threading.Barrier(clients)
    chunk = None

    def one(conn, obs):
        nonlocal chunk
        start = time.perf_counter()
        try:
            reply = conn.infer(obs)
        except Exception as exc:  # noqa: BLE001  counted, the first one kept for the report
            with lock:
                out.errors += 1
                out.first_error = out.first_error or f"{type(exc).__name__}: {str(exc)[:300]}"
            return None
        ms = (time.perf_counter() - start) * 1e3
        chunk = reply["action"].shape
        return ms, float(reply["server_timing"]["infer_ms"]), int(reply["server_timing"]["batch_size"])

    if first_separately:
        rng = np.random.default_rng(seed + 999)
        got = one(conns[0], observation(rng, size, rtc))
        out.first_ms = got[0] if got else float("nan")

    def client(i: int) -> None:
        rng = np.random.default_rng(seed + i)
        obs = [observation(rng, size, rtc) for _ in range(requests)]
        barrier.wait()
        for o in obs:
            got = one(conns[i], o)
            if got:
                with lock:
                    out.latency_ms.append(got[0])
                    out.infer_ms.append(got[1])
                    out.batch.append(got[2])

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out.wall_s = time.perf_counter() - t
    for c in conns:
        c._ws.close()
    if chunk is not None and tuple(chunk) != (32, 36):
        raise SystemExit(f"replies carry action chunks of shape {chunk}, not the G1 shape (32, 36)")
    return out


def pct(values, q) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# ---- the server process -----------------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, ""


class ServerProcess:
    """`wamkit serve EXPORT` in its own process session; its log goes to `log_path`."""

    def __init__(self, export: Path, device: str, num_steps: int, max_batch: int, log_path: Path, fp8: bool = False):
        self.port = free_port()
        self.log_path = log_path
        cmd = [sys.executable, "-m", "wamkit.cli", "serve", str(export), "--port", str(self.port), "--device", device,
               "--num-steps", str(num_steps), "--max-batch", str(max_batch), "--warmup", *(["--fp8"] if fp8 else [])]
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
        log(f"server: {' '.join(cmd[1:])}")
        self.started = time.perf_counter()
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        self.listening_s = self.ready_s = None

    def wait_ready(self, timeout: float) -> None:
        while time.perf_counter() - self.started < timeout:
            if self.proc.poll() is not None:
                raise SystemExit(f"wamkit serve exited with {self.proc.returncode} before /healthz said 200:\n{self.tail()}")
            status, _ = http_get(self.port, "/healthz")
            now = time.perf_counter() - self.started
            if status and self.listening_s is None:
                self.listening_s = now
                log(f"server: listening after {now:.1f} s (/healthz {status})")
            if status == 200:
                self.ready_s = now
                log(f"server: /healthz 200 after {now:.1f} s")
                return
            time.sleep(0.1)
        raise SystemExit(f"wamkit serve was not ready after {timeout:.0f} s:\n{self.tail()}")

    def stats(self) -> dict:
        status, body = http_get(self.port, "/stats")
        return json.loads(body) if status == 200 else {}

    def rss_bytes(self) -> int | None:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
            return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return None

    def warmup_lines(self) -> list[str]:
        return [line.strip() for line in self.log_path.read_text().splitlines() if "warmed up batch size" in line or "ready (" in line]

    def tail(self, n: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text().splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self._log.close()


def gpu_used_mib() -> float | None:
    """nvidia-smi's memory.used of GPU 0 (every process on it), or None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=20)
        return float(out.stdout.strip().splitlines()[0]) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


# ---- bad requests -----------------------------------------------------------------------------

def bad_requests(port: int, size: int, max_request_bytes: int, rtc, rows: list) -> list[dict]:
    """Each bad request on a live connection must get a named error (a text reply naming the field,
    or for a message over twice the limit a close with code 1009), and the next good request on
    that connection (a new one after a close) an action chunk."""
    from openpi_client import msgpack_numpy
    from websockets.exceptions import ConnectionClosed

    rng = np.random.default_rng(7)
    good = lambda: observation(rng, size, None)  # noqa: E731
    packer = msgpack_numpy.Packer()
    over = math.ceil(math.sqrt(1.05 * max_request_bytes / 3))  # one image just over --max-request-bytes
    far = math.ceil(math.sqrt(2.1 * max_request_bytes / 3))  # over twice the limit: refused before buffering
    garbage = b"\xc1" + np.random.default_rng(1).integers(0, 256, 4095, dtype=np.uint8).tobytes()  # 0xc1: never valid msgpack
    corrupt = {b"__ndarray__": True, b"data": b"\x00" * 10, b"dtype": "|u1", b"shape": [size, size, 3]}
    cases = [
        ("state of 31 numbers (model: 32)", {**good(), "state": np.zeros(31, np.float32)}, "request['state']"),
        ("NaN in the state", {**good(), "state": np.full(32, np.nan, np.float32)}, "NaN"),
        ("image with 4 channels", {**good(), "images": {CAMERA: np.zeros((size, size, 4), np.uint8)}}, "request['images']"),
        ("float image", {**good(), "images": {CAMERA: np.zeros((size, size, 3), np.float32)}}, "request['images']"),
        ("unknown camera", {**good(), "images": {"wrist": np.zeros((size, size, 3), np.uint8)}}, "is not a camera"),
        ("committed_actions of 35 columns (model: 36)",
         {**good(), "committed_actions": np.zeros((16, 36 - 1), np.float32), "inference_delay": 5}, "committed_actions"),
        ("inference_delay without committed_actions", {**good(), "inference_delay": 5}, "inference_delay"),
        ("unknown request key", {**good(), "imagez": 1}, "is not a request key"),
        (f"oversized image {over}x{over}x3 (over --max-request-bytes)", {**good(), "images": {CAMERA: np.zeros((over, over, 3), np.uint8)}},
         "--max-request-bytes"),
        ("garbage bytes (not msgpack)", garbage, "not valid msgpack"),
        ("array whose bytes do not fill its shape", msgpack_pack_raw({"images": {CAMERA: corrupt}, "state": [0.0] * 32, "prompt": PROMPT}),
         "data has 10 bytes"),
        ("text frame", "hello", "is a text message"),
        (f"image {far}x{far}x3 (over twice --max-request-bytes)", {**good(), "images": {CAMERA: np.zeros((far, far, 3), np.uint8)}},
         "close 1009"),
    ]
    client = connect(port)
    for name, payload, expected in cases:
        data = payload if isinstance(payload, (bytes, str)) else packer.pack(payload)
        try:
            client._ws.send(data)
            reply = client._ws.recv()
            got = reply.splitlines()[0] if isinstance(reply, str) else "an action chunk (no error)"
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            got = f"close {code} ({exc.rcvd.reason if exc.rcvd is not None else 'no close frame'})"
            client = connect(port)
        named = expected in got and (got.startswith("wamkit serve error:") or got.startswith("close 1009"))
        try:
            chunk = client.infer(good())["action"]
            served = chunk.shape == (32, 36) and bool(np.isfinite(chunk).all())
        except Exception as exc:  # noqa: BLE001
            served, got = False, f"{got}; then the good request failed: {exc}"
        rows.append({"case": name, "reply": got[:150], "named": named, "served_after": served, "expected": expected})
    client._ws.close()
    return rows


def msgpack_pack_raw(obj) -> bytes:
    import msgpack

    return msgpack.packb(obj, use_bin_type=True)


# ---- soak -------------------------------------------------------------------------------------

def soak(server: ServerProcess, clients: int, minutes: float, minute_s: float, size: int, rtc, rows: list) -> list[dict]:
    """`clients` connections sending back to back for `minutes` x `minute_s` seconds; one row per
    minute (the last may be shorter when the budget cut it), appended to `rows` as it ends."""
    stop = threading.Event()
    lock = threading.Lock()
    events: list[tuple[float, float | None]] = []  # (time, latency ms or None for an error)
    first_error: list[str] = []
    conns = [connect(server.port) for _ in range(clients)]

    def client(i: int) -> None:
        rng = np.random.default_rng(100 + i)
        pool = [observation(rng, size, rtc if (rtc and i % 2) else None) for _ in range(8)]
        k = 0
        while not stop.is_set():
            start = time.perf_counter()
            try:
                reply = conns[i].infer(pool[k % len(pool)])
                ok = reply["action"].shape == (32, 36)
            except Exception as exc:  # noqa: BLE001  counted per minute, the first one kept for the report
                ok = False
                if not first_error:
                    first_error.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                time.sleep(0.1)  # a closed connection fails at once: no busy loop
            with lock:
                events.append((time.perf_counter(), (time.perf_counter() - start) * 1e3 if ok else None))
            k += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    try:
        n_minutes = max(1, math.ceil(minutes))
        for m in range(n_minutes):
            end = t0 + min((m + 1), minutes) * minute_s
            time.sleep(max(0.0, end - time.perf_counter()))
            stats = server.stats()
            with lock:
                window = [lat for t, lat in events if t0 + m * minute_s <= t < end]
            ok = [lat for lat in window if lat is not None]
            rows.append({"minute": m + 1, "seconds": round(end - (t0 + m * minute_s), 1), "requests": len(window),
                         "errors": len(window) - len(ok), "p50_ms": pct(ok, 50), "p99_ms": pct(ok, 99),
                         "cuda_allocated": stats.get("cuda_allocated_bytes"), "cuda_reserved": stats.get("cuda_reserved_bytes"),
                         "gpu_used_mib": gpu_used_mib(), "rss": server.rss_bytes()})
            rows[-1]["first_error"] = first_error[0] if first_error else None
            log(f"soak minute {m + 1}: {rows[-1]['requests']} requests, {rows[-1]['errors']} errors, p99 {rows[-1]['p99_ms']:.1f} ms")
    finally:  # also when SIGTERM interrupts a row
        stop.set()
        deadline = time.perf_counter() + 10
        for th in threads:  # each finishes its request in flight
            th.join(max(0.0, deadline - time.perf_counter()))
        for c in conns:
            c._ws.close()
    return rows

