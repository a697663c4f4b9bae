"""`wamkit serve`: a websocket policy server speaking openpi's protocol around `wamkit.policy.Policy`.

One connection = one client. On connect the server sends a metadata dict (the data contract summary);
then every binary message is a request dict and gets one reply: a dict with `action` (float32
[chunk_length, action_dim], raw robot units) and `server_timing`, or, when the request is bad, a text
message naming the problem (openpi's client raises it as RuntimeError) - the connection stays open.

Requests that arrive within `batch_window_ms` of each other (from any connections) run as one
batched sampling call in a worker thread, so the event loop keeps accepting while the model runs.
A batch holding a request from every open connection is complete and runs at once: one client never
waits for the window.
`GET /healthz` on the same port answers 200 "ok". See docs/serving.md for the request keys.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import difflib
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wamkit.data.writer import camera_name
from wamkit.errors import WamkitError
from wamkit.policy.policy import RTC_KEYS, Policy, PolicyInputError, load_policy
from wamkit.serve.activity import RequestLog, startup_summary
from wamkit.serve.camera_size import contract_sizes, fit_camera_sizes
from wamkit.serve.protocol import ProtocolError, error_text, packb, unpackb

log = logging.getLogger("wamkit.serve")

PROTOCOL = "openpi-msgpack-numpy"
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
HARD_LIMIT_FACTOR = 2  # messages above factor * max_request_bytes close the connection (code 1009)

IMAGE_KEYS = ("image", "observation/image")
STATE_KEYS = ("state", "observation/state")
REQUEST_KEYS = ("images", *IMAGE_KEYS, *STATE_KEYS, "prompt", "seed", *RTC_KEYS)


# ---- request -> Policy observation ------------------------------------------------------------

def _one_of(request: Mapping, names: tuple[str, ...]):
    present = [n for n in names if n in request]
    if len(present) > 1:
        raise ProtocolError(f"request[{present[1]!r}]", f"given together with {present[0]!r}", "send only one of them")
    return (present[0], request[present[0]]) if present else (names[0], None)


def observation_from_request(request: Any, camera_keys: list[str], use_state: bool = True,
                             camera_sizes: list[tuple[int, int]] | None = None, resize: bool = False) -> tuple[dict, int | None]:
    """A request dict -> (Policy observation {'image', 'state', 'prompt'}, seed or None).

    Images: `images` = {camera_key: uint8 [H, W, 3]} (contract keys, or their last dotted part,
    e.g. 'front' for 'observation.images.front'), or `image` / `observation/image` = uint8 [H, W, 3]
    or [V, H, W, 3] in contract camera order. State: `state` / `observation/state`. Prompt: `prompt`.
    Optional `seed` (int) overrides the server's seed for this request. Optional real-time chunking
    keys (`committed_actions`, `inference_delay`, `execution_horizon`) pass through to the policy,
    which validates them; clients that do not send them get plain chunks. With `camera_sizes` (the
    training sizes), a view of another size is refused, or resized when `resize` (serve.camera_size)."""
    if not isinstance(request, Mapping):
        raise ProtocolError("request", f"must be a dict (msgpack map), got {type(request).__name__}",
                            f"send a dict with keys from {list(REQUEST_KEYS)}")
    unknown = [k for k in request if k not in REQUEST_KEYS]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), REQUEST_KEYS, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ProtocolError(f"request[{unknown[0]!r}]", "is not a request key", f"{hint}use keys from {list(REQUEST_KEYS)}")
    image_key, image = _one_of(request, IMAGE_KEYS)
    if "images" in request:
        if image is not None:
            raise ProtocolError("request['images']", f"given together with {image_key!r}", "send only one of them")
        image = _camera_views(request["images"], camera_keys)
    elif image is None:
        raise ProtocolError("request['image']", "is missing",
                            f"send `images` = {{camera: uint8 [H, W, 3]}} for cameras {camera_keys} or `observation/image`")
    where = "request['images']" if "images" in request else f"request[{image_key!r}]"
    image = fit_camera_sizes(image, where, camera_keys, camera_sizes, resize)
    state_key, state = _one_of(request, STATE_KEYS)
    if use_state:
        if state is None:
            raise ProtocolError("request['state']", "is missing", "send the robot state (`state` or `observation/state`) in raw units")
        if not isinstance(state, (np.ndarray, list, tuple)) or isinstance(state, np.ndarray) and state.dtype.kind not in "iuf":
            raise ProtocolError(f"request[{state_key!r}]", f"must be a numeric array, got {type(state).__name__}")
    seed = request.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**63):
        raise ProtocolError("request['seed']", f"must be a non-negative int, got {seed!r}")
    obs = {"image": image, "state": state, "prompt": request.get("prompt"), **{k: request[k] for k in RTC_KEYS if k in request}}
    return obs, None if seed is None else int(seed)


def _camera_views(images: Any, camera_keys: list[str]) -> list[np.ndarray]:
    if not isinstance(images, Mapping):
        raise ProtocolError("request['images']", f"must be a dict {{camera_key: image}}, got {type(images).__name__}")
    by_name: dict[str, Any] = {}
    for key, value in images.items():
        matches = [c for c in camera_keys if key in (c, camera_name(c))]
        if not matches:
            raise ProtocolError(f"request['images'][{key!r}]", f"is not a camera of this model {camera_keys}",
                                "send exactly the model's cameras (full key or its last part)")
        if matches[0] in by_name:
            raise ProtocolError(f"request['images'][{key!r}]", f"camera {matches[0]!r} given twice")
        by_name[matches[0]] = value
    missing = [c for c in camera_keys if c not in by_name]
    if missing:
        raise ProtocolError(f"request['images'][{missing[0]!r}]", "is missing", f"send every camera of {camera_keys}")
    views = []
    for cam in camera_keys:
        view = by_name[cam]
        if not isinstance(view, np.ndarray) or view.ndim != 3 or view.shape[-1] != 3 or view.dtype != np.uint8:
            desc = f"{view.dtype} {tuple(view.shape)}" if isinstance(view, np.ndarray) else type(view).__name__
            raise ProtocolError(f"request['images'][{cam!r}]", f"is {desc}, expected a uint8 array [H, W, 3]")
        views.append(view)
    return views  # the policy composes them exactly as training did, whatever their sizes


def _rename(exc: PolicyInputError) -> ProtocolError:
    where = exc.where.replace("observations[0]", "request")
    return ProtocolError(where, exc.problem, exc.fix)


# ---- batched inference ------------------------------------------------------------------------

def predict_batch(policy: Policy, observations: list[dict], seeds: list[int], num_steps: int | None = None
                  ) -> list[np.ndarray | Exception]:
    """Raw action chunks for several observations with ONE sampling call per frame size.

    Each observation gets its own generator seeded with its seed, so a request's actions do not
    depend on which other requests share its batch (equal to `policy.predict([obs], seed)` up to
    float reordering). Invalid observations get their exception; the rest still run."""
    results: list[np.ndarray | Exception | None] = [None] * len(observations)
    groups: dict[tuple, list[tuple[int, Any]]] = {}
    for i, obs in enumerate(observations):
        try:
            inp = policy.prepare([obs])[0]
        except PolicyInputError as exc:
            results[i] = _rename(exc)
            continue
        groups.setdefault(tuple(inp.frame.shape), []).append((i, inp))
    for members in groups.values():
        try:
            normalized = policy.sample([inp for _, inp in members], [torch.Generator().manual_seed(seeds[i]) for i, _ in members], num_steps)
            raw = policy.action_normalizer.denormalize(normalized[..., : policy.action_dim].double().cpu())
            for (i, _), chunk in zip(members, raw):
                results[i] = chunk.numpy().astype(np.float32)
        except Exception as exc:  # a failing batch must not take the server down
            log.exception("inference failed")
            for i, _ in members:
                results[i] = exc
    return results  # type: ignore[return-value]


def graphs_note(policy) -> str:
    """What the warm-up captured, for the ready line: ', N CUDA graphs captured; whole-forward graphs on'."""
    if not getattr(policy, "graph_captures", 0):
        return ""
    whole = getattr(policy, "forward_graphs", None)
    if whole is None:
        state = "off"
    elif whole.failure:
        state = f"off, capture failed: {whole.failure}"
    else:
        state = "on"
    return f", {policy.graph_captures} CUDA graphs captured; whole-forward graphs {state}"


def metadata(policy: Policy, num_steps: int, seed: int, max_request_bytes: int, batch_window_ms: float) -> dict:
    """The dict sent on connect: what a client needs to build requests and read replies."""
    c = policy.contract
    return {
        "server": "wamkit", "protocol": PROTOCOL,
        "action_dim": policy.action_dim, "chunk_length": policy.chunk_length, "fps": policy.fps,
        "camera_keys": policy.camera_keys, "state_dim": policy.state_dim, "use_state": policy.use_state,
        "state_key": c.get("state_key"), "action_key": c.get("action_key"),
        "max_action_dim": policy.max_action_dim, "domain_name": c.get("domain_name"), "domain_id": int(c["domain_id"]),
        "prompt_template": c["prompt_template"], "num_steps": int(num_steps), "guidance": policy.guidance, "seed": int(seed),
        "spatial_factor": int(getattr(policy.video_tokenizer, "spatial_factor", 1)),
        "max_request_bytes": int(max_request_bytes), "batch_window_ms": float(batch_window_ms),
        "request_keys": list(REQUEST_KEYS), "source": dict(policy.loaded.source),
        "rtc_max_guidance": policy.rtc_max_guidance,
    }


@dataclasses.dataclass
class _Pending:
    obs: dict
    seed: int
    future: asyncio.Future
    enqueued: float


@dataclasses.dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    batch_window_ms: float = 5.0
    max_batch: int = 16
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    num_steps: int | None = None  # None: the policy's own num_steps
    seed: int = 0
    max_requests: int | None = None  # stop after this many requests (tests, benchmarks)
    warmup: bool | None = None  # run every batch size once before /healthz says ok; None: on when serving on CUDA
    warmup_size: tuple[int, int] | None = None  # camera frame size for the warm-up; None: the data contract's
    resize_images: bool = False  # views of another size than the training cameras': refused (False) or resized
    stats_every_s: float = 60.0  # a line of request counts and latency percentiles this often (0: never)


class PolicyServer:
    """Serve `policy`. `serve()` runs until `stop()`; `start_in_thread()` runs it in a daemon thread."""

    def __init__(self, policy: Policy, config: ServeConfig | None = None, **overrides):
        self.policy = policy
        self.config = dataclasses.replace(config or ServeConfig(), **overrides)
        if self.config.max_request_bytes < 1024:
            raise WamkitError("--max-request-bytes", f"is {self.config.max_request_bytes}", "allow at least 1024 bytes")
        if self.config.batch_window_ms < 0 or self.config.max_batch < 1:
            raise WamkitError("--batch-window-ms / max_batch", "must be >= 0 and >= 1")
        self.num_steps = int(self.config.num_steps or policy.num_steps)
        self.predict_batch: Callable[..., list] = predict_batch  # replaceable (tests count calls)
        self.stats = {"requests": 0, "errors": 0, "batches": 0, "max_batch_size": 0}
        self.activity = RequestLog()
        self.camera_sizes = contract_sizes(policy.contract, policy.camera_keys)
        self.stop_reason = "stopped"
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._queue: asyncio.Queue | None = None
        self._connections = 0  # open websocket connections: each has at most one request in flight
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.warmed_up = threading.Event()  # /healthz answers 503 until it is set
        self.warmup_seconds: list[tuple[int, float]] = []
        self._error: BaseException | None = None
        self._metadata = packb(metadata(policy, self.num_steps, self.config.seed, self.config.max_request_bytes,
                                        self.config.batch_window_ms))

    # ---- lifecycle ----------------------------------------------------------------------------
    async def serve(self) -> None:
        from websockets.asyncio.server import serve

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._queue = asyncio.Queue()
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="wamkit-infer")
        batcher = asyncio.create_task(self._batch_loop(executor))
        reporter = asyncio.create_task(self._report_loop())
        self._stop_on_signals()
        for line in startup_summary(self.policy, self.num_steps, self.camera_sizes, self.config.resize_images):
            log.info(line)
        try:
            async with serve(self._handle, self.config.host, self.config.port, process_request=self._process_request,
                             max_size=HARD_LIMIT_FACTOR * self.config.max_request_bytes, compression=None) as server:
                self.port = server.sockets[0].getsockname()[1]
                log.info("wamkit serve: listening on ws://%s:%d (healthz: http://%s:%d/healthz)",
                         self.config.host, self.port, self.config.host, self.port)
                self._ready.set()
                await self._warm_up(executor)
                await self._stop.wait()
        finally:
            batcher.cancel()
            reporter.cancel()
            executor.shutdown(wait=True)
            self._ready.set()
            log.info(self.activity.final(self.stop_reason))

    def _stop_on_signals(self) -> None:
        """SIGTERM (an orchestrator's stop) and Ctrl-C end `serve()` cleanly, with a last line; only the
        main thread may install handlers (a server in a thread is stopped with `stop()`)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._stop_for, signal.Signals(sig).name)

    def _stop_for(self, reason: str) -> None:
        self.stop_reason = reason
        self._stop.set()

    async def _report_loop(self) -> None:
        if self.config.stats_every_s <= 0:
            return
        while True:
            await asyncio.sleep(self.config.stats_every_s)
            line = self.activity.report()
            if line:
                log.info(line)

    def _warmup_sizes(self) -> list[tuple[int, int]] | None:
        """Camera sizes to warm up with, or None for no warm-up (off, or sizes unknown on auto)."""
        from wamkit.serve.warmup import camera_sizes

        wanted = self.config.warmup
        if wanted is None:
            wanted = self.policy.device.type == "cuda"
        if not wanted:
            return None
        sizes = camera_sizes(self.policy, self.config.warmup_size)
        if sizes is None:
            if self.config.warmup:
                raise WamkitError("wamkit serve --warmup", "the data contract records no camera sizes (a run trained before they were recorded)",
                                  "pass --warmup-size HxW (the cameras' training frame size)")
            log.warning("wamkit serve: no warm-up (camera sizes unknown); pass --warmup-size HxW to warm up")
        return sizes

    async def _warm_up(self, executor) -> None:
        """Every batch size once, on the inference thread, before /healthz turns 200."""
        from wamkit.serve.warmup import warm_up

        sizes = self._warmup_sizes()
        if sizes is not None:
            self.warmup_seconds = await self._loop.run_in_executor(
                executor, warm_up, self.policy, self.predict_batch, self.config.max_batch, self.num_steps, sizes)
            log.info("wamkit serve: ready (warm-up of %d batch sizes took %.1f s%s)", len(self.warmup_seconds),
                     sum(s for _, s in self.warmup_seconds), graphs_note(self.policy))
        self.warmed_up.set()

    def stop(self) -> None:
        """Ask the server to stop; a no-op once it has stopped by itself (max_requests, a signal), whose loop is closed."""
        if self._loop is None or self._stop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._stop_for, "stop() called")
        except RuntimeError:  # "Event loop is closed": it closed after the server stopped itself, maybe just now
            if not self._loop.is_closed():
                raise

    def start_in_thread(self, timeout: float = 30.0) -> "PolicyServer":
        def run():
            try:
                asyncio.run(self.serve())
            except BaseException as exc:  # surfaced by start_in_thread / join
                self._error = exc
                self._ready.set()

        self._thread = threading.Thread(target=run, name="wamkit-serve", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self.port is None:
            raise WamkitError("wamkit serve", f"did not start: {self._error!r}", "check the host/port")
        return self

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- HTTP and websocket handlers ------------------------------------------------------------
    def _process_request(self, connection, request):
        if request.path == "/healthz":
            if not self.warmed_up.is_set():
                return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "warming up\n")
            return connection.respond(HTTPStatus.OK, "ok\n")
        if request.path == "/stats":
            return connection.respond(HTTPStatus.OK, stats_json(self))
        return None

    async def _handle(self, websocket) -> None:
        from websockets.exceptions import ConnectionClosed

        self._connections += 1
        try:
            await websocket.send(self._metadata)
            async for message in websocket:
                received = time.perf_counter()
                reply = await self._answer(message, received, websocket.remote_address)
                await websocket.send(reply)
                self.stats["requests"] += 1
                if self.config.max_requests is not None and self.stats["requests"] >= self.config.max_requests:
                    self._stop_for(f"max_requests={self.config.max_requests} reached")
                    break
        except ConnectionClosed:
            pass
        finally:
            self._connections -= 1

    async def _answer(self, message, received: float, peer=None) -> bytes | str:
        try:
            if isinstance(message, str):
                raise ProtocolError("request", "is a text message", "send msgpack bytes (openpi_client.msgpack_numpy.packb)")
            if len(message) > self.config.max_request_bytes:
                raise ProtocolError("request", f"is {len(message)} bytes, over the server's limit of "
                                    f"{self.config.max_request_bytes} bytes (--max-request-bytes)",
                                    "send smaller images (the training resolution) or raise --max-request-bytes")
            obs, seed = observation_from_request(unpackb(message), self.policy.camera_keys, self.policy.use_state,
                                                 self.camera_sizes, self.config.resize_images)
            future = self._loop.create_future()
            await self._queue.put(_Pending(obs, self.config.seed if seed is None else seed, future, received))
            result, infer_ms, batch_size = await future
            if isinstance(result, BaseException):
                raise result
        except Exception as exc:
            self.stats["errors"] += 1
            self.activity.failed()
            text = error_text(exc)
            client = f" from {peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""
            log.warning("wamkit serve: request%s refused: %s", client, text.removeprefix("wamkit serve error: ").replace("\n  ", " | "))
            return text
        total_ms = (time.perf_counter() - received) * 1e3
        self.activity.answered(total_ms)
        return packb({"action": result, "server_timing": {"infer_ms": infer_ms, "total_ms": total_ms, "batch_size": batch_size}})

    async def _batch_loop(self, executor) -> None:
        window = self.config.batch_window_ms / 1e3
        while True:
            batch = [await self._queue.get()]
            deadline = self._loop.time() + window
            # complete when every open connection has its request in (a connection sends one at a time)
            while len(batch) < min(self.config.max_batch, max(1, self._connections)):
                if not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                    continue
                remaining = deadline - self._loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            start = time.perf_counter()
            try:
                results = await self._loop.run_in_executor(
                    executor, self.predict_batch, self.policy, [p.obs for p in batch], [p.seed for p in batch], self.num_steps)
            except Exception as exc:
                results = [exc] * len(batch)
            infer_ms = (time.perf_counter() - start) * 1e3
            self.stats["batches"] += 1
            self.stats["max_batch_size"] = max(self.stats["max_batch_size"], len(batch))
            for pending, result in zip(batch, results):
                if not pending.future.done():
                    pending.future.set_result((result, infer_ms, len(batch)))


# ---- entry point ------------------------------------------------------------------------------

def serve_main(path: str | Path, host: str = "127.0.0.1", port: int = 8000, num_steps: int = 10, seed: int = 0,
               batch_window_ms: float = 5.0, max_batch: int = 16, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               device: str = "cpu", warmup: bool | None = None, warmup_size: tuple[int, int] | None = None,
               resize_images: bool = False, stats_every_s: float = 60.0, fp8: bool = False, dtype: str = "auto",
               noise_scale: float = 1.0) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # no line per connection / health check
    policy = load_policy(path, device=device, num_steps=num_steps, dtype=dtype, noise_scale=noise_scale)
    if fp8:
        log.info("wamkit serve: FP8 matmuls in %d generation-pathway linear layers", policy.use_fp8_matmuls())
    server = PolicyServer(policy, ServeConfig(host=host, port=port, batch_window_ms=batch_window_ms, max_batch=max_batch,
                                              max_request_bytes=max_request_bytes, num_steps=num_steps, seed=seed,
                                              warmup=warmup, warmup_size=warmup_size, resize_images=resize_images,
                                              stats_every_s=stats_every_s))
    asyncio.run(server.serve())  # SIGTERM / Ctrl-C end it cleanly (PolicyServer._stop_on_signals)
    return 0


def server_stats(server: PolicyServer) -> dict:
    """What `GET /stats` answers (JSON): the request counters, whether warm-up is done, the weights'
    dtype, and this process's memory: the CUDA allocator's bytes on the model's GPU and host RSS.
    benchmarks/serve_export.py reads it each minute of a soak to judge memory flatness."""
    param = next(server.policy.model.parameters())
    stats: dict = {**server.stats, "ready": server.warmed_up.is_set(), "dtype": str(param.dtype).removeprefix("torch."),
                   "fp8_linears": getattr(server.policy, "fp8_linears", 0)}
    if param.is_cuda:
        stats.update(cuda_allocated_bytes=torch.cuda.memory_allocated(param.device),
                     cuda_reserved_bytes=torch.cuda.memory_reserved(param.device),
                     cuda_max_allocated_bytes=torch.cuda.max_memory_allocated(param.device))
    try:
        with open("/proc/self/status") as f:
            stats["rss_bytes"] = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        pass
    return stats


def stats_json(server: PolicyServer) -> str:
    import json  # here, not at the top: keeps this addition in one place of the file

    return json.dumps(server_stats(server)) + "\n"
