"""Tiny CPU overrides for the sim-bimanual stage recipes (documented in docs/recipes/sim_bimanual.md)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def recipe(stage: int) -> Path:
    return REPO / "recipes" / f"sim_bimanual_stage{stage}.toml"


def tiny_overrides(bundle: Path, output_root: Path, name: str, iters: int, load_path: str = "", chunk_frames: int = 1,
                   extra: dict | None = None) -> list[str]:
    pairs = {
        "job.name": f'"{name}"', "job.output_root": f'"{output_root}"', "data.path": f'"{bundle}"',
        "data.chunk_length": 8, "model.preset": '"tiny"', "model.tokenizer": '"pixel"', "model.vae_path": '""',
        "model.pixel_spatial_factor": 8, "model.max_text_tokens": 32, "checkpoint.load_path": f'"{load_path}"',
        "trainer.max_iter": iters, "checkpoint.save_iter": iters, "trainer.samples_per_step": 2,
        "trainer.progress_bar": "false", "trainer.val_every": 0, "trainer.log_every": 1,
        "scheduler.warm_up_steps": "[1]", "diffusion.causal_chunk_frames": chunk_frames, "optimizer.lr": 1e-4,
        **(extra or {}),
    }
    return [f"{k}={v}" for k, v in pairs.items()]
