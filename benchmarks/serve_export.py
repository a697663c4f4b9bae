"""`wamkit serve EXPORT` measured as a robot uses it (issue 30): the product path, not the harness.

    python benchmarks/serve_export.py --preset nano --export /tmp/wamkit_nano_export --parts inprocess,latency,bad
    python benchmarks/serve_export.py --preset nano --export /tmp/wamkit_nano_export --parts soak --soak-minutes 8
    python benchmarks/serve_export.py --preset tiny --device cpu --image-size 64 ...        # CPU (tests)

It makes a random-weight export once, with the files `wamkit export` writes (wamkit.export.write_export:
transformer/ by save_pretrained, wamkit.json with the data contract, model info, diffusion settings and
the experiment config of recipes/g1_simple.toml at this preset) and the G1 shape: chunk 32 x 36-D
actions, 32-D state, one camera of --image-size (256: the 256p tier), --text-tokens prompt tokens. A
run's checkpoint loads in float32, so `wamkit export` of a real Nano run writes 61 GB; this one is
written in bf16 (30 GB, --export-dtype), which the host's 64 GB disk holds, and which the export
loader serves in bf16. The random Wan2.2-layout VAE lies beside it (<export>_vae, named in wamkit.json).
An existing export (wamkit.json present) is reused.

Then it starts `python -m wamkit.cli serve EXPORT --warmup --max-batch <largest client count>` as its
own process, waits for GET /healthz 200, and measures with openpi's websocket client: the first
request after /healthz turned 200, p50/p99 per chunk at each --clients level, plain and with
real-time-chunking fields (committed_actions + inference_delay), the server's own inference time
(server_timing.infer_ms) beside the client's; bad requests (each must get a named error, and the
next request on the connection an action chunk); a soak (8 clients, per minute: requests, errors,
p99, the server's CUDA allocator bytes from GET /stats, nvidia-smi's used memory, the server's host
RSS from /proc). The in-process harness row (benchmarks/serve_latency.py: PolicyServer in this
process around the same random weights) runs in the same call. --budget-s skips or shortens parts
that would not fit. Prints markdown tables and the line `serve_p50_ms=<x>` (the export, 1 client,
plain, --num-steps); exits 1 when a check failed."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

CAMERA = "observation.images.ego_view"
PROMPT = "pick up the red cube and place it in the bowl"
PARTS = ("inprocess", "latency", "bad", "soak")
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", flush=True)


# ---- the machine ------------------------------------------------------------------------------

def host_line(device: str, kind: str) -> str:
    """Accelerator and host CPU, named beside every number."""
    import torch

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "unknown CPU")
    except OSError:
        cpu = "unknown CPU"
    gpu = "no GPU"
    if device.startswith("cuda") and torch.cuda.is_available():
        gpu = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return (f"kind {kind or 'unnamed (--kind)'}; device {device}: {gpu}; host CPU: {cpu}, {os.cpu_count()} cores visible; "
            f"torch {torch.__version__}")


# ---- the export -------------------------------------------------------------------------------

def g1_config(preset: str, vae_dir: Path, text_tokens: int):
    from wamkit.config import load_experiment

    sets = {"model.preset": f'"{preset}"', "model.vae_path": f'"{vae_dir}"', "checkpoint.load_path": '""',
            "data.path": '"/nonexistent/g1_simple (random-weight benchmark export)"', "model.max_text_tokens": str(text_tokens)}
    return load_experiment(REPO / "recipes" / "g1_simple.toml", [f"{k}={v}" for k, v in sets.items()])


def random_vae(preset: str):
    """Wan2.2's VAE layout at full width (nano) or at the tests' tiny width, random weights."""
    import torch
    from diffusers import AutoencoderKLWan

    from wamkit.model.tokenizer import WAN22_VAE_LAYOUT

    torch.manual_seed(0)
    layout = WAN22_VAE_LAYOUT if preset != "tiny" else dict(
        base_dim=16, decoder_base_dim=16, z_dim=48, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
        patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4)
    return AutoencoderKLWan(**layout, latents_mean=[0.0] * 48, latents_std=[1.0] * 48)


def g1_contract(cfg, image_size: int, text_tokens: int) -> dict:
    """The data contract a G1 run records (wamkit.train.setup), with [-1, 1] min/max statistics."""
    from wamkit.data import Normalizer
    from wamkit.data.canvas import CanvasTransform

    bounds = lambda n: {"min": np.full(n, -1.0), "max": np.full(n, 1.0)}  # noqa: E731
    return {
        "dataset": "random-weight benchmark export (no dataset)", "fps": float(cfg.data.fps), "chunk_length": cfg.data.chunk_length,
        "camera_keys": [CAMERA], "camera_sizes": [[image_size, image_size]],
        "action_key": cfg.data.action_key, "action_dim": 36, "state_key": cfg.data.state_key, "state_dim": 32,
        "max_action_dim": cfg.model.max_action_dim, "use_state": True, "domain_name": cfg.data.domain_name,
        "domain_id": cfg.data.domain_id,
        "prompt_template": "{task} " + "." * text_tokens,  # padded: the tokenizer truncates to text_tokens
        "canvas": CanvasTransform.from_config(cfg.data, [CAMERA]).state_dict(),
        "action_normalizer": Normalizer.from_stats({"action": bounds(36)}, "action", "minmax").state_dict(),
        "state_normalizer": Normalizer.from_stats({"observation.state": bounds(32)}, "observation.state", "minmax").state_dict(),
        "train_episodes": [], "val_episodes": [],
    }


def make_export(export: Path, preset: str, device: str, dtype_name: str, image_size: int, text_tokens: int):
    """Write the export (under a temporary sibling, renamed into place when complete). Returns
    (model, vae) still in memory, for the in-process row."""
    import torch

    from wamkit.export.export import write_export
    from wamkit.model.cosmos3 import build_transformer
    from wamkit.model.text_tokenizer import ByteTokenizer
    from wamkit.policy.loading import LoadedModel, model_info_from_config

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype_name]
    vae_dir = export.parent / f"{export.name}_vae"
    cfg = g1_config(preset, vae_dir, text_tokens)
    tmp = export.parent / f".tmp_{export.name}_{os.getpid()}"
    export.parent.mkdir(parents=True, exist_ok=True)
    for stale in [vae_dir, *export.parent.glob(f".tmp_{export.name}_*")]:  # an earlier call's, cut off while writing
        shutil.rmtree(stale, ignore_errors=True)
    t = time.perf_counter()
    with torch.device(device):
        torch.manual_seed(0)
        model = build_transformer(preset, 48, cfg.model.max_action_dim, cfg.model.num_domains, cfg.model.fps_modulation)
        model = model.to(dtype).eval().requires_grad_(False)
        vae = random_vae(preset)
    log(f"export: built random {preset} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, {dtype_name}) "
        f"and VAE on {device} in {time.perf_counter() - t:.0f} s")
    need = sum(t.numel() * t.element_size() for t in [*model.state_dict().values(), *vae.state_dict().values()])
    free = shutil.disk_usage(export.parent).free
    if free < need * 1.05:
        raise SystemExit(f"{export.parent} has {free / 2**30:.1f} GiB free, the export needs {need / 2**30:.1f} GiB: "
                         "free disk space or pass --export on a larger disk")
    t = time.perf_counter()
    vae.save_pretrained(str(vae_dir))
    text = ByteTokenizer(text_tokens)
    loaded = LoadedModel(model=model, video_tokenizer=None, text_tokenizer=text, contract=g1_contract(cfg, image_size, text_tokens),
                         model_info=model_info_from_config(cfg, text), diffusion=dataclasses.asdict(cfg.diffusion),
                         source={"weights": f"random ({preset}, seed 0)", "written_by": "benchmarks/serve_export.py"},
                         experiment_config=dataclasses.asdict(cfg))
    tmp.mkdir()
    write_export(loaded, tmp)
    os.rename(tmp, export)
    log(f"export: wrote {export} ({dir_gib(export):.1f} GiB) and {vae_dir.name} in {time.perf_counter() - t:.0f} s")
    return model, vae


def dir_gib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**30


def check_reusable(export: Path, preset: str, image_size: int) -> None:
    manifest = json.loads((export / "wamkit.json").read_text())
    got = (manifest["model"]["preset"], manifest["data_contract"]["camera_sizes"])
    if got != (preset, [[image_size, image_size]]):
        raise SystemExit(f"{export} holds preset/camera sizes {got}, not {(preset, [[image_size, image_size]])}: "
                         "pass another --export or delete it")


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
        except Exception:  # noqa: BLE001  counted, never hidden
            with lock:
                out.errors += 1
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

    def __init__(self, export: Path, device: str, num_steps: int, max_batch: int, log_path: Path):
        self.port = free_port()
        self.log_path = log_path
        cmd = [sys.executable, "-m", "wamkit.cli", "serve", str(export), "--port", str(self.port), "--device", device,
               "--num-steps", str(num_steps), "--max-batch", str(max_batch), "--warmup"]
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

def bad_requests(port: int, size: int, max_request_bytes: int, rtc) -> list[dict]:
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
    rows = []
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

def soak(server: ServerProcess, clients: int, minutes: float, minute_s: float, size: int, rtc) -> list[dict]:
    """`clients` connections sending back to back for `minutes` x `minute_s` seconds; one row per
    minute (the last may be shorter when the budget cut it)."""
    stop = threading.Event()
    lock = threading.Lock()
    events: list[tuple[float, float | None]] = []  # (time, latency ms or None for an error)
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
            except Exception:  # noqa: BLE001
                ok = False
            with lock:
                events.append((time.perf_counter(), (time.perf_counter() - start) * 1e3 if ok else None))
            k += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    rows = []
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
        log(f"soak minute {m + 1}: {rows[-1]['requests']} requests, {rows[-1]['errors']} errors, p99 {rows[-1]['p99_ms']:.1f} ms")
    stop.set()
    for th in threads:
        th.join(60)
    for c in conns:
        c._ws.close()
    return rows


# ---- the in-process harness row -----------------------------------------------------------------

def inprocess_rows(args, model, vae, left) -> list[dict]:
    """benchmarks/serve_latency.py's path: PolicyServer in this process, its client, same levels."""
    import torch

    from serve_latency import measure, random_weight_policy
    from wamkit.serve import PolicyServer

    if vae is None:
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(str(args.export.parent / f"{args.export.name}_vae"))
    vae = vae.to(args.device, torch.bfloat16)
    policy = random_weight_policy(args.preset, args.device, args.num_steps, args.text_tokens, True, True, True, model=model, vae=vae)
    server = PolicyServer(policy, host="127.0.0.1", port=0, num_steps=args.num_steps, batch_window_ms=5.0,
                          max_batch=max(args.clients)).start_in_thread()
    rows = []
    try:
        for clients in args.clients:  # every batch shape compiled / captured before timing, as serve_latency.py does
            measure(server.port, clients, args.warmup_requests, args.image_size)
        for clients in args.clients:
            t = time.perf_counter()
            lat, sizes = measure(server.port, clients, args.requests, args.image_size)
            rows.append(dict(path="in-process harness (serve_latency.py)", clients=clients, fields="plain", requests=len(lat),
                             first=None, p50=pct(lat, 50), p99=pct(lat, 99), infer=None, batch=float(np.mean(sizes)),
                             rate=len(lat) / (time.perf_counter() - t), errors=0))
            log(f"in-process, {clients} clients: p50 {rows[-1]['p50']:.1f} ms")
        if args.profile and left() > 60:  # where one chunk's time goes: encode / forwards / host rest, then the top GPU kernels
            from serve_latency import profile_predict

            print("\nin-process phase profile (serve_latency.py --profile; Policy.predict without the server):", flush=True)
            profile_predict(policy, args.image_size, 10, 2)
            sys.stdout.flush()
    finally:
        server.stop()
        server.join(30)
        policy.disable_cuda_graphs()
        del policy, server
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


# ---- main -------------------------------------------------------------------------------------

def fmt(x, digits=1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def gib(x) -> str:
    return "-" if x is None else f"{x / 2**30:.2f}"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="nano", help="transformer width: nano (the goal) or tiny (CPU tests)")
    p.add_argument("--export", type=Path, default=None, help="export directory: made when missing, reused when present "
                   "(default /tmp/wamkit_serve_export_<preset>)")
    p.add_argument("--export-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--parts", default="inprocess,latency,bad", help=f"comma-separated, of {','.join(PARTS)} (soak also via --soak-minutes)")
    p.add_argument("--clients", default="1,8", help="concurrency levels; the largest is the server's --max-batch and the soak's")
    p.add_argument("--requests", type=int, default=20, help="requests per client per level")
    p.add_argument("--num-steps", type=int, default=4)
    p.add_argument("--warmup-requests", type=int, default=3, help="untimed requests per client level before the in-process row")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--text-tokens", type=int, default=256)
    p.add_argument("--rtc-committed", type=int, default=16, help="committed actions sent with real-time chunking")
    p.add_argument("--rtc-delay", type=int, default=5, help="inference_delay sent with real-time chunking")
    p.add_argument("--soak-minutes", type=float, default=0, help="soak at the largest client level (adds the soak part)")
    p.add_argument("--soak-minute-s", type=float, default=60.0, help="seconds per soak row (tests shorten it)")
    p.add_argument("--soak-rtc", action="store_true", help="odd-numbered soak clients send real-time-chunking fields")
    p.add_argument("--budget-s", type=float, default=0, help="wall seconds for the whole call (0: unlimited): parts that "
                   "would not fit are skipped, the soak is shortened")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                   help="after the in-process row, its phase split and top GPU kernels (default: on CUDA)")
    p.add_argument("--kind", default="", help="the machine kind, printed beside the numbers (e.g. nvidia-h200)")
    p.add_argument("--startup-timeout", type=float, default=480)
    p.add_argument("--log-dir", type=Path, default=None, help="server log and results.json (default: beside the export)")
    args = p.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    args.parts = {s.strip() for s in args.parts.split(",") if s.strip()} | ({"soak"} if args.soak_minutes > 0 else set())
    unknown = args.parts - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}; use {','.join(PARTS)}")
    args.profile = args.device.startswith("cuda") if args.profile is None else args.profile
    args.export = args.export or Path(f"/tmp/wamkit_serve_export_{args.preset}")
    args.log_dir = args.log_dir or args.export.parent
    return args


@dataclasses.dataclass
class Report:
    header: str
    export_note: str = ""
    rows: list = dataclasses.field(default_factory=list)
    bad: list = dataclasses.field(default_factory=list)
    soak: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    failed: list = dataclasses.field(default_factory=list)


class Interrupted(Exception):
    """SIGTERM (e.g. `timeout`): stop measuring, still print what was measured."""


def run_parts(args, rep: Report) -> None:
    """Export, then the server's parts in the order latency, bad, inprocess (the server idles), soak."""
    import torch

    left = lambda: float("inf") if not args.budget_s else args.budget_s - (time.perf_counter() - T0)  # noqa: E731
    rtc = (args.rtc_committed, args.rtc_delay)
    model = vae = None
    if (args.export / "wamkit.json").is_file():
        check_reusable(args.export, args.preset, args.image_size)
        rep.export_note = f"reused {args.export} ({dir_gib(args.export):.1f} GiB)"
    else:
        t = time.perf_counter()
        model, vae = make_export(args.export, args.preset, args.device, args.export_dtype, args.image_size, args.text_tokens)
        rep.export_note = f"made {args.export} ({dir_gib(args.export):.1f} GiB, {args.export_dtype}) in {time.perf_counter() - t:.0f} s"
    if "inprocess" not in args.parts:
        model = vae = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    log(f"export: {rep.export_note}")
    server = None
    try:
        if args.parts & {"latency", "bad", "soak"}:
            args.log_dir.mkdir(parents=True, exist_ok=True)
            server = ServerProcess(args.export, args.device, args.num_steps, max(args.clients), args.log_dir / "wamkit_serve.log")
            server.wait_ready(min(args.startup_timeout, max(left() - 10, 30)))
            stats = server.stats()
            rep.notes.append(f"server: own process, listening after {fmt(server.listening_s)} s, /healthz 200 after {fmt(server.ready_s)} s; "
                             f"weights {stats.get('dtype')}, CUDA allocated {gib(stats.get('cuda_allocated_bytes'))} GiB / reserved "
                             f"{gib(stats.get('cuda_reserved_bytes'))} GiB, host RSS {gib(server.rss_bytes())} GiB after warm-up")
            rep.notes += [f"server log: {line}" for line in server.warmup_lines()]
        if "latency" in args.parts:
            latency_rows(args, server, rtc, rep, left)
        if "bad" in args.parts:
            if left() < 30:
                rep.notes.append("skipped bad requests: budget")
            else:
                bad_part(args, server, rtc, rep)
        if "inprocess" in args.parts:
            if left() < 90:
                rep.notes.append("skipped the in-process row: budget")
            else:
                rep.rows += inprocess_rows(args, model, vae, left)
        model = vae = None
        if "soak" in args.parts:
            minutes = args.soak_minutes or 1
            fit = (left() - 20) / args.soak_minute_s
            if fit < minutes:
                rep.notes.append(f"soak shortened from {minutes} to {max(fit, 0):.2f} minutes: budget")
                minutes = fit
            if minutes >= 0.5:
                rep.soak = soak(server, max(args.clients), minutes, args.soak_minute_s, args.image_size, rtc if args.soak_rtc else None)
                rep.failed += [f"soak minute {r['minute']}: {r['errors']} errors" for r in rep.soak if r["errors"]]
            else:
                rep.notes.append("soak skipped: budget")
    finally:
        if server:
            if server.proc.poll() is not None:
                rep.failed.append(f"wamkit serve exited with {server.proc.returncode} during the benchmark")
                print(server.tail())
            server.stop()


SERVE_PATH = "`wamkit serve EXPORT` (own process, openpi client)"


def latency_rows(args, server, rtc, rep: Report, left) -> None:
    for fields, r in (("plain", None), (f"RTC ({args.rtc_committed} committed, delay {args.rtc_delay})", rtc)):
        for clients in args.clients:
            if left() < 45:
                rep.notes.append(f"skipped {clients} clients {fields}: budget")
                continue
            first = clients == args.clients[0]  # the first request after /healthz 200 (plain) / the first RTC request
            timed = run_clients(server.port, clients, args.requests, args.image_size, r, seed=clients, first_separately=first)
            rep.rows.append(dict(path=SERVE_PATH, clients=clients, fields=fields, requests=len(timed.latency_ms), first=timed.first_ms,
                                 p50=pct(timed.latency_ms, 50), p99=pct(timed.latency_ms, 99),
                                 infer=float(np.mean(timed.infer_ms)) if timed.infer_ms else None,
                                 batch=float(np.mean(timed.batch)) if timed.batch else None,
                                 rate=len(timed.latency_ms) / timed.wall_s, errors=timed.errors))
            log(f"export, {clients} clients, {fields}: first {fmt(timed.first_ms)} ms, p50 {fmt(rep.rows[-1]['p50'])} ms, "
                f"p99 {fmt(rep.rows[-1]['p99'])} ms, {timed.errors} errors")
            if timed.errors:
                rep.failed.append(f"{timed.errors} failed requests at {clients} clients {fields}")


def bad_part(args, server, rtc, rep: Report) -> None:
    meta = connect(server.port)
    limit = int(meta.get_server_metadata()["max_request_bytes"])
    meta._ws.close()
    errors_before = server.stats().get("errors", 0)
    rep.bad = bad_requests(server.port, args.image_size, limit, rtc)
    errors_after = server.stats().get("errors", 0)
    texts = sum(1 for b in rep.bad if b["reply"].startswith("wamkit serve error:"))
    rep.notes.append(f"bad requests: the server counted {errors_after - errors_before} errors for {texts} text-error replies")
    rep.failed += [f"bad request {b['case']!r}: got {b['reply']!r}, wanted {b['expected']!r}" for b in rep.bad if not b["named"]]
    rep.failed += [f"after bad request {b['case']!r} the next good request failed" for b in rep.bad if not b["served_after"]]
    if errors_after - errors_before != texts:
        rep.failed.append(f"server error counter moved by {errors_after - errors_before}, {texts} error replies were sent")


def print_report(args, rep: Report) -> None:
    print(f"\n{rep.header}")
    print(f"model: random weights, preset {args.preset}, G1 contract (chunk 32 x 36-D, 32-D state, one {args.image_size}x{args.image_size} "
          f"camera, {args.text_tokens} text tokens), {args.num_steps} denoising steps; export {rep.export_note}\n")
    print("| path | clients | request | requests | first ms | p50 ms/chunk | p99 ms/chunk | server infer ms (mean) | mean batch | chunks/s | errors |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rep.rows:
        print(f"| {r['path']} | {r['clients']} | {r['fields']} | {r['requests']} | {fmt(r['first'])} | {fmt(r['p50'])} | {fmt(r['p99'])} | "
              f"{fmt(r['infer'])} | {fmt(r['batch'], 2)} | {fmt(r['rate'])} | {r['errors']} |")
    row = serve_row(rep)
    if row and row["first"] is not None:
        print(f"\nfirst request after /healthz 200: {fmt(row['first'])} ms = {row['first'] / row['p50']:.2f} x p50 (goal <= 1.2)")
    for note in rep.notes:
        print(f"- {note}")
    if rep.bad:
        print("\n| bad request | reply (first line) | named error | next request served |\n| --- | --- | --- | --- |")
        for b in rep.bad:
            print(f"| {b['case']} | {b['reply'].replace('|', '/')} | {'yes' if b['named'] else 'NO'} | {'yes' if b['served_after'] else 'NO'} |")
    if rep.soak:
        print(f"\nsoak: {max(args.clients)} clients{' (odd ones with RTC fields)' if args.soak_rtc else ''}, rows of {args.soak_minute_s:.0f} s")
        print("| minute | seconds | requests | errors | p50 ms | p99 ms | server CUDA allocated GiB | reserved GiB | nvidia-smi used MiB | server RSS GiB |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rep.soak:
            print(f"| {r['minute']} | {r['seconds']} | {r['requests']} | {r['errors']} | {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | "
                  f"{gib(r['cuda_allocated'])} | {gib(r['cuda_reserved'])} | {fmt(r['gpu_used_mib'], 0)} | {gib(r['rss'])} |")
        first, last = rep.soak[0], rep.soak[-1]
        for key, name in (("cuda_reserved", "server CUDA reserved"), ("gpu_used_mib", "nvidia-smi used"), ("rss", "server RSS")):
            if first[key] and last[key]:
                print(f"- first vs last minute, {name}: {100 * (last[key] - first[key]) / first[key]:+.2f}% (goal within 1%)")
    for f in rep.failed:
        print(f"FAILED: {f}")
    if row:
        print(f"serve_p50_ms={row['p50']:.1f}")


def serve_row(rep: Report) -> dict | None:
    return next((r for r in rep.rows if r["path"] == SERVE_PATH and r["clients"] == 1 and r["fields"] == "plain"), None)


def main(argv=None) -> int:
    args = parse_args(argv)
    rep = Report(header=host_line(args.device, args.kind))
    log(rep.header)

    def on_term(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGTERM, on_term)
    try:
        run_parts(args, rep)
    except Interrupted:
        rep.failed.append("interrupted by SIGTERM (the call's time limit?): what was measured is below")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    (args.log_dir / "serve_export_results.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **dataclasses.asdict(rep)}, indent=2, default=str))
    print_report(args, rep)
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
