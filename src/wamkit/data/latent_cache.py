"""Pre-tokenized video: one latent tensor per window, so training skips video decoding and the VAE.

Valid only for recipes without pixel augmentation (wamkit has none yet). The cache records a
fingerprint of everything that decides the latents (dataset, windows, cameras and canvas, tokenizer);
a run whose recipe does not match it is refused rather than trained on stale latents."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from wamkit.errors import DataError

MANIFEST = "latent_cache.json"


def window_fingerprint(index) -> str:
    """Hash of a WindowDataset's (episode, start) index: the cache is addressed by position in it."""
    return hashlib.sha256(torch.as_tensor(index).contiguous().numpy().tobytes()).hexdigest()[:16]


def shard_path(root: Path, split: str, i: int) -> Path:
    return root / split / f"{i // 1000:05d}" / f"{i:08d}.safetensors"


class LatentCache:
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()
        manifest = self.root / MANIFEST
        if not manifest.is_file():
            raise DataError(str(manifest), "is missing: not a latent cache",
                            "build one with `wamkit data cache-latents RECIPE --out DIR`")
        self.manifest = json.loads(manifest.read_text())

    def check(self, fingerprint: dict) -> None:
        """Refuse a cache built for other data, windows, cameras or tokenizer."""
        built = self.manifest.get("fingerprint", {})
        diff = sorted(k for k in set(built) | set(fingerprint) if built.get(k) != fingerprint.get(k))
        if diff:
            raise DataError(str(self.root / MANIFEST), f"was built for a different setup (differs in {diff})",
                            "rebuild it with `wamkit data cache-latents` for this recipe, or unset data.latent_cache")

    def load(self, split: str, i: int) -> torch.Tensor:
        path = shard_path(self.root, split, i)
        if not path.is_file():
            raise DataError(str(path), f"latent of {split} window {i} is missing (incomplete cache)",
                            "rebuild the cache with `wamkit data cache-latents`")
        return load_file(str(path))["latents"].float()


class CachedWindows(torch.utils.data.Dataset):
    """Windows read without video, turned into samples carrying their cached latents."""

    def __init__(self, windows, transform, cache: LatentCache, split: str):
        windows.decode_video = False
        self.windows, self.transform, self.cache, self.split = windows, transform, cache, split

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        sample = self.transform(self.windows[i])
        sample.latents = self.cache.load(self.split, i)
        return sample
