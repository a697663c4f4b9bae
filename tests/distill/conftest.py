"""A tiny sim-bimanual bundle with trained stage-0 and stage-1 checkpoints: the inputs every distillation
test starts from, built once per test session."""

import pytest

from tests.bimanual.tiny import recipe, tiny_overrides
from wamkit.bimanual import write_synthetic_bundle
from wamkit.config import load_experiment
from wamkit.train.trainer import Trainer


@pytest.fixture(scope="session")
def chain(tmp_path_factory):
    """(bundle, runs dir, stage-0 iteration dir, stage-1 iteration dir)."""
    root = tmp_path_factory.mktemp("chain")
    bundle = write_synthetic_bundle(root / "bundle", samples=8)
    runs = root / "runs"
    stage0 = Trainer(load_experiment(recipe(0), tiny_overrides(bundle, runs, "d-stage0", 2, chunk_frames=0))).train()["latest_checkpoint"]
    stage1 = Trainer(load_experiment(recipe(1), tiny_overrides(bundle, runs, "d-stage1", 2, stage0))).train()["latest_checkpoint"]
    return bundle, runs, stage0, stage1
