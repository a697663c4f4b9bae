"""`wamkit data cache-latents`: tokenize every window of a recipe's dataset once and store the
latents (see wamkit.data.latent_cache); training with `data.latent_cache` then reads them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from wamkit.data.latent_cache import MANIFEST, shard_path
from wamkit.data.run_data import latent_fingerprint
from wamkit.errors import DataError


DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def cache_latents(cfg, out_dir: str | Path, batch_size: int = 8, dtype: str = "float16", device: str = "auto") -> Path:
    """Encode every train/val window's video on `device` (resolve_device); written to a temp dir,
    renamed into place when done."""
    from wamkit.device import resolve_device

    from wamkit.train.datasets import build_run_data
    from wamkit.train.setup import build_tokenizers

    out = Path(out_dir).expanduser()
    if out.exists() and any(out.iterdir()):
        raise DataError(str(out), "already exists and is not empty", "choose a new directory for the cache")
    run_data = build_run_data(cfg)
    tokenizer, _ = build_tokenizers(cfg, resolve_device(device))
    if cfg.model.compile_vae and resolve_device(device).type == "cuda" and hasattr(tokenizer, "compile_encoder"):
        tokenizer.compile_encoder()  # once per clip shape, then about twice as fast
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        counts = {}
        for split, windows in (("train", run_data.train_windows), ("val", run_data.val_windows)):
            if windows is None:
                continue
            for start in range(0, len(windows), batch_size):
                idx = range(start, min(start + batch_size, len(windows)))
                videos = torch.stack([run_data.transform(windows[i]).video for i in idx])
                with torch.no_grad():
                    latents = tokenizer.encode(videos).to("cpu", DTYPES[dtype])
                for j, i in enumerate(idx):
                    path = shard_path(tmp, split, i)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    save_file({"latents": latents[j].contiguous()}, str(path))
            counts[split] = len(windows)
        (tmp / MANIFEST).write_text(json.dumps({"fingerprint": latent_fingerprint(cfg, run_data), "windows": counts,
                                                "dtype": dtype}, indent=2))
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
