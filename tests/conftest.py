"""Shared fixtures: the generated demo dataset, a tiny Wan2.2-layout VAE."""

import os

# One OpenMP thread for each test worker and every process a test starts (they inherit it), set before torch is
# imported. pytest runs two workers on CI's two cores, and a subprocess at torch's default of one thread a core
# competes with the other worker for them (the MT10 recipe header test beside serve_export's: 37 s at two threads,
# 28 s at one); most subprocess tests set it already. A test or a user's shell that sets OMP_NUM_THREADS keeps its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from wamkit.data import write_demo_dataset


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory) -> Path:
    return write_demo_dataset(tmp_path_factory.mktemp("demo") / "reach", num_episodes=12)


@pytest.fixture(scope="session")
def tiny_wan_dir(tmp_path_factory) -> Path:
    """Wan2.2's VAE layout (z 48, residual blocks, 2x2 patchify -> 12 input channels, 16x spatial, 4x
    temporal) at a width that runs on CPU in seconds, saved in the real on-disk format."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=16, decoder_base_dim=16, z_dim=48, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
        patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=[0.1] * 48, latents_std=[2.0] * 48,
    )
    out = tmp_path_factory.mktemp("wan") / "vae"
    vae.save_pretrained(out)
    return out
