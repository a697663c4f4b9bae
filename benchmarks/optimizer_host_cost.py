"""What the step's optimizer phase costs on FSDP2's DTensors against their local shards (wamkit.train.local_shards):
gradient clipping, the fused AdamW step and the EMA lerp of a recipe's trainable tensors, on one rank. Prints a
table of milliseconds per call (mean of --calls after one warm-up, synchronised on a GPU) and the difference.

    python benchmarks/optimizer_host_cost.py                                  # the MT10 policy at tiny width, CPU
    python benchmarks/optimizer_host_cost.py --preset medium --device cuda    # the MT10 recipe as it trains on a GPU

On a GPU the kernels take well under a millisecond at MT10's size, so the column is the host's dispatch cost.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from wamkit.config import load_experiment  # noqa: E402
from wamkit.model.tokenizer import build_video_tokenizer  # noqa: E402
from wamkit.train.ema import EMA  # noqa: E402
from wamkit.train.local_shards import LocalShardAdamW, clip_grad_norm_, local  # noqa: E402
from wamkit.train.optim import build_optimizer  # noqa: E402
from wamkit.train.parallel import DistContext, parallel_dims, parallelize, run_mesh  # noqa: E402
from wamkit.train.setup import build_model  # noqa: E402


def sharded_model(recipe: str, preset: str, device: torch.device):
    cfg = load_experiment(recipe, [f"model.preset={preset}", "parallel.compile=false"])
    tokenizer = build_video_tokenizer(cfg.model.tokenizer, "", cfg.model.pixel_spatial_factor)
    model = build_model(cfg, tokenizer.latent_channels, device)
    mesh = run_mesh(DistContext(0, 1, 0, device), parallel_dims(cfg, 1))
    return parallelize(model, mesh, cfg), cfg


def ms_per_call(fn, calls: int, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e3


def dtensor_ema_update(ema: EMA, model, beta: float) -> None:
    """The EMA as it was before the local shards: one lerp over the DTensors."""
    pairs = [(ema.shadow[name], p.detach()) for name, p in model.named_parameters() if name in ema.shadow]
    torch._foreach_lerp_([s for s, _ in pairs], [p for _, p in pairs], 1.0 - beta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/metaworld_mt10.toml")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    device = torch.device(args.device)
    model, cfg = sharded_model(args.recipe, args.preset, device)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    ours = build_optimizer(model, cfg.optimizer)  # the recipe's LocalShardAdamW
    assert isinstance(ours, LocalShardAdamW), f"optimizer.kind {cfg.optimizer.kind!r} is not the fused AdamW"
    stock = torch.optim.AdamW([dict(group) for group in ours.param_groups], fused=True)  # the same groups, on DTensors
    ema = EMA(model, cfg.ema.beta, 0)
    rows = [
        ("clip_grad_norm_", lambda: torch.nn.utils.clip_grad_norm_(params, 1e9).full_tensor(), lambda: clip_grad_norm_(params, 1e9)),
        ("AdamW step (fused)", stock.step, ours.step),
        ("EMA lerp", lambda: dtensor_ema_update(ema, model, 0.999), lambda: ema.update(model, 10_000)),
    ]
    print(f"{args.preset} preset of {args.recipe} on {device}: {len(params)} trainable tensors, "
          f"{sum(local(p).numel() for p in params):,} values, ms per call (mean of {args.calls})")
    print("| phase | on DTensors | on local shards | saved |\n| --- | ---: | ---: | ---: |")
    total = [0.0, 0.0]
    for name, before, after in rows:
        a, b = ms_per_call(before, args.calls, device), ms_per_call(after, args.calls, device)
        total = [total[0] + a, total[1] + b]
        print(f"| {name} | {a:.2f} | {b:.2f} | {a - b:.2f} |")
    print(f"| **all three** | {total[0]:.2f} | {total[1]:.2f} | {total[0] - total[1]:.2f} |")


if __name__ == "__main__":
    main()
