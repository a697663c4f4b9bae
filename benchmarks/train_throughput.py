"""Training throughput of the Cosmos3 stack at Nano width: diffusers as-is (one sample per forward)
against wamkit's packed sequences (several samples per forward, flex-attention block masks,
compiled decoder layers). Prints a table; the last line is `mfu_g1=<x> mfu_droid=<y>`.

MFU counts the FLOPs the step must do (generation pathway forward + backward with weight grads;
frozen text pathway forward + activation grads; attention over the allowed pairs only) against a
bf16 matmul rate measured in the same run.

    python benchmarks/train_throughput.py --layers 36            # Nano width, one H200
    python benchmarks/train_throughput.py --layers 2 --device cpu --steps 1 --warmup 0 --shapes tiny
    python benchmarks/train_throughput.py --width medium --layers 8 --shapes wm --no-baseline --layouts 24 --attention per_sample --no-compile
    python benchmarks/train_throughput.py --width medium --layers 8 --shapes wm --no-baseline --layouts 24 --attention flex --text-multiple 128

With --layouts > 1 the packs differ in text length; the last column counts the graphs dynamo compiled
while timing (recompiles). Training pads packs like --text-multiple 128 when compiled (see
wamkit.model.attention_backends.training_text_multiple).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from types import SimpleNamespace
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from wamkit.model.cosmos3 import PRESETS, build_transformer, set_trainable  # noqa: E402
from wamkit.model.attention import packed_layout  # noqa: E402
from wamkit.model.attention_backends import install_packed_attention  # noqa: E402
from wamkit.model.packing import SequenceSample, pack_samples  # noqa: E402
from wamkit.model.flops import matmul_rate, sample_flops  # noqa: E402
from wamkit.train.parallel import ParallelDims, build_mesh, init_distributed, parallelize, shutdown  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    text: int
    latent_t: int
    latent_h: int
    latent_w: int
    actions: int  # action rows incl. the state row


SHAPES = {
    "g1": Shape("G1 256p chunk 32", 256, 9, 12, 20, 33),  # 192x320 px -> 12x20 latents -> 540 patches + 33 rows
    "droid": Shape("DROID 480p concat chunk 32", 256, 9, 34, 46, 33),  # 544x736 px -> 3519 patches + 33 rows
    "tiny": Shape("tiny smoke shape", 16, 3, 4, 4, 9),
    # recipes/metaworld_fd.toml: 64 px, pixel tokenizer without downsampling, 8 clean action rows, no state
    "wm": Shape("Meta-World world model 64px", 32, 3, 64, 64, 8),
}


def make_samples(shape: Shape, n: int, channels: int, action_dim: int, vocab: int, device, dtype,
                 seed: int = 0) -> list[SequenceSample]:
    """Seed 0: every prompt has `shape.text` tokens. Other seeds: lengths drawn from text/2..text,
    so each seed gives a pack of another layout (as training draws prompts of different lengths)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [shape.text if seed == 0 else int(torch.randint(shape.text // 2, shape.text + 1, (1,), generator=gen)) for _ in range(n)]
    return [
        SequenceSample(
            text_ids=torch.randint(3, vocab, (lengths[i],), generator=gen).tolist(),
            video=torch.randn(channels, shape.latent_t, shape.latent_h, shape.latent_w, generator=gen).to(device, dtype),
            actions=torch.randn(shape.actions, action_dim, generator=gen).to(device, dtype),
            clean_video_frames=[0], clean_action_rows=[0], sigma=0.5, domain_id=0, fps=30.0, action_start_frame=0,
        )
        for i in range(n)
    ]


def step_flops(model, shape: Shape, n: int) -> float:
    """FLOPs of one forward+backward over n samples of `shape` (wamkit.model.flops, as training logs them)."""
    n_gen = shape.latent_t * math.ceil(shape.latent_h / 2) * math.ceil(shape.latent_w / 2) + shape.actions
    return n * sample_flops(model.config, shape.text, n_gen)


def time_steps(fn, steps: int, warmup: int, device) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / steps


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _compiled_graphs() -> int:
    """Graphs dynamo has compiled so far in this process (recompiles included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_case(model, shape: Shape, n: int, packed: bool, args, device, dtype) -> dict:
    """Steps cycle through `--layouts` packs (1: the same pack every step; more: a new layout at every
    step once the packs outnumber the attention processor's cached layouts, as in training)."""
    c = model.config
    batches = [pack_samples(make_samples(shape, n, c.latent_channel, c.action_dim, c.vocab_size, device, dtype, seed), c,
                            text_multiple=args.text_multiple if packed else 0)
               for seed in range(args.layouts if packed else 1)]
    cursor = iter(range(1 << 62))
    processor = install_packed_attention(model, args.attention) if packed else None
    if not packed:
        from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor

        model.set_attn_processor(Cosmos3AttnProcessor())

    def step():
        batch = batches[next(cursor) % len(batches)]
        if packed:
            with packed_layout(processor, batch):
                out = model(**batch.forward_kwargs)
        else:
            out = model(**batch.forward_kwargs)
        loss = sum(o.float().square().mean() for o in out.sample) + sum(a.float().square().mean() for a in out.action)
        loss.backward()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    graphs_before = _compiled_graphs()
    seconds = time_steps(step, args.steps, args.warmup, device)
    tokens = sum(b.forward_kwargs["sequence_length"] for b in batches) / len(batches)
    return {
        "seconds": seconds, "samples_per_s": n / seconds, "tokens_per_s": tokens / seconds, "tokens": round(tokens),
        "compiles": _compiled_graphs() - graphs_before,
        "flops": step_flops(model, shape, n),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan"),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--width", default="nano", choices=sorted(PRESETS))
    p.add_argument("--shapes", default="g1,droid")
    p.add_argument("--packed", default="g1=8,droid=2,tiny=4,wm=16", help="samples per packed forward, per shape")
    p.add_argument("--attention", default="flex", choices=["flex", "sdpa", "per_sample"])
    p.add_argument("--layouts", type=int, default=1, help="distinct packs (text lengths) cycled through; > 16 = a new layout every step")
    p.add_argument("--text-multiple", type=int, default=0,
                   help="round each pack's text up to a multiple of this with filler tokens (training does: 128 with flex or compile)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--fsdp", action="store_true", help="shard with wamkit's parallelize() (automatic under torchrun)")
    p.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--replicate", type=int, default=1, help="HSDP: replicate degree (shard degree = world / replicate)")
    p.add_argument("--replicate-frozen", action="store_true", help="keep frozen (text-pathway) weights whole on every GPU")
    p.add_argument("--prefetch", type=int, default=0, help="explicit FSDP2 prefetch, in layers (0: FSDP2's own)")
    args = p.parse_args(argv)

    ctx = init_distributed(args.device)
    device = ctx.device
    args.fsdp = args.fsdp or ctx.distributed
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    packed_n = dict(item.split("=") for item in args.packed.split(","))
    PRESETS["bench"] = replace(PRESETS[args.width], num_hidden_layers=args.layers)
    with torch.device(device):
        model = build_transformer("bench", latent_channel=48, max_action_dim=64, num_domains=32).to(dtype)
    set_trainable(model, train_text_pathway=False)
    params = sum(p.numel() for p in model.parameters())
    rate = matmul_rate(device, dtype)
    if args.fsdp:  # bf16 storage as in the single-GPU rows, so the comparison isolates sharding cost
        knobs = SimpleNamespace(activation_checkpointing="none", compile=args.compile and device.type == "cuda",
                                param_dtype="bfloat16", reduce_dtype="float32", reshard_after_forward=args.reshard_after_forward,
                                replicate_frozen=args.replicate_frozen, prefetch_layers=args.prefetch)
        mesh = build_mesh(ParallelDims(args.replicate, ctx.world_size // args.replicate), device)
        model = parallelize(model, mesh, SimpleNamespace(parallel=knobs))
        args.baseline = False
    say = print if ctx.is_main else (lambda *a, **k: None)  # only rank 0 prints the table
    say(f"world_size={ctx.world_size} fsdp={args.fsdp}")
    say(f"device={torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'} torch={torch.__version__} "
          f"width={args.width} layers={args.layers} params={params / 1e9:.2f}B bf16_matmul={rate / 1e12:.0f} TFLOP/s")

    rows, mfu = [], {}
    keys = args.shapes.split(",")
    if args.baseline:  # as-is first: diffusers' own processor, eager
        for key in keys:
            rows.append((SHAPES[key].name, "diffusers as-is, 1 sample", 1, run_case(model, SHAPES[key], 1, False, args, device, dtype)))
    if args.compile and device.type == "cuda" and not args.fsdp:
        model.compile_repeated_blocks(fullgraph=False, dynamic=False)
    for key in keys:
        n = int(packed_n[key])
        packed = run_case(model, SHAPES[key], n, True, args, device, dtype)
        layout = f"HSDP {args.replicate}x{ctx.world_size // args.replicate}" if args.replicate > 1 else f"FSDP2 x{ctx.world_size}"
        extras = ("" if args.reshard_after_forward else " no-reshard") + (" frozen-replicated" if args.replicate_frozen else "") + \
            (f" prefetch {args.prefetch}" if args.prefetch else "")
        fsdp = f", {layout}{extras}" if args.fsdp else ""
        rows.append((SHAPES[key].name, f"wamkit packed ({args.attention}{', compiled' if args.compile and device.type == 'cuda' else ''}{fsdp})", n, packed))
        mfu[key] = packed["flops"] / packed["seconds"] / rate if rate == rate else float("nan")

    say(f"| shape | path | samples/fwd | tokens | step ms | samples/s | tokens/s | MFU | peak GiB | graphs compiled while timed |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, path, n, r in rows:
        m = r["flops"] / r["seconds"] / rate if rate == rate else float("nan")
        say(f"| {name} | {path} | {n} | {r['tokens']} | {r['seconds'] * 1e3:.1f} | {r['samples_per_s']:.2f} | "
              f"{r['tokens_per_s']:.0f} | {m:.1%} | {r['peak_gib']:.1f} | {r['compiles']} |")
    if ctx.distributed:
        say(f"per-rank rows; total samples/s = {ctx.world_size} x samples/s")
    say(" ".join(f"mfu_{k}={v:.3f}" for k, v in mfu.items()))
    shutdown(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
