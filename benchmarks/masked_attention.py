"""What one block-causal per-sample attention call keeps for its backward, by how SDPA is called.

`per_sample` attention (wamkit.model.attention) gives SDPA a dense chunk mask with `enable_gqa`.
The distillation stages 2-3 train with it, and their peak memory was 18-24% over the trainer's
estimate, whose per-token coefficients assume fused attention (benchmarks/RESULTS.md, issue 29).
This prints, per call at one bimanual sample's shape (medium: 8 heads over 4 K/V heads of 64), the
bytes held between forward and backward, the forward + backward time, and which SDPA kernels accept
the call, for: the mask with enable_gqa (what wamkit calls), the mask over K/V expanded to every head,
and no mask (the lower bound).

    python benchmarks/masked_attention.py --device cuda     # on a GPU; --device cpu runs the same table
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def block_causal_mask(text: int, chunks: int, per_chunk: int, device) -> torch.Tensor:
    """[Lq, text + Lq]: text always visible, generation keys of chunks <= the query's own."""
    ids = torch.arange(chunks, device=device).repeat_interleave(per_chunk)
    keys = torch.cat([torch.full((text,), -1, device=device), ids])
    return keys[None, :] <= ids[:, None]


def call(variant: str, q, k, v, mask):
    heads = q.shape[1]
    if variant == "mask + enable_gqa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    k, v = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (k, v))
    if variant == "mask, K/V expanded":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v)


def measure(variant: str, args, device) -> dict:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lq, lk = args.chunks * args.per_chunk, args.text + args.chunks * args.per_chunk
    g = torch.Generator(device="cpu").manual_seed(0)
    make = lambda h, n: torch.randn(1, h, n, args.head_dim, generator=g).to(device, dtype).requires_grad_()  # noqa: E731
    q, k, v = make(args.heads, lq), make(args.kv_heads, lk), make(args.kv_heads, lk)
    mask = block_causal_mask(args.text, args.chunks, args.per_chunk, device)
    kernels = [b.name for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
               if accepts(variant, b, q, k, v, mask)]
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    allocated = (lambda: torch.cuda.memory_allocated(device)) if cuda else (lambda: float("nan"))
    rows = []  # (bytes held between forward and backward, seconds for both)
    for _ in range(args.warmup + args.iters):
        sync()
        before, t = allocated(), time.perf_counter()
        out = call(variant, q, k, v, mask)
        held = allocated() - before
        out.float().pow(2).mean().backward()
        sync()
        rows.append((held, time.perf_counter() - t))
    rows = rows[args.warmup:]
    return {"variant": variant, "kernels": ",".join(kernels) or "none",
            "held_mib": rows[-1][0] / 2**20, "ms": 1e3 * sorted(r[1] for r in rows)[len(rows) // 2]}


def accepts(variant, backend, q, k, v, mask) -> bool:
    try:
        with sdpa_kernel([backend]), torch.no_grad():
            call(variant, q, k, v, mask)
        return True
    except RuntimeError:
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--text", type=int, default=40, help="text tokens of the sample (always visible)")
    p.add_argument("--chunks", type=int, default=4, help="block-causal chunks of the generation pathway")
    p.add_argument("--per-chunk", type=int, default=116, help="generation tokens per chunk")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}; "
          f"{args.heads} heads over {args.kv_heads} K/V heads of {args.head_dim}, {args.chunks * args.per_chunk} queries over "
          f"{args.text + args.chunks * args.per_chunk} keys")
    print("| call | kernels that accept it | MiB held for backward | fwd + bwd ms (median) |\n| --- | --- | ---: | ---: |")
    for variant in ("mask + enable_gqa", "mask, K/V expanded", "no mask, K/V expanded"):
        r = measure(variant, args, device)
        print(f"| {r['variant']} | {r['kernels']} | {r['held_mib']:.2f} | {r['ms']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
