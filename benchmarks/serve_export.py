"""`wamkit serve EXPORT` measured as a robot uses it (issue 30): the product path, not the harness.

    python benchmarks/serve_export.py --preset nano --export /tmp/wamkit_nano_export --parts latency,bad,inprocess
    python benchmarks/serve_export.py --preset nano --export /tmp/wamkit_nano_export --parts "" --soak-minutes 8
    python benchmarks/serve_export.py --preset tiny --device cpu --image-size 32 ...        # CPU (tests)
    bash benchmarks/serve_export_device.sh latency|soak                                    # the two H200 calls

It makes a random-weight export once (benchmarks/g1_export.py: the files `wamkit export` writes, the
G1 shape: chunk 32 x 36-D actions, 32-D state, one camera of --image-size (256: the 256p tier),
--text-tokens prompt tokens). A run's checkpoint loads in float32, so `wamkit export` of a real Nano
run writes 61 GB; this one is written in bf16 (30 GB, --export-dtype), which the host's 64 GB disk
holds and which the export loader serves in bf16. An existing export (wamkit.json present) is reused.

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
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from g1_export import check_reusable, dir_gib, make_export  # noqa: E402
from serve_load import T0, ServerProcess, bad_requests, connect, log, pct, run_clients, soak  # noqa: E402

PARTS = ("inprocess", "latency", "bad", "soak")


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


# ---- the in-process harness row -----------------------------------------------------------------

def fp8_against_bf16(policy, size: int) -> str:
    """Quantize the policy (Policy.use_fp8_matmuls) between two predictions of the same observation
    and seed: how far FP8 moves a chunk, in the units the policy samples (normalized actions)."""
    from serve_latency import observation

    rng = np.random.default_rng(0)
    o = observation({"camera_keys": policy.camera_keys, "state_dim": policy.state_dim}, rng, size)
    obs = [{"image": np.stack(list(o["images"].values())), "state": o["state"], "prompt": o["prompt"]}]
    plain = policy.predict_normalized(obs, seed=1)
    layers = policy.use_fp8_matmuls()
    fp8 = policy.predict_normalized(obs, seed=1)
    rel = float((fp8 - plain).float().norm() / plain.float().norm())
    return f"FP8 ({layers} layers) against bf16, one chunk, same seed: relative difference {rel:.4f} (normalized actions)"


def inprocess_rows(args, model, vae, left, notes: list) -> list[dict]:
    """benchmarks/serve_latency.py's path: PolicyServer in this process, its client, same levels."""
    import torch

    from serve_latency import measure, random_weight_policy
    from wamkit.serve import PolicyServer

    if vae is None:
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(str(args.export.parent / f"{args.export.name}_vae"))
    vae = vae.to(args.device, torch.bfloat16)
    policy = random_weight_policy(args.preset, args.device, args.num_steps, args.text_tokens, True, True, True, model=model, vae=vae)
    if args.fp8:  # the server process's --fp8, here too, after one chunk in bf16 to compare against
        rep_note = fp8_against_bf16(policy, args.image_size)
        log(rep_note)
        notes.append(rep_note)
    server = PolicyServer(policy, host="127.0.0.1", port=0, num_steps=args.num_steps, batch_window_ms=5.0,
                          max_batch=max(args.clients), warmup_size=(args.image_size, args.image_size)).start_in_thread()
    server.warmed_up.wait(600)  # every batch size up to max_batch, as `wamkit serve` warms up before /healthz says 200
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
        rows += whole_forward_ab(policy, server, args, left, notes)
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


def whole_forward_ab(policy, server, args, left, notes: list) -> list[dict]:
    """The A/B of whole-forward CUDA graphs (wamkit.model.cuda_graphs.ForwardGraphs): what they
    captured (or why not), then one client again with the decoder-stack graphs alone."""
    from serve_latency import measure

    graphs = policy.forward_graphs
    if graphs is None:
        return []
    note = (f"whole-forward CUDA graphs: {graphs.captures} captured" +
            (f"; capture failed, off: {graphs.failure}" if graphs.failure else ""))
    log(note)
    notes.append(note)
    if graphs.failure or left() < 60:
        return []
    graphs.remove()
    policy.forward_graphs = None
    measure(server.port, 1, args.warmup_requests, args.image_size)
    t = time.perf_counter()
    lat, sizes = measure(server.port, 1, args.requests, args.image_size)
    log(f"in-process, 1 client, decoder-stack graphs only: p50 {pct(lat, 50):.1f} ms")
    return [dict(path="in-process harness, decoder-stack graphs only (A/B)", clients=1, fields="plain", requests=len(lat),
                 first=None, p50=pct(lat, 50), p99=pct(lat, 99), infer=None, batch=float(np.mean(sizes)),
                 rate=len(lat) / (time.perf_counter() - t), errors=0)]


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
    p.add_argument("--fp8", action="store_true", help="serve (and run the in-process harness) with FP8 matmuls (`wamkit serve --fp8`)")
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


def fp8_note(stats: dict) -> str:
    return f" with FP8 matmuls in {stats['fp8_linears']} generation-pathway linear layers" if stats.get("fp8_linears") else ""


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
        model, vae = make_export(args.export, args.preset, args.device, args.export_dtype, args.image_size, args.text_tokens, log)
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
            server = ServerProcess(args.export, args.device, args.num_steps, max(args.clients), args.log_dir / "wamkit_serve.log", args.fp8)
            server.wait_ready(min(args.startup_timeout, max(left() - 10, 30)))
            stats = server.stats()
            rep.notes.append(f"server: own process, listening after {fmt(server.listening_s)} s, /healthz 200 after {fmt(server.ready_s)} s; "
                             f"weights {stats.get('dtype')}{fp8_note(stats)}, CUDA allocated {gib(stats.get('cuda_allocated_bytes'))} GiB / reserved "
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
                rep.rows += inprocess_rows(args, model, vae, left, rep.notes)
        model = vae = None
        if "soak" in args.parts:
            minutes = args.soak_minutes or 1
            fit = (left() - 20) / args.soak_minute_s
            if fit < minutes:
                rep.notes.append(f"soak shortened from {minutes} to {max(fit, 0):.2f} minutes: budget")
                minutes = fit
            if minutes >= 0.5:
                soak(server, max(args.clients), minutes, args.soak_minute_s, args.image_size, rtc if args.soak_rtc else None, rep.soak)
                rep.failed += [f"soak minute {r['minute']}: {r['errors']} errors (the first of the soak: {r['first_error']})"
                               for r in rep.soak if r["errors"]]
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
                rep.failed.append(f"{timed.errors} failed requests at {clients} clients {fields}; the first: {timed.first_error}")


def bad_part(args, server, rtc, rep: Report) -> None:
    meta = connect(server.port)
    limit = int(meta.get_server_metadata()["max_request_bytes"])
    meta._ws.close()
    errors_before = server.stats().get("errors", 0)
    bad_requests(server.port, args.image_size, limit, rtc, rep.bad)
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
    print("\n(first ms: on a 1-client row of the export, its first request: the plain row's comes right after /healthz turned 200,\n"
          "the RTC row's is the first request with real-time-chunking fields; p50/p99 are over the requests after it)")
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
        print(f"serve_p50_ms{'_fp8' if args.fp8 else ''}={row['p50']:.1f}")


def serve_row(rep: Report) -> dict | None:
    return next((r for r in rep.rows if r["path"] == SERVE_PATH and r["clients"] == 1 and r["fields"] == "plain"), None)


def main(argv=None) -> int:
    args = parse_args(argv)
    rep = Report(header=host_line(args.device, args.kind) + ("; FP8 matmuls in the generation pathway (--fp8), every row" if args.fp8 else ""))
    log(rep.header)

    def on_term(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGTERM, on_term)
    try:
        run_parts(args, rep)
    except Interrupted:
        rep.failed.append("interrupted by SIGTERM (the call's time limit?): what was measured is below")
    except (Exception, SystemExit) as exc:  # noqa: BLE001  reported with what was measured before it
        traceback.print_exc()
        rep.failed.append(f"stopped by {type(exc).__name__}: {exc}")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    (args.log_dir / "serve_export_results.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **dataclasses.asdict(rep)}, indent=2, default=str))
    print_report(args, rep)
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
