"""Wan2.2 VAE encode time per training clip (a diagnostic beside benchmarks/train_e2e.py, whose
split shows the encode at ~37% of an online step): the product's WanTokenizer.encode on a randomly
initialised Wan2.2-layout VAE in bf16, per canvas and batch, with cuDNN autotuning and channels-last
3-D layouts on and off. Prints a table of ms per clip.

    python benchmarks/vae_encode.py                          # one H200
    python benchmarks/vae_encode.py --device cpu --sizes 32x48 --frames 5 --batch 1 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from wamkit.model.tokenizer import WAN22_VAE_LAYOUT, WanTokenizer, channels_last_convs  # noqa: E402

VARIANTS = {  # name -> (cudnn.benchmark, channels_last_3d, torch.compile the encoder)
    "as built": (False, False, False),
    "cudnn autotune": (True, False, False),
    "autotune + channels-last": (True, True, False),
    "channels-last + compile_encoder (training's)": (True, True, True),
}


def time_encode(tokenizer: WanTokenizer, video: torch.Tensor, repeats: int) -> tuple[float, torch.Tensor]:
    """(seconds per call, the latents)."""
    sync = torch.cuda.synchronize if video.device.type == "cuda" else (lambda: None)
    latents = tokenizer.encode(video)  # warm-up: autotuning, allocator, compile
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        tokenizer.encode(video)
    sync()
    return (time.perf_counter() - t0) / repeats, latents


def main(argv=None) -> int:
    from diffusers import AutoencoderKLWan

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", nargs="+", default=["256x320", "544x736"], help="canvases HxW")
    p.add_argument("--frames", type=int, nargs="+", default=[33, 17])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True, help="also time a torch.compile'd encoder")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        vae = AutoencoderKLWan(**WAN22_VAE_LAYOUT, latents_mean=[0.0] * 48, latents_std=[1.0] * 48).to(dtype)
    tokenizer = WanTokenizer(vae).to(device)
    print("| canvas | frames | clips | variant | ms per clip | rel. diff to as built | compile s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for size in args.sizes:
        h, w = (int(v) for v in size.split("x"))
        for frames in args.frames:
            video = torch.randint(0, 256, (args.batch, frames, h, w, 3), dtype=torch.uint8, device=device)
            reference = None  # the as-built latents: each variant's relative difference to them
            for name, (autotune, channels_last, compiled) in VARIANTS.items():
                if compiled and not args.compile:
                    continue
                torch.backends.cudnn.benchmark = autotune
                channels_last_convs(vae, torch.channels_last_3d if channels_last else torch.contiguous_format)
                if compiled:
                    tokenizer.compile_encoder()  # what training runs: every chunk after the first frame compiled
                try:
                    seconds, latents = time_encode(tokenizer, video, args.repeats)
                    ms = 1e3 * seconds / args.batch
                except Exception as exc:  # a variant that does not run is a result too
                    print(f"| {h}x{w} | {frames} | {args.batch} | {name} | failed: {type(exc).__name__}: {str(exc)[:120]} |", flush=True)
                    continue
                finally:
                    if compiled:
                        del vae.encoder.forward  # back to diffusers' own for the next canvas
                reference = latents if reference is None else reference
                error = ((latents.float() - reference.float()).norm() / reference.float().norm()).item()
                compile_s = f"{tokenizer.compile_seconds:.1f}" if compiled else "-"
                print(f"| {h}x{w} | {frames} | {args.batch} | {name} | {ms:.1f} | {error:.1e} | {compile_s} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
