"""`wamkit eval open-loop`: chunks predicted in the recorded expert's states, compared with the recorded actions."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from tests.helpers import train_tiny_run
from wamkit.cli import main
from wamkit.data import LeRobotV3Dataset
from wamkit.errors import WamkitError
from wamkit.eval import open_loop as OL


class _Scripted:
    """A single-camera policy whose chunk at recorded step t is `answer(t)`; it finds t from the frame it is shown."""

    use_state, chunk_length, camera_keys = True, 8, ("observation.images.camera",)

    def __init__(self, ep, answer, contract):
        self.ep, self.answer, self.contract, self.action_dim = ep, answer, contract, ep.actions.shape[1]
        self.seen_states = []

    def predict(self, observations, seed=None):
        chunks = []
        for o in observations:
            t = next(i for i in range(len(self.ep.actions)) if _same_image(self.ep.image(i), o["image"]))
            self.seen_states.append(o["state"])
            chunks.append(self.answer(t))
        return chunks


def _same_image(a, b) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(np.array_equal, a, b))
    return np.array_equal(a, b)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("open_loop"), "ol")


def test_a_policy_that_replays_the_recording_agrees_and_one_that_reverses_it_does_not(run):
    contract = json.loads((run / "data_contract.json").read_text())
    ds = LeRobotV3Dataset(contract["dataset"])
    ep = OL.load_recorded(ds, 0, SimpleNamespace(contract=contract, use_state=True, camera_keys=contract["camera_keys"]))
    low, high = ds.stats["action"]["min"], ds.stats["action"]["max"]
    centre = (np.asarray(low) + np.asarray(high)) / 2
    replay = _Scripted(ep, lambda t: ep.actions[t:t + 8], contract)
    predicted, recorded = OL.open_loop_episode(replay, ep, every=4, horizon=4, seed=0)
    starts = OL.episode_windows(ep, 4, 4)
    assert starts[:3] == [0, 4, 8] and starts[-1] + 4 <= len(ep.actions)
    assert np.array_equal(predicted, recorded) and len(recorded) == 4 * len(starts)
    assert all(np.array_equal(s, ep.states[t]) for s, t in zip(replay.seen_states, starts))  # the recorded state at t

    names = ("dx", "dy", "grip")
    bounds = (list(np.ravel(low)), list(np.ravel(high)))
    same = OL.agreement([predicted], [recorded], [False], names, bounds)["all"]
    assert max(same["mean_abs_diff"]) == 0 and all(s in (1.0, None) for s in same["same_direction"])
    assert same["same_direction"][0] == 1.0  # the reach moves firmly in x
    reverse = _Scripted(ep, lambda t: 2 * centre - ep.actions[t:t + 8], contract)
    against = OL.agreement([OL.open_loop_episode(reverse, ep, 4, 4, 0)[0]], [recorded], [False], names, bounds)["all"]
    assert against["same_direction"][0] == 0.0


def test_cli_writes_a_report_per_task_on_the_held_out_episodes(run, tmp_path, capsys):
    assert main(["eval", "open-loop", str(run), "--every", "6", "--horizon", "4", "--num-steps", "2",
                 "--device", "cpu", "--out", str(tmp_path / "ol")]) == 0
    out = capsys.readouterr().out
    assert "all: " in out and "|diff|" in out
    report = json.loads((tmp_path / "ol" / "report.json").read_text())
    contract = json.loads((run / "data_contract.json").read_text())
    assert report["episodes"] == contract["val_episodes"] and report["horizon"] == 4 and report["every"] == 6
    assert report["all"]["steps"] > 0 and len(report["all"]["same_direction"]) == len(report["names"])
    assert "| **all** |" in (tmp_path / "ol" / "report.md").read_text()


def test_another_recording_defaults_to_all_its_episodes(run, tmp_path):
    """The run's val_episodes index its training data; on a separate recording every episode is held out."""
    from wamkit.data import LeRobotV3Dataset

    contract = json.loads((run / "data_contract.json").read_text())
    own = LeRobotV3Dataset(contract["dataset"])
    assert OL.default_episodes(contract, own) == contract["val_episodes"]
    assert OL.default_episodes({**contract, "dataset": str(tmp_path / "elsewhere")}, own) == own.episode_indices
    assert len(own.episode_indices) > len(contract["val_episodes"])


def test_bad_requests_name_the_fix(run, tmp_path):
    from wamkit.eval.sim_eval import load_policy

    policy = load_policy(str(run), num_steps=2)
    with pytest.raises(WamkitError, match="horizon"):
        OL.check_policy(policy, horizon=policy.chunk_length + 1, every=4)
    with pytest.raises(WamkitError, match="every"):
        OL.check_policy(policy, horizon=2, every=0)
    with pytest.raises(WamkitError, match="missing.*info.json is missing"):
        OL.open_loop_main(str(run), dataset=str(tmp_path / "missing"), out_dir=str(tmp_path / "o"), device="cpu")


def test_a_policy_of_two_cameras_is_shown_both_recorded_views_in_its_camera_order(tmp_path):
    """A recording of `--camera corner,topview`: at every window the policy gets the list of its views as
    recorded, in the order of its camera_keys (not the dataset's), as closed loop hands them."""
    from wamkit.sim import record

    record("metaworld/reach-v3", 1, tmp_path / "two", resolution=32, camera="corner,topview")
    ds = LeRobotV3Dataset(tmp_path / "two")
    keys = ("observation.images.topview", "observation.images.corner")
    contract = {"action_key": "action", "state_key": "observation.state"}
    ep = OL.load_recorded(ds, 0, SimpleNamespace(contract=contract, use_state=True, camera_keys=keys))
    assert [v.shape for v in ep.views] == [(len(ep.actions), 32, 32, 3)] * 2
    assert np.array_equal(ep.views[1], ds.decode_frames(0, keys[1], np.arange(len(ep.actions))))
    assert not np.array_equal(ep.views[0][0], ep.views[1][0])  # two different cameras

    replay = _Scripted(ep, lambda t: ep.actions[t:t + 8], contract)
    replay.camera_keys = keys
    predicted, recorded = OL.open_loop_episode(replay, ep, every=8, horizon=8, seed=0)
    assert np.array_equal(predicted, recorded) and len(recorded) == 8 * len(OL.episode_windows(ep, 8, 8)) > 0


def test_a_one_camera_policy_is_shown_its_camera_from_a_recording_of_several(tmp_path):
    """A one-camera recording keys its view `observation.images.front`; a recording of several keys each view after
    its simulator camera. The policy's contract names its camera (`sim_camera`), so a held-out recording of
    `corner,corner@2x` shows a `corner@2x` policy the zoomed view, and a camera it lacks is refused by name."""
    from wamkit.sim import record

    record("metaworld/reach-v3", 1, tmp_path / "two", resolution=32, camera="corner,corner@2x")
    ds = LeRobotV3Dataset(tmp_path / "two")
    contract = {"action_key": "action", "state_key": "observation.state", "sim_camera": "corner@2x"}
    policy = SimpleNamespace(contract=contract, use_state=False, camera_keys=("observation.images.front",))
    ep = OL.load_recorded(ds, 0, policy)
    zoomed = ds.decode_frames(0, "observation.images.corner@2x", np.arange(len(ep.actions)))
    assert np.array_equal(ep.views[0], zoomed)
    assert not np.array_equal(ep.views[0], ds.decode_frames(0, "observation.images.corner", np.arange(len(ep.actions))))
    policy.contract = {**contract, "sim_camera": "topview"}
    with pytest.raises(Exception, match="observation.images.front"):
        OL.load_recorded(ds, 0, policy)


def test_swapped_prompts_show_each_task_the_next_tasks_text(run, tmp_path, capsys):
    """--swap-prompts: does a multi-task policy read its task from the text or from the scene? Each task's
    episodes are shown the next task's text (sorted, wrapping round); a single task has nothing to swap."""
    assert OL.swapped_prompts(["push", "reach", "push", "door"]) == {"door": "push", "push": "reach", "reach": "door"}
    with pytest.raises(WamkitError, match="(?s)2 or more tasks.*leave --swap-prompts out"):
        OL.swapped_prompts(["reach", "reach"])

    contract = json.loads((run / "data_contract.json").read_text())
    ds = LeRobotV3Dataset(contract["dataset"])
    ep = OL.load_recorded(ds, 0, SimpleNamespace(contract=contract, use_state=True, camera_keys=contract["camera_keys"]))
    shown = []

    class Prompted(_Scripted):
        def predict(self, observations, seed=None):
            shown.extend(o["prompt"] for o in observations)
            return super().predict(observations, seed)

    policy = Prompted(ep, lambda t: ep.actions[t:t + 8], contract)
    OL.open_loop_episode(policy, ep, every=4, horizon=4, seed=0, prompt="open the door")
    OL.open_loop_episode(policy, ep, every=4, horizon=4, seed=0)
    n = len(OL.episode_windows(ep, 4, 4))
    assert shown == ["open the door"] * n + [ep.task] * n
    code = main(["eval", "open-loop", str(run), "--every", "6", "--horizon", "4", "--num-steps", "2", "--swap-prompts",
                 "--device", "cpu", "--out", str(tmp_path / "ol")])  # the tiny run's recording has one task
    assert code != 0 and "2 or more tasks" in capsys.readouterr().err
    assert "Swapped prompts" in "\n".join(OL._prompt_lines({"push": "reach"})) and OL._prompt_lines("own") == []
