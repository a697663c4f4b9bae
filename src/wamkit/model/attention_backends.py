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


TEXT_SLACK_PER_SAMPLE = 8  # filler tokens a training sample may cost at most (see training_text_multiple)


def training_text_multiple(compiled: bool, backend: str, samples: int = 1) -> int:
    """The `text_multiple` training packs get: compiled layers are guarded on exact shapes and flex
    compiles its kernel, so both get packs of a few lengths; eager backends none. Without it, prompts
    of different lengths recompile every step until dynamo's limit, after which flex runs unfused and
    materialises the scores (benchmarks/RESULTS.md: 73 GiB for 16 world-model samples).

    The multiple grows with the pack (TEXT_SLACK_PER_SAMPLE tokens a sample, in whole tiles): the
    spread of a pack's total text grows with its sample count, and at a fixed 128 a 256-sample MT10
    pack met a new length nearly every step (dynamo's limit of 8 at step 24, H200, 2026-12-03). The
    mask tensors the compiled layers read are module state, whose shapes dynamo keeps static."""
    if not (compiled or backend == "flex"):
        return 0
    return max(1, -(-TEXT_SLACK_PER_SAMPLE * int(samples) // TEXT_PAD_MULTIPLE)) * TEXT_PAD_MULTIPLE


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
