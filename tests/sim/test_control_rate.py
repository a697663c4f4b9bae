"""Recording and evaluating at a lower control rate than the simulator's (`--action-repeat K`)."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import wamkit.sim  # noqa: F401 - picks the headless GL backend before metaworld imports mujoco
from wamkit.config import load_experiment
from wamkit.data import LeRobotV3Dataset
from wamkit.eval import evaluate
from wamkit.sim import SimError, get_spec, record
from wamkit.sim.control_rate import ActionRepeat, control_repeat
from wamkit.sim.base import SimEnv, StepResult
from wamkit.train.trainer import Trainer

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo_tiny.toml"


@dataclass
class CountingEnv(SimEnv):
    """Records every action it is stepped with; succeeds at inner step `succeed_at`."""

    budget: int = 10
    succeed_at: int = 10**9

    def __post_init__(self):
        self.spec = get_spec("metaworld/reach-v3")
        self.resolution, self.max_episode_steps, self.actions, self.observed = 32, self.budget, [], 0

    def reset(self, seed):
        self.actions = []
        return {"step": 0}

    def step(self, action, observe=True):
        self.actions.append(np.asarray(action).copy())
        n = len(self.actions)
        success = n >= self.succeed_at
        self.observed += int(observe)
        return StepResult(self._obs() if observe else None, success, success or n >= self.max_episode_steps, {})

    def _obs(self):
        return {"step": len(self.actions)}


def test_action_repeat_holds_each_action_and_rescales_rate_and_budget():
    inner = CountingEnv(budget=10)
    env = ActionRepeat(inner, 4)
    assert env.spec.fps == inner.spec.fps / 4 and env.max_episode_steps == 2
    env.reset(0)
    first = env.step(np.array([1.0, 0, 0, 0]))
    assert first.obs == {"step": 4} and not first.done
    last = env.step(np.array([0, 2.0, 0, 0]))
    assert last.obs == {"step": 8} and not last.done
    np.testing.assert_array_equal(np.stack(inner.actions), np.repeat([[1.0, 0, 0, 0], [0, 2.0, 0, 0]], 4, axis=0))
    spent = env.step(np.zeros(4))  # only 2 inner steps of budget left: stops there, done
    assert spent.obs == {"step": 10} and spent.done and not spent.success
    assert inner.observed == 0  # the wrapper looks once per held action, through observe()
    assert ActionRepeat(CountingEnv(), 2).step(np.zeros(4), observe=False).obs is None


def test_success_inside_a_held_action_counts_and_the_action_is_still_held():
    inner = CountingEnv(budget=40, succeed_at=2)
    result = ActionRepeat(inner, 4).step(np.zeros(4))
    assert result.success and result.done and len(inner.actions) == 4


def test_control_repeat_and_errors():
    assert control_repeat(80.0, 20.0) == 4 and control_repeat(80.0, 80.0) == 1
    assert control_repeat(80.0, 30.0) is None and control_repeat(80.0, 160.0) is None
    with pytest.raises(SimError, match="action_repeat"):
        ActionRepeat(CountingEnv(), 0)


def test_recording_at_a_quarter_rate_and_evaluating_there(tmp_path):
    """A 20 fps dataset from the 80 Hz Meta-World env: a quarter of the frames, fps 20 in the dataset;
    a policy trained on it is evaluated holding each action for 4 simulator steps."""
    fast = record("metaworld/reach-v3", 1, tmp_path / "fast", seed=0, resolution=32)
    slow = record("metaworld/reach-v3", 1, tmp_path / "slow", seed=0, resolution=32, action_repeat=4)
    ds = LeRobotV3Dataset(tmp_path / "slow")
    assert ds.fps == 20 and slow.fps == 20 and slow.kept == 1
    assert json.loads((tmp_path / "slow" / "meta" / "wamkit_recording.json").read_text())["action_repeat"] == 4
    assert slow.kept_lengths[0] < fast.kept_lengths[0] / 2

    overrides = {
        "job.name": '"slow"', "job.output_root": f'"{tmp_path}"', "data.path": f'"{tmp_path / "slow"}"',
        "data.generate_demo": "false", "data.val_fraction": "0.0", "model.pixel_spatial_factor": "8",
        "trainer.max_iter": "1", "checkpoint.save_iter": "1", "trainer.samples_per_step": "2",
        "trainer.progress_bar": "false", "trainer.val_every": "0", "scheduler.warm_up_steps": "[0]",
    }
    Trainer(load_experiment(RECIPE, [f"{k}={v}" for k, v in overrides.items()])).train()
    result = evaluate(tmp_path / "slow", "metaworld/reach-v3", 1, seed=1, max_episode_steps=16, num_steps=1,
                      out_dir=tmp_path / "eval", num_videos=1)
    assert result.max_episode_steps == 4  # 16 simulator steps = 4 held actions
    assert 1 <= result.per_episode[0].length <= 4
