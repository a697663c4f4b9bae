"""Training from cached latents equals training from video, and a stale cache is refused."""

import json

from tests.helpers import DEMO_RECIPE, quick_overrides, run_cli
from wamkit.config import load_experiment
from wamkit.train.latents import cache_latents
from wamkit.train.trainer import Trainer


def _losses(run_dir):
    return [json.loads(l)["loss"] for l in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]


def _cfg(args: list[str]):
    """The experiment `wamkit train DEMO_RECIPE *args` would run (args: --set pairs), for in-process runs:
    the CLI's own path is exercised once per test, not once per step of it."""
    return load_experiment(DEMO_RECIPE, [a for a in args if a != "--set"])


def test_training_on_cached_latents_matches_training_on_video(demo_root, tmp_path):
    base = quick_overrides(demo_root, tmp_path, "video", 3, 3)
    out = run_cli(["data", "cache-latents", str(DEMO_RECIPE), "--out", str(tmp_path / "cache"), "--dtype", "float32", *base])
    assert "wrote latent cache" in out.stdout
    Trainer(_cfg(base)).train()
    cached = quick_overrides(demo_root, tmp_path, "cached", 3, 3) + ["--set", f'data.latent_cache="{tmp_path / "cache"}"']
    Trainer(_cfg(cached)).train()
    assert _losses(tmp_path / "cached") == _losses(tmp_path / "video")


def test_a_cache_built_for_other_windows_is_refused(demo_root, tmp_path):
    base = quick_overrides(demo_root, tmp_path, "v", 3, 3)
    cache_latents(_cfg(base), tmp_path / "cache", device="cpu")
    other = base + ["--set", "data.chunk_length=4", "--set", f'data.latent_cache="{tmp_path / "cache"}"']
    proc = run_cli(["train", str(DEMO_RECIPE), *other], check=False)
    assert proc.returncode == 2 and "latent_cache.json" in proc.stderr and "chunk_length" in proc.stderr
