"""The dataset README command 1 trains on ships with the repository: it must stay valid."""

from tests.helpers import DEMO_RECIPE, REPO
from wamkit.config import load_experiment
from wamkit.data import LeRobotV3Dataset
from wamkit.data.doctor import DatasetExpectation, diagnose


def test_bundled_metaworld_dataset_passes_the_doctor_for_the_demo_recipe():
    cfg = load_experiment(DEMO_RECIPE)
    root = REPO / cfg.data.path
    report = diagnose(root, DatasetExpectation.from_config(cfg))
    assert report.ok, report.format()
    ds = LeRobotV3Dataset(root)
    assert len(ds.episode_indices) == 36 and len(set(ds.tasks.values())) == 3 and ds.fps == 80
