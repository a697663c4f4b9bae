"""eval/sim_eval takes the frame size it renders at from the policy's data contract (`camera_sizes`), the one
record of it: the training dataset may be gone, or say something else, by the time a policy is evaluated."""

import json
from types import SimpleNamespace

from wamkit.eval.sim_eval import _training_resolution


def _policy(contract):
    return SimpleNamespace(contract=contract, camera_keys=["observation.image"])


def test_resolution_comes_from_the_contract_when_the_dataset_is_gone(tmp_path):
    assert _training_resolution(_policy({"dataset": str(tmp_path / "gone"), "camera_sizes": [[64, 64]]})) == 64


def test_the_contract_wins_over_a_dataset_that_says_otherwise(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text(json.dumps(
        {"features": {"observation.image": {"dtype": "video", "shape": [96, 96, 3]}}}))
    assert _training_resolution(_policy({"dataset": str(tmp_path), "camera_sizes": [[64, 64]]})) == 64


def test_no_camera_sizes_or_non_square_frames_give_none(tmp_path):
    assert _training_resolution(_policy({"dataset": str(tmp_path)})) is None
    assert _training_resolution(_policy({"camera_sizes": [[48, 64]]})) is None
