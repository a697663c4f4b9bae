"""FLOPs a training step must do, and the rate they are measured against (MFU).

Counted per sample from its token counts: the generation pathway runs forward and backward with
weight gradients (3x its forward; 2x when its weights are frozen, as under LoRA, whose adapters'
own work is negligible), the frozen text pathway forward plus activation gradients (2x);
attention counts only the pairs the packed mask allows (a sample's generation tokens see its text and
its own generation tokens, text is causal). Filler text added for compiled shapes is not counted:
MFU measures useful work. The rate is a bf16 matmul measured on the device once per process, the
same convention as benchmarks/train_throughput.py."""

from __future__ import annotations

import functools
import json
import time

import torch


def sample_flops(config, n_text: int, n_gen: int, generation_weight_grads: bool = True) -> float:
    """Forward+backward FLOPs of one sample with `n_text` text and `n_gen` generation tokens."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    per_token = 2 * (h * heads * d * 2 + h * kv * d * 2 + 3 * h * inter)  # q,o + k,v + MLP, forward
    linear = layers * per_token * ((3 if generation_weight_grads else 2) * n_gen + 2 * n_text)
    attn_fwd = 4 * heads * d * (n_gen * (n_text + n_gen) + n_text * (n_text + 1) / 2)
    return linear + 3 * layers * attn_fwd


@functools.lru_cache(maxsize=64)
def _vae_encode_flops(vae_class, config_json: str, clip_shape: tuple[int, ...]) -> float:
    """FLOPs of one encode of float clips [B,3,T,H,W], counted by torch's FlopCounterMode on a meta
    copy of the VAE (no memory, no arithmetic), with the same single-frame convolutions the
    tokenizer runs."""
    from torch.utils.flop_counter import FlopCounterMode

    from wamkit.model.tokenizer import single_frame_convs

    with torch.device("meta"):
        vae = vae_class.from_config(json.loads(config_json))
        single_frame_convs(vae)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            vae.encode(torch.empty(clip_shape))
    return float(counter.get_total_flops())


def encode_flops(video_tokenizer, video_shape: tuple[int, ...]) -> float:
    """FLOPs the video tokenizer spends encoding uint8 clips of `video_shape` [B,T,H,W,3] (0 for the
    parameter-free pixel tokenizer). Online training pays them every step: the encode-inclusive MFU."""
    vae = getattr(video_tokenizer, "vae", None)
    if vae is None:
        return 0.0
    b, t, h, w, c = video_shape
    config = json.dumps({k: v for k, v in vae.config.items() if not k.startswith("_")}, sort_keys=True)  # hashable, for the cache
    return _vae_encode_flops(type(vae), config, (b, c, t, h, w))


def sequence_tokens(sample, patch: int) -> tuple[int, int]:
    """(text, generation) tokens a SequenceSample occupies in a pack (filler is not a sample)."""
    t, h, w = sample.video.shape[1:]
    actions = sample.actions.shape[0] if sample.actions is not None else 0
    return len(sample.text_ids), t * -(-h // patch) * -(-w // patch) + actions


def sequence_flops(config, samples, generation_weight_grads: bool = True) -> tuple[float, int]:
    """(FLOPs, useful tokens) of one forward+backward over packed SequenceSamples."""
    counts = [sequence_tokens(s, config.latent_patch_size) for s in samples]
    return sum(sample_flops(config, t, g, generation_weight_grads) for t, g in counts), sum(t + g for t, g in counts)


def generation_weights_train(model) -> bool:
    """Whether the generation pathway's MLP weights get gradients (not under LoRA, where they are frozen)."""
    return any(p.requires_grad for name, p in model.named_parameters() if "mlp_moe_gen" in name)


@functools.lru_cache(maxsize=None)
def matmul_rate(device: torch.device, dtype: torch.dtype = torch.bfloat16, size: int = 8192) -> float:
    """Achieved dense matmul FLOP/s of `device` (nan on the CPU, where MFU is not reported)."""
    if device.type != "cuda":
        return float("nan")
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize(device)
    return 10 * 2 * size**3 / (time.perf_counter() - t0)
