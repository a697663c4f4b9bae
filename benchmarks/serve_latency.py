"""Latency of `wamkit serve` per action chunk, for 1 and 8 concurrent clients.

    python benchmarks/serve_latency.py [--export DIR] [--requests 20] [--clients 1,8] [--num-steps 10]

Without --export it trains and exports the tiny demo policy in a temporary directory first (~10 s on
CPU). The server runs in this process on 127.0.0.1 (ephemeral port); every client is a websocket
connection (openpi-client when installed, else the same protocol from wamkit.serve.protocol) that
sends N requests back to back. Prints a markdown table of client-side latency per chunk."""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def tiny_export(tmp: Path) -> Path:
    from wamkit.config import load_experiment
    from wamkit.data import write_demo_dataset
    from wamkit.export import export_run
    from wamkit.train.trainer import Trainer

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "demo_tiny.toml"
    root = write_demo_dataset(tmp / "reach", num_episodes=8)
    overrides = {
        "job.name": '"bench"', "job.output_root": f'"{tmp}"', "data.path": f'"{root}"', "data.generate_demo": "false",
        "trainer.max_iter": "4", "checkpoint.save_iter": "4", "trainer.samples_per_step": "2",
        "trainer.progress_bar": "false", "trainer.val_every": "0", "scheduler.warm_up_steps": "[1]",
    }
    Trainer(load_experiment(recipe, [f"{k}={v}" for k, v in overrides.items()])).train()
    return export_run(tmp / "bench", tmp / "export")


def random_weight_policy(preset: str, device: str, num_steps: int, text_tokens: int,
                         cache_text: bool, cuda_graphs: bool, compile_pointwise: bool, model=None, vae=None):
    """A policy of a preset's real shape with random weights (G1-like contract: chunk 32, 36-D
    action, 32-D state, 50 fps, 256p tier, `text_tokens` prompt tokens — the reference G1 shape has
    256) and a randomly initialised Wan2.2-layout VAE, in bf16: what latency at Nano width needs
    without downloading weights. `model` / `vae`: use these (e.g. the ones benchmarks/serve_export.py
    just exported) instead of building new ones."""
    import torch
    from diffusers import AutoencoderKLWan

    from wamkit.data import Normalizer
    from wamkit.model.cosmos3 import build_transformer
    from wamkit.model.tokenizer import WAN22_VAE_LAYOUT, ByteTokenizer, WanTokenizer
    from wamkit.policy import Policy
    from wamkit.policy.loading import LoadedModel

    dtype = torch.bfloat16
    with torch.device(device):
        if model is None:
            model = build_transformer(preset, latent_channel=48, max_action_dim=36, num_domains=32).to(dtype).eval().requires_grad_(False)
        if vae is None:
            vae = AutoencoderKLWan(**WAN22_VAE_LAYOUT, latents_mean=[0.0] * 48, latents_std=[1.0] * 48).to(dtype)
    bounds = {"min": np.full(36, -1.0), "max": np.full(36, 1.0)}
    state_bounds = {"min": np.full(32, -1.0), "max": np.full(32, 1.0)}
    contract = {
        "fps": 50.0, "chunk_length": 32, "camera_keys": ["observation.images.ego_view"], "action_dim": 36, "state_dim": 32,
        "use_state": True, "max_action_dim": 36, "domain_id": 24, "domain_name": "g1_simple",
        "prompt_template": "{task} " + "." * text_tokens,  # padded; the tokenizer truncates to text_tokens
        "action_normalizer": Normalizer.from_stats({"action": bounds}, "action", "minmax").state_dict(),
        "state_normalizer": Normalizer.from_stats({"observation.state": state_bounds}, "observation.state", "minmax").state_dict(),
        "canvas": {"camera_layout": "side_by_side", "resolution": 256, "wrist_index": 0},
    }
    loaded = LoadedModel(model=model, video_tokenizer=WanTokenizer(vae), text_tokenizer=ByteTokenizer(text_tokens), contract=contract,
                         model_info={"preset": preset}, diffusion={"shift": 5.0}, source={"weights": "random"})
    on_cuda = device.startswith("cuda")
    return Policy(loaded, num_steps=num_steps, cache_text=cache_text, cuda_graphs=cuda_graphs and on_cuda,
                  compile_pointwise=compile_pointwise and on_cuda)


class _Client:
    def __init__(self, port: int):
        try:
            from openpi_client.websocket_client_policy import WebsocketClientPolicy

            self._client = WebsocketClientPolicy("127.0.0.1", port)
            self.metadata = self._client.get_server_metadata()
            self.infer = self._client.infer
            self.close = self._client._ws.close
        except ImportError:
            import websockets.sync.client

            from wamkit.serve.protocol import packb, unpackb

            self._ws = websockets.sync.client.connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None)
            self.metadata = unpackb(self._ws.recv())

            def infer(obs):
                self._ws.send(packb(obs))
                reply = self._ws.recv()
                if isinstance(reply, str):
                    raise RuntimeError(reply)
                return unpackb(reply)

            self.infer = infer
            self.close = self._ws.close


PROMPT = "move to the green target"


def observation(meta: dict, rng: np.random.Generator, size: int, prompt: str = PROMPT) -> dict:
    images = {cam: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for cam in meta["camera_keys"]}
    return {"images": images, "state": rng.uniform(0.2, 0.8, meta["state_dim"]), "prompt": prompt}


def measure(port: int, clients: int, requests: int, size: int) -> tuple[list[float], list[int]]:
    conns = [_Client(port) for _ in range(clients)]
    latencies: list[float] = []
    batch_sizes: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def run(i: int) -> None:
        rng = np.random.default_rng(i)
        obs = [observation(conns[i].metadata, rng, size) for _ in range(requests)]
        barrier.wait()
        for o in obs:
            start = time.perf_counter()
            reply = conns[i].infer(o)
            elapsed = (time.perf_counter() - start) * 1e3
            with lock:
                latencies.append(elapsed)
                batch_sizes.append(int(reply["server_timing"]["batch_size"]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    return latencies, batch_sizes


class _PhaseTimer:
    """Wall time of the tokenizer encode and of each transformer forward inside Policy.predict,
    synchronising the device around each so the phases add up (benchmark-only instrumentation)."""

    def __init__(self, policy):
        import torch

        self.sync = torch.cuda.synchronize if next(policy.model.parameters()).is_cuda else (lambda: None)
        self.totals: dict[str, list[float]] = {"encode": [], "forward": []}
        self._wrap(policy.video_tokenizer, "encode", "encode")
        self._wrap(policy.model, "forward", "forward")

    def _wrap(self, owner, method: str, phase: str) -> None:
        inner = getattr(owner, method)

        def timed(*args, **kwargs):
            self.sync()
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            self.sync()
            self.totals[phase].append((time.perf_counter() - start) * 1e3)
            return out

        setattr(owner, method, timed)


def profile_predict(policy, size: int, requests: int, warmup: int, batch: int = 1) -> None:
    """Where one chunk's time goes (no server): encode, the denoising forwards, and the rest
    (packing, masks, normalisation, host<->device copies), then on CUDA the GPU's busy share of the
    wall time (a latency-bound predict is mostly idle GPU), the top GPU kernels and the top host ops.
    `batch` observations per predict, as batched closed-loop evaluation sends them."""
    import torch

    meta = {"camera_keys": policy.camera_keys, "state_dim": policy.state_dim}
    rng = np.random.default_rng(0)
    obs = [[observation(meta, rng, size) for _ in range(batch)] for _ in range(requests + warmup)]

    def as_policy_obs(group):
        return [{"image": np.stack(list(o["images"].values())), "state": o["state"], "prompt": o["prompt"]} for o in group]

    for group in obs[:warmup]:
        policy.predict(as_policy_obs(group))
    timer = _PhaseTimer(policy)
    totals = []
    for group in obs[warmup:]:
        timer.sync()
        start = time.perf_counter()
        policy.predict(as_policy_obs(group))
        timer.sync()
        totals.append((time.perf_counter() - start) * 1e3)
    n = len(totals)
    encode, forward = sum(timer.totals["encode"]) / n, sum(timer.totals["forward"]) / n
    if policy.graphs is not None:  # same seed through the plain decoder stack: the graphs must not change the result
        fast = policy.predict_normalized(as_policy_obs(obs[0]), seed=1)
        whole = policy.forward_graphs
        captures = (f"whole-forward {whole.captures}" + (f" (capture failed: {whole.failure})" if whole.failure else "")
                    if whole is not None else "whole-forward off") + f", decoder-stack {policy.graphs.captures}"
        policy.disable_cuda_graphs()
        plain = policy.predict_normalized(as_policy_obs(obs[0]), seed=1)
        print(f"CUDA graphs captured: {captures}; max |graphs - plain| over the chunk: {float((fast - plain).abs().max()):.3g}"
              f" (normalized actions, std {float(plain.std()):.3g})")
    total = float(np.median(totals))
    print(f"\n| phase (mean per chunk of {batch} observation(s), {n} chunks) | ms |\n| --- | ---: |")
    print(f"| tokenizer encode | {encode:.1f} |")
    print(f"| transformer forwards ({len(timer.totals['forward']) // n} per chunk) | {forward:.1f} |")
    print(f"| everything else | {float(np.mean(totals)) - encode - forward:.1f} |")
    print(f"| total (median) | {total:.1f} |")
    if torch.cuda.is_available() and next(policy.model.parameters()).is_cuda:
        from torch.profiler import ProfilerActivity, profile

        profiled = obs[warmup: warmup + 3]
        torch.cuda.synchronize()
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for group in profiled:
                policy.predict(as_policy_obs(group))
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / len(profiled)
        events = prof.key_averages()
        print(f"\n{gpu_busy_line(events, wall_ms, len(profiled))}")
        print(events.table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
        print("host side, by self CPU time:")
        print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


def gpu_busy_line(events, wall_ms: float, chunks: int) -> str:
    """How much of a chunk's wall time the GPU spent in kernels (under the profiler, which slows
    the host side a little): the split between arithmetic and everything the host makes it wait for."""
    from torch.autograd import DeviceType

    kernel_ms = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e3 / chunks
    launches = sum(e.count for e in events if e.device_type == DeviceType.CUDA) / chunks
    return (f"GPU kernels {kernel_ms:.1f} ms of {wall_ms:.1f} ms wall per chunk ({kernel_ms / wall_ms:.0%} busy), "
            f"{launches:.0f} kernels per chunk")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", help="export (or run) directory; default: train + export the tiny demo policy")
    parser.add_argument("--requests", type=int, default=20, help="requests per client")
    parser.add_argument("--clients", default="1,8", help="comma-separated concurrency levels")
    parser.add_argument("--num-steps", type=int, default=10)
    parser.add_argument("--batch-window-ms", type=float, default=5.0)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-preset", help="random-weight model of this preset (e.g. nano) with a Wan2.2-layout VAE, bf16")
    parser.add_argument("--text-tokens", type=int, default=256, help="prompt tokens of the --random-preset policy")
    parser.add_argument("--no-text-cache", action="store_true", help="run the text pathway at every denoising step")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="launch the decoder stack kernel by kernel")
    parser.add_argument("--no-compile-pointwise", action="store_true", help="leave the norms, MLPs and rotary uncompiled (CUDA)")
    parser.add_argument("--profile", action="store_true", help="time the phases of Policy.predict (no server) and list the top kernels")
    parser.add_argument("--profile-batch", type=int, default=1, help="observations per predict in --profile (batched closed-loop evaluation)")
    args = parser.parse_args(argv)

    from wamkit.serve import PolicyServer, load_policy

    with tempfile.TemporaryDirectory() as tmp:
        if args.random_preset:
            path = f"random {args.random_preset}"
            policy = random_weight_policy(args.random_preset, args.device, args.num_steps, args.text_tokens,
                                          not args.no_text_cache, not args.no_cuda_graphs, not args.no_compile_pointwise)
        else:
            path = Path(args.export) if args.export else tiny_export(Path(tmp))
            policy = load_policy(path, device=args.device, num_steps=args.num_steps)
            policy.cache_text = not args.no_text_cache
            if args.no_cuda_graphs:
                policy.disable_cuda_graphs()
        if args.profile:
            profile_predict(policy, args.image_size, args.requests, args.warmup, args.profile_batch)
            return 0
        server = PolicyServer(policy, host="127.0.0.1", port=0, num_steps=args.num_steps, batch_window_ms=args.batch_window_ms,
                              warmup_size=(args.image_size, args.image_size)).start_in_thread()
        server.warmed_up.wait(600)  # every batch size, as `wamkit serve` warms up before /healthz says 200
        try:
            levels = [int(c) for c in args.clients.split(",")]
            for clients in levels:  # every batch shape is compiled / captured before timing starts
                measure(server.port, clients, args.warmup, args.image_size)
            rows = []
            for clients in levels:
                t0 = time.perf_counter()
                lat, sizes = measure(server.port, clients, args.requests, args.image_size)
                wall = time.perf_counter() - t0
                rows.append((clients, len(lat), np.percentile(lat, 50), np.percentile(lat, 99), float(np.mean(sizes)), len(lat) / wall))
        finally:
            server.stop()
            server.join(30)
    meta_line = (f"model: {path if args.export or args.random_preset else 'tiny demo export'}, device {args.device}, "
                 f"denoising steps {args.num_steps}, chunk {policy.chunk_length}x{policy.action_dim}, "
                 f"image {args.image_size}x{args.image_size}, batch window {args.batch_window_ms} ms, "
                 f"text cache {'on' if policy.cache_text else 'off'}, CUDA graphs {'on' if policy.graphs else 'off'}")
    print(meta_line + "\n")
    print("| clients | requests | denoising steps | p50 ms/chunk | p99 ms/chunk | mean batch | chunks/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for clients, n, p50, p99, batch, rate in rows:
        print(f"| {clients} | {n} | {args.num_steps} | {p50:.1f} | {p99:.1f} | {batch:.2f} | {rate:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
