"""A run with the lossless pixel tokenizer (model.tokenizer = "pixel_unshuffle") trains, exports and
predicts: the export records the tokenizer, and the loaded policy builds the same one."""

import json

import numpy as np

from tests.helpers import train_tiny_run
from wamkit.export import export_run
from wamkit.policy import Policy


def test_a_pixel_unshuffle_run_trains_exports_and_predicts(tmp_path):
    run = train_tiny_run(tmp_path, "unshuffle", ['model.tokenizer="pixel_unshuffle"', "model.pixel_spatial_factor=16"])
    export = tmp_path / "export"
    export_run(run, export)
    assert json.loads((export / "wamkit.json").read_text())["model"]["tokenizer"] == "pixel_unshuffle"
    policy = Policy.from_export(export, num_steps=2)
    assert policy.video_tokenizer.lossless and policy.video_tokenizer.latent_channels == 3 * 16 * 16 * 4
    rng = np.random.default_rng(0)
    obs = {"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "state": rng.uniform(0.2, 0.8, 4), "prompt": "reach"}
    chunk = policy.predict([obs], seed=1)[0]
    assert chunk.shape == (8, 3) and np.isfinite(chunk).all()
