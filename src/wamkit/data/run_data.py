"""What a run reads, built by `wamkit.train.datasets.build_run_data` (LeRobot datasets) or
`wamkit.bimanual.bundle.build_bundle_run_data` (sim-bimanual bundles): the windows, the sample transform
and the data contract, and the fingerprint a `data.latent_cache` must carry to stand in for the video."""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import Dataset

from wamkit.config.env import resolved
from wamkit.data.latent_cache import window_fingerprint
from wamkit.data.lerobot_v3 import LeRobotV3Dataset
from wamkit.data.sample import SampleTransform
from wamkit.data.windows import WindowDataset


class TransformedWindows(Dataset):
    """Windows -> TrainingSamples, lazily (runs in DataLoader workers)."""

    def __init__(self, windows: Dataset, transform):
        self.windows, self.transform = windows, transform

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        return self.transform(self.windows[i])


@dataclass
class RunData:
    dataset: LeRobotV3Dataset
    train_windows: WindowDataset
    val_windows: WindowDataset | None
    transform: SampleTransform
    contract: dict
    # What a sample's token count follows from before any batch is read (the memory gate's estimate):
    # the [H, W] frame the transformer sees and a training task's text. None where not known.
    frame_size: tuple[int, int] | None = None
    example_task: str | None = None

    def samples(self, split: str, cfg):
        """The split as a dataset of TrainingSamples: decoded video, or `data.latent_cache` latents."""
        windows = self.train_windows if split == "train" else self.val_windows
        if not cfg.data.latent_cache:
            return TransformedWindows(windows, self.transform)
        from wamkit.data.latent_cache import CachedWindows, LatentCache

        cache = LatentCache(resolved(cfg.data, "latent_cache"))
        cache.check(latent_fingerprint(cfg, self))
        return CachedWindows(windows, self.transform, cache, split)


def latent_fingerprint(cfg, run_data) -> dict:
    """Everything that decides a window's latents."""
    return {
        "dataset": str(run_data.dataset.root.resolve()),
        "chunk_length": cfg.data.chunk_length,
        "cameras": run_data.contract["camera_keys"],
        "canvas": run_data.contract.get("canvas"),
        "tokenizer": cfg.model.tokenizer,
        "vae_path": cfg.model.vae_path,
        "pixel_spatial_factor": cfg.model.pixel_spatial_factor if cfg.model.tokenizer != "wan2.2" else None,
        "train_windows": window_fingerprint(run_data.train_windows.index),
        "val_windows": window_fingerprint(run_data.val_windows.index) if run_data.val_windows is not None else None,
    }
