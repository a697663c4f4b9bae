"""A random-weight export of the G1 shape, written by `wamkit export`'s own writer (wamkit.export.write_export).

The files are those of a real export: transformer/ by save_pretrained, wamkit.json with the data contract,
model info, diffusion settings and the experiment config of recipes/g1_simple.toml at the chosen preset.
The contract is chunk 32 x 36-D actions, 32-D state and one camera. The random Wan2.2-layout VAE lies
beside it, in <export>_vae, and wamkit.json names it. benchmarks/serve_export.py serves it."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CAMERA = "observation.images.ego_view"


def g1_config(preset: str, vae_dir: Path, text_tokens: int):
    from wamkit.config import load_experiment

    sets = {"model.preset": f'"{preset}"', "model.vae_path": f'"{vae_dir}"', "checkpoint.load_path": '""',
            "data.path": '"/nonexistent/g1_simple (random-weight benchmark export)"', "model.max_text_tokens": str(text_tokens)}
    return load_experiment(REPO / "recipes" / "g1_simple.toml", [f"{k}={v}" for k, v in sets.items()])


def random_vae(preset: str):
    """Wan2.2's VAE layout at full width (nano) or at the tests' tiny width, random weights."""
    import torch
    from diffusers import AutoencoderKLWan

    from wamkit.model.tokenizer import WAN22_VAE_LAYOUT

    torch.manual_seed(0)
    layout = WAN22_VAE_LAYOUT if preset != "tiny" else dict(
        base_dim=16, decoder_base_dim=16, z_dim=48, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
        patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4)
    return AutoencoderKLWan(**layout, latents_mean=[0.0] * 48, latents_std=[1.0] * 48)


def g1_contract(cfg, image_size: int, text_tokens: int) -> dict:
    """The data contract a G1 run records (wamkit.train.setup), with [-1, 1] min/max statistics."""
    from wamkit.data import Normalizer
    from wamkit.data.canvas import CanvasTransform

    bounds = lambda n: {"min": np.full(n, -1.0), "max": np.full(n, 1.0)}  # noqa: E731
    return {
        "dataset": "random-weight benchmark export (no dataset)", "fps": float(cfg.data.fps), "chunk_length": cfg.data.chunk_length,
        "camera_keys": [CAMERA], "camera_sizes": [[image_size, image_size]],
        "action_key": cfg.data.action_key, "action_dim": 36, "state_key": cfg.data.state_key, "state_dim": 32,
        "max_action_dim": cfg.model.max_action_dim, "use_state": True, "domain_name": cfg.data.domain_name,
        "domain_id": cfg.data.domain_id,
        "prompt_template": "{task} " + "." * text_tokens,  # padded: the tokenizer truncates to text_tokens
        "canvas": CanvasTransform.from_config(cfg.data, [CAMERA]).state_dict(),
        "action_normalizer": Normalizer.from_stats({"action": bounds(36)}, "action", "minmax").state_dict(),
        "state_normalizer": Normalizer.from_stats({"observation.state": bounds(32)}, "observation.state", "minmax").state_dict(),
        "train_episodes": [], "val_episodes": [],
    }


def make_export(export: Path, preset: str, device: str, dtype_name: str, image_size: int, text_tokens: int, log=print):
    """Write the export (under a temporary sibling, renamed into place when complete). Returns
    (model, vae) still in memory, for the in-process row."""
    import torch

    from wamkit.export.export import write_export
    from wamkit.model.cosmos3 import build_transformer
    from wamkit.model.text_tokenizer import ByteTokenizer
    from wamkit.policy.loading import LoadedModel, model_info_from_config

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype_name]
    vae_dir = export.parent / f"{export.name}_vae"
    cfg = g1_config(preset, vae_dir, text_tokens)
    tmp = export.parent / f".tmp_{export.name}_{os.getpid()}"
    export.parent.mkdir(parents=True, exist_ok=True)
    for stale in [vae_dir, *export.parent.glob(f".tmp_{export.name}_*")]:  # an earlier call's, cut off while writing
        shutil.rmtree(stale, ignore_errors=True)
    t = time.perf_counter()
    with torch.device(device):
        torch.manual_seed(0)
        model = build_transformer(preset, 48, cfg.model.max_action_dim, cfg.model.num_domains, cfg.model.fps_modulation)
        model = model.to(dtype).eval().requires_grad_(False)
        vae = random_vae(preset)
    log(f"export: built random {preset} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, {dtype_name}) "
        f"and VAE on {device} in {time.perf_counter() - t:.0f} s")
    need = sum(t.numel() * t.element_size() for t in [*model.state_dict().values(), *vae.state_dict().values()])
    free = shutil.disk_usage(export.parent).free
    if free < need * 1.05:
        raise SystemExit(f"{export.parent} has {free / 2**30:.1f} GiB free, the export needs {need / 2**30:.1f} GiB: "
                         "free disk space or pass --export on a larger disk")
    t = time.perf_counter()
    vae.save_pretrained(str(vae_dir))
    text = ByteTokenizer(text_tokens)
    loaded = LoadedModel(model=model, video_tokenizer=None, text_tokenizer=text, contract=g1_contract(cfg, image_size, text_tokens),
                         model_info=model_info_from_config(cfg, text), diffusion=dataclasses.asdict(cfg.diffusion),
                         source={"weights": f"random ({preset}, seed 0)", "written_by": "benchmarks/serve_export.py"},
                         experiment_config=dataclasses.asdict(cfg))
    tmp.mkdir()
    write_export(loaded, tmp)
    os.rename(tmp, export)
    log(f"export: wrote {export} ({dir_gib(export):.1f} GiB) and {vae_dir.name} in {time.perf_counter() - t:.0f} s")
    return model, vae


def dir_gib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**30


def check_reusable(export: Path, preset: str, image_size: int) -> None:
    manifest = json.loads((export / "wamkit.json").read_text())
    got = (manifest["model"]["preset"], manifest["data_contract"]["camera_sizes"])
    if got != (preset, [[image_size, image_size]]):
        raise SystemExit(f"{export} holds preset/camera sizes {got}, not {(preset, [[image_size, image_size]])}: "
                         "pass another --export or delete it")

