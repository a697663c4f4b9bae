"""The real training step, measured: `wamkit train` itself (loader, Wan2.2 VAE encode or the latent
cache, packed forward/backward, AdamW on fp32 master weights, EMA, logging) on the seed recipes, as
their usage lines run them, on schema-exact synthetic data at real camera sizes and a randomly
initialised Wan2.2-layout VAE saved with save_pretrained. BASE_CHECKPOINT_PATH is empty (random Nano
weights). Each run is stopped after --warmup + --steps logged steps (no checkpoint is written).

Prints per run: per-GPU samples/s and tokens/s, full-step MFU (the trainer's own metric: useful FLOPs
over the device's measured bf16 matmul rate; beside it, online, the same counting the VAE encoder's
FLOPs too), the activation checkpointing "auto" chose, the step split (data wait, VAE encode, forward+backward,
optimizer, EMA, other), peak memory of rank 0, graphs compiled after warm-up (recompiles), and launch
-> first finished step. The last line is `e2e_mfu_<recipe>=<x> ...`.

    python benchmarks/train_e2e.py --gpus 2 --recipes g1_simple droid       # nvidia-h200-x2
    python benchmarks/train_e2e.py --gpus 1 --recipes g1_simple --latent-cache
    python benchmarks/train_e2e.py --cpu-smoke                                # tiny recipes, CPU (tests)

DROID runs with trainer.grad_accum_iter=1 (its micro-batch unchanged): the seed's 8 accumulation
steps only multiply the step time, and a measurement needs several steps.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# recipe -> (synthetic schema, env vars naming the dataset, camera size H x W, extra --set for the benchmark)
RECIPES = {
    "g1_simple": ("g1_simple", ("SIMPLE_ROOT",), (480, 640), ()),
    "g1_simple_1gpu": ("g1_simple", ("SIMPLE_ROOT",), (480, 640), ("trainer.grad_accum_iter=1",)),
    "g1_simple_1gpu_full": ("g1_simple", ("SIMPLE_ROOT",), (480, 640), ("trainer.grad_accum_iter=1",)),  # GPU only (torchao)
    "droid": ("droid", ("DATASET_PATH",), (360, 640), ("trainer.grad_accum_iter=1",)),
    "droid_1gpu": ("droid", ("DATASET_PATH",), (360, 640), ("trainer.grad_accum_iter=1",)),
    "so101_fd_chunk16": ("so101", ("DATASET_PATH",), (480, 640), ("trainer.grad_accum_iter=1",)),
}
PHASES = ("data", "encode", "forward_backward", "optimizer", "ema", "other")


def prepare(work: Path, recipe: str, camera: tuple[int, int] | None, episodes: int) -> Path:
    from wamkit.sim.schema_synth import write_schema_dataset

    schema = RECIPES[recipe][0]
    root = work / f"data_{schema}_{'x'.join(map(str, camera)) if camera else 'tiny'}"
    if not root.exists():
        write_schema_dataset(schema, root, episodes=episodes, camera_size=camera)
    return root


def random_wan22_vae(work: Path) -> Path:
    """A Wan2.2-layout AutoencoderKLWan with random weights, saved in the diffusers format."""
    import torch
    from diffusers import AutoencoderKLWan

    from wamkit.model.tokenizer import WAN22_VAE_LAYOUT

    out = work / "wan22_vae_random"
    if not (out / "config.json").exists():
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            vae = AutoencoderKLWan(**WAN22_VAE_LAYOUT, latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
        vae.save_pretrained(out)
    return out


def run(recipe_path: str, gpus: int, env: dict, sets: list[str], run_dir: Path, total_steps: int, timeout: float, log: Path,
        wait_for_save: bool = False):
    """Launch `torchrun ... -m wamkit.cli train RECIPE`, stop it after `total_steps` logged steps
    (with `wait_for_save`, let it finish: its last step saves a checkpoint)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", "-m", "wamkit.cli",
           "train", recipe_path, *[a for s in sets for a in ("--set", s)]]
    metrics = run_dir / "metrics.jsonl"
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        while proc.poll() is None and time.perf_counter() - t0 < timeout:
            time.sleep(2)
            if not wait_for_save and metrics.exists() and len(metrics.read_text().splitlines()) >= total_steps:
                break
        stopped = proc.poll() is None
        if stopped:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return [r for r in records if "loss" in r], proc.returncode, stopped, time.perf_counter() - t0


def summarise(records: list[dict], warmup: int, log: Path) -> dict:
    timed = records[warmup:]
    if not timed:
        return {}
    med = lambda key: statistics.median(r[key] for r in timed if key in r) if any(key in r for r in timed) else float("nan")  # noqa: E731
    text = log.read_text()
    first = next((line for line in text.splitlines() if "first step done" in line), "")
    said = next((line for line in text.splitlines() if "[wamkit]" in line and "memory estimate " in line), "")
    estimate = float(said.split("memory estimate ")[1].split(" GiB")[0]) if said else float("nan")
    auto = said.split("activation checkpointing auto -> ")[1].split(";")[0] if "checkpointing auto -> " in said else ""
    out = {
        "steps": len(timed), "step_s": med("step_s"), "samples_per_s": med("samples_per_s"), "tokens_per_s": med("tokens_per_s"),
        "mfu": med("mfu"), "mfu_with_encode": med("mfu_with_encode"), "checkpointing_auto": auto, "peak_mem_gib": max((r.get("peak_mem_gib", float("nan")) for r in records), default=float("nan")),
        "recompiles": timed[-1]["compiled_graphs"] - records[warmup - 1]["compiled_graphs"] if warmup else 0,
        "first_step": first.split("first step done ")[-1].split(" after")[0] if first else "?",
        "loss_first_last": (records[0]["loss"], records[-1]["loss"]),
        "estimate_gib": estimate, "peak_reserved_gib": max((r.get("peak_reserved_gib", float("nan")) for r in records), default=float("nan")),
        "peak_at": {r["step"]: r.get("peak_mem_gib", float("nan")) for r in records},
    }
    step = sum(med(f"time_{p}_s") for p in PHASES)
    out["split"] = {p: med(f"time_{p}_s") / step for p in PHASES}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=["g1_simple", "droid"], choices=sorted(RECIPES))
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--steps", type=int, default=20, help="timed steps after warm-up")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the medians (compile, cudnn autotune)")
    p.add_argument("--episodes", type=int, default=6)
    p.add_argument("--latent-cache", action="store_true", help="tokenize once with `wamkit data cache-latents`, then train from the cache")
    p.add_argument("--save", action="store_true", help="save one checkpoint after the timed steps and report its size on disk")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="extra recipe overrides for every run")
    p.add_argument("--timeout", type=float, default=540, help="seconds per run")
    p.add_argument("--work", default="/tmp/wamkit_e2e")
    p.add_argument("--cpu-smoke", action="store_true", help="the recipes/tiny variants on the CPU (pixel tokenizer, tiny data)")
    args = p.parse_args(argv)

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    vae = "" if args.cpu_smoke else str(random_wan22_vae(work))
    capacity = _device_gib()
    rows, results = [], {}
    for recipe in args.recipes:
        schema, data_vars, camera, extra = RECIPES[recipe]
        root = prepare(work, recipe, None if args.cpu_smoke else camera, args.episodes)
        recipe_path = _recipe_path(recipe, args.cpu_smoke)
        env = {**os.environ, "WAN_VAE_PATH": vae, "BASE_CHECKPOINT_PATH": "", **{v: str(root) for v in data_vars},
               "WAMKIT_OUTPUT_ROOT": str(work / "runs"), "PYTHONUNBUFFERED": "1"}
        tag = f"e2e_{recipe}_{args.gpus}gpu{'_cache' if args.latent_cache else ''}"
        total = args.warmup + args.steps
        sets = [f'job.name="{tag}"', 'checkpoint.load_path=""', "trainer.log_every=1", "trainer.val_every=0",
                f"checkpoint.save_iter={total if args.save else 1000000}", f"trainer.max_iter={total if args.save else total + 1000}",
                *extra, *args.overrides]
        if args.cpu_smoke:
            sets += [f'data.path="{root}"']
        if args.latent_cache:
            cache = work / f"cache_{tag}"
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "wamkit.cli", "data", "cache-latents", recipe_path, "--out", str(cache),
                            *[a for s in sets for a in ("--set", s)]], env=env, cwd=REPO, check=not cache.exists())
            print(f"[{tag}] latent cache written in {time.perf_counter() - t0:.0f} s", flush=True)
            sets.append(f'data.latent_cache="{cache}"')
        run_dir = work / "runs" / tag
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        log = work / f"{tag}.log"
        records, rc, stopped, wall = run(recipe_path, args.gpus, env, sets, run_dir, total, args.timeout + (120 if args.save else 0),
                                         log, wait_for_save=args.save)
        summary = summarise(records, args.warmup, log)
        print(f"[{tag}] {len(records)} steps in {wall:.0f} s, rc={rc}{' (stopped after the timed steps)' if stopped else ''}; log {log}", flush=True)
        if not summary:
            print("\n".join(log.read_text().splitlines()[-25:]))
            rows.append(f"| {recipe} | {args.gpus} | {'cache' if args.latent_cache else 'online VAE'} | no timed steps (see log) |")
            continue
        s = summary
        s["checkpoint"] = _checkpoint_bytes(run_dir) if args.save else None
        split = " / ".join(f"{100 * s['split'][ph]:.0f}" for ph in PHASES)
        err = (s["estimate_gib"] - s["peak_mem_gib"]) / s["peak_mem_gib"]
        headroom = 1 - s["peak_reserved_gib"] / capacity if capacity else float("nan")
        steps = sorted(s["peak_at"])
        flat = f"{s['peak_at'][steps[min(len(steps) - 1, args.warmup)]]:.1f} -> {s['peak_at'][steps[-1]]:.1f}"
        ckpt = f"{s['checkpoint'] / 2**30:.2f}" if s["checkpoint"] is not None else "-"
        rows.append(f"| {recipe} | {args.gpus} | {'latent cache' if args.latent_cache else 'online VAE'} | {s['steps']} | {s['step_s']:.2f} | "
                    f"{s['samples_per_s']:.2f} | {s['tokens_per_s']:.0f} | {s['mfu']:.3f} | {_mfu_with_encode(s)} | {s['checkpointing_auto'] or '-'} | {split} | {s['peak_mem_gib']:.1f} | "
                    f"{s['estimate_gib']:.1f} ({100 * err:+.1f}%) | {100 * headroom:.0f}% | {flat} | {s['recompiles']} | {s['first_step']} | "
                    f"{ckpt} | {s['loss_first_last'][0]:.3f} -> {s['loss_first_last'][1]:.3f} |")
        results[(recipe, bool(args.latent_cache))] = {**s, "error": err}
    print("| recipe | GPUs | video | timed steps | step s | samples/s per GPU | tokens/s per GPU | full-step MFU | "
          "MFU incl. VAE encode FLOPs | activation checkpointing auto -> | "
          "split % data / encode / fwd+bwd / optim / EMA / other | peak GiB (rank 0) | --dry-run estimate GiB (error) | "
          f"headroom (reserved, of {capacity:.1f} GiB) | peak GiB first timed -> last step | recompiles after warm-up | launch -> first step | "
          "checkpoint GiB | loss first -> last |")
    print("| --- " * 19 + "|")
    print("\n".join(rows))
    if results:
        print(f"est_err_max={max(abs(v['error']) for v in results.values()):.3f} (the --dry-run estimate against the measured peak)")
    print(" ".join(f"e2e_mfu_{k[0]}{'_cache' if k[1] else ''}={v['mfu']:.3f}" for k, v in results.items()))
    return 0


def _mfu_with_encode(s: dict) -> str:
    """The step's utilisation counting the VAE encoder's FLOPs too (online runs; '-' from the cache)."""
    value = s.get("mfu_with_encode", float("nan"))
    return "-" if value != value else f"{value:.3f}"


def _recipe_path(recipe: str, cpu_smoke: bool) -> str:
    """The recipe as users run it; on the CPU its recipes/tiny variant."""
    if not cpu_smoke:
        return f"recipes/{recipe}.toml"
    return f"recipes/tiny/{recipe}.toml"


def _device_gib() -> float:
    try:
        import torch

        return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 0.0
    except Exception:  # noqa: BLE001 - a benchmark on a machine without CUDA
        return 0.0


def _checkpoint_bytes(run_dir: Path) -> int | None:
    """Bytes on disk of the run's latest checkpoint (every file of its iteration directory)."""
    latest = run_dir / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    iteration = run_dir / "checkpoints" / latest.read_text().strip()
    return sum(f.stat().st_size for f in iteration.rglob("*") if f.is_file())


if __name__ == "__main__":
    sys.exit(main())
