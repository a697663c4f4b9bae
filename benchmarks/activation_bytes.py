"""Bytes a training forward saves for its backward, eager against compiled decoder layers.

wamkit.train.memory's activation coefficients were measured on a GPU with compiled layers; this
counts, device-independently, what one forward of a packed batch hands autograd (saved-tensor hooks,
each storage once, weights excluded) per token, layer and hidden unit, with parallel.compile off and
on. Their ratio is memory.EAGER_ACTIVATION_FACTOR. The default shape is the bimanual chain's
(64x192 canvas at pixel factor 8: 9 latent frames of 8x24, 32 action rows, 40 text tokens,
block-causal chunks of 2 latent frames, the text pathway frozen), at medium width in bf16.

    python benchmarks/activation_bytes.py                    # CPU, ~5 min on 2 cores (the compiled row compiles once)
    python benchmarks/activation_bytes.py --modes eager --preset tiny --samples 2    # a smoke run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_throughput import Shape, make_samples  # noqa: E402
from wamkit.model.attention import hold_layout  # noqa: E402
from wamkit.model.attention_backends import install_packed_attention  # noqa: E402
from wamkit.model.cosmos3 import build_transformer, set_trainable  # noqa: E402
from wamkit.model.packing import pack_samples  # noqa: E402
from wamkit.train.memory import EAGER_ACTIVATION_FACTOR  # noqa: E402

BIMANUAL = Shape("bimanual chain, 64x192 at factor 8", 40, 9, 8, 24, 32)


def saved_bytes(model, processor, batch) -> int:
    """Bytes of the distinct non-weight storages one forward saves for its backward. Runs the step
    once untimed first (a compiled layer compiles there), then counts the second forward."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def forward(seen: dict | None):
        def pack(t):
            storage = t.untyped_storage()
            if seen is not None and storage.data_ptr() not in weights:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        hold_layout(processor, batch)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(**batch.forward_kwargs)
        return sum(o.float().square().mean() for o in out.sample) + sum(a.float().square().mean() for a in out.action)

    forward(None).backward()
    model.zero_grad(set_to_none=True)
    seen: dict = {}
    forward(seen)
    return sum(seen.values())


def measure(mode: str, args) -> dict:
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = torch.nn.Module.to(build_transformer(args.preset, 48, 32, 4), dtype)  # every module, as training casts
    set_trainable(model, train_text_pathway=False)
    c = model.config
    samples = make_samples(BIMANUAL, args.samples, c.latent_channel, c.action_dim, c.vocab_size, torch.device("cpu"), dtype)
    for sample in samples:
        sample.causal_chunk_frames = args.chunk_frames
    batch = pack_samples(samples, c)
    processor = install_packed_attention(model, args.attention)
    if mode == "compiled":
        for layer in model.layers:
            layer.compile(dynamic=False)
    total = saved_bytes(model, processor, batch)
    tokens = batch.forward_kwargs["sequence_length"]
    return {"mode": mode, "tokens": tokens, "mib": total / 2**20, "per": total / (tokens * c.num_hidden_layers * c.hidden_size)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="medium")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--chunk-frames", type=int, default=2, help="block-causal chunk in latent frames (0: bidirectional)")
    p.add_argument("--attention", default="per_sample", help="the packed attention backend (per_sample: what stages 2-3 train with)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--modes", default="eager,compiled")
    args = p.parse_args()
    print(f"{args.preset} width, {args.samples} samples of the {BIMANUAL.name} shape, {args.attention} attention, {args.dtype}, CPU")
    print("| decoder layers | packed tokens | saved MiB | bytes per token, layer and hidden unit |\n| --- | ---: | ---: | ---: |")
    rows = {}
    for mode in args.modes.split(","):
        rows[mode] = r = measure(mode, args)
        print(f"| {mode} | {r['tokens']} | {r['mib']:.1f} | {r['per']:.2f} |")
    if {"eager", "compiled"} <= rows.keys():
        print(f"eager / compiled = {rows['eager']['per'] / rows['compiled']['per']:.2f} "
              f"(memory.EAGER_ACTIVATION_FACTOR = {EAGER_ACTIVATION_FACTOR})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
