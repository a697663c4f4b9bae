"""Which attention processor a run installs (dense SDPA, flex block masks or per-sample SDPA), and the
text padding its packs then need. Above both `wamkit.model.attention` and `wamkit.model.flex_attention`."""

from __future__ import annotations

import torch

from wamkit.model.attention import PackedAttention, PerSampleAttention
from wamkit.model.packing import TEXT_PAD_MULTIPLE


def attention_backend(choice: str, device: torch.device, compute_dtype: str | torch.dtype) -> str:
    """auto: flex block masks for bf16 on CUDA; otherwise (CPU, and fp32 on CUDA, where inductor
    finds no flex kernel for small fp32 heads) per-sample SDPA, which skips the cross-sample pairs a
    dense mask computes (4.7x faster than dense masks for 4 packed world-model samples on CPU:
    benchmarks/RESULTS.md). Dense masks (`sdpa`) stay the reference the others are tested against.
    Training and inference share the rule."""
    if choice == "auto":
        return "flex" if device.type == "cuda" and compute_dtype in ("bfloat16", torch.bfloat16) else "per_sample"
    return choice


def training_text_multiple(compiled: bool, backend: str) -> int:
    """The `text_multiple` training packs get: compiled layers are guarded on exact shapes and flex
    compiles its kernel, so both get packs of a few lengths (TEXT_PAD_MULTIPLE); eager backends none.
    Without it, prompts of different lengths recompile every step until dynamo's limit, after which
    flex runs unfused and materialises the scores (benchmarks/RESULTS.md: 73 GiB for 16 world-model
    samples)."""
    return TEXT_PAD_MULTIPLE if compiled or backend == "flex" else 0


def install_packed_attention(model, backend: str = "sdpa") -> PackedAttention:
    """backend "sdpa": dense masks (CPU, tests); "flex": block-sparse flex attention (GPU);
    "per_sample": fused SDPA per sample (GPU, packs of changing lengths)."""
    if backend == "flex":
        from wamkit.model.flex_attention import FlexPackedAttention

        processor = FlexPackedAttention()
    elif backend == "sdpa":
        processor = PackedAttention()
    elif backend == "per_sample":
        processor = PerSampleAttention()
    else:
        raise ValueError(f"unknown attention backend {backend!r}: use 'sdpa', 'flex' or 'per_sample'")
    model.set_attn_processor(processor)
    return processor
