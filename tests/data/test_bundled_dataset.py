"""The dataset README command 1 trains on ships with the repository: it must stay valid."""

import json

from tests.helpers import DEMO_RECIPE, REPO
from wamkit.config import load_experiment
from wamkit.data import LeRobotV3Dataset
from wamkit.data.doctor import DatasetExpectation, diagnose
from wamkit.sim import expand_env_names, get_spec


def test_bundled_metaworld_dataset_passes_the_doctor_for_the_demo_recipe():
    cfg = load_experiment(DEMO_RECIPE)
    root = REPO / cfg.data.path
    report = diagnose(root, DatasetExpectation.from_config(cfg))
    assert report.ok, report.format()
    ds = LeRobotV3Dataset(root)
    recording = json.loads((root / "meta" / "wamkit_recording.json").read_text())
    assert len(ds.episode_indices) == recording["kept"] == 64 and ds.fps == 80
    assert set(ds.tasks.values()) == {get_spec(n).task for n in expand_env_names("metaworld/easy4")}
