"""The best dense reward of an episode (Meta-World's shaped reward): carried by every simulator step, kept
through held actions, and reported beside success, so failed episodes still say how close they came."""

import numpy as np
import pytest

import wamkit.sim  # noqa: F401 - picks the headless GL backend before metaworld imports mujoco
from wamkit.eval import EvalResult, wilson_interval
from wamkit.eval.report import write_report
from wamkit.eval.sim_eval import EpisodeResult, mean_sem
from wamkit.eval.suite import suite_of
from wamkit.sim.base import higher_reward
from wamkit.sim.control_rate import ActionRepeat
from wamkit.sim.envs import make_env


def test_the_running_best_ignores_steps_without_a_reward():
    assert higher_reward(None, None) is None and higher_reward(None, 0.5) == 0.5
    assert higher_reward(2.0, None) == 2.0 and higher_reward(2.0, 3.0) == 3.0 and higher_reward(3.0, 2.0) == 3.0


def test_meta_world_steps_carry_the_shaped_reward_which_the_expert_raises_to_its_success_value():
    with make_env("metaworld/reach-v3", resolution=32) as env:
        env.reset(1000)
        still = [env.step(np.zeros(4, np.float32), observe=False).reward for _ in range(5)]
        env.reset(1000)
        rewards, result = [], None
        for _ in range(env.max_episode_steps):
            result = env.step(env.expert_action(), observe=False)
            rewards.append(result.reward)
            if result.success:
                break
    assert all(isinstance(r, float) for r in still + rewards)
    assert result.success and rewards[-1] == pytest.approx(10.0)  # reach's reward at success
    assert max(still) < 2.0 < max(rewards)


def test_held_actions_report_the_best_reward_of_their_simulator_steps():
    action = np.array([1.0, 0.0, 0.0, 0.0], np.float32)  # the hand moves: the reward changes every step
    with make_env("metaworld/reach-v3", resolution=32) as inner, make_env("metaworld/reach-v3", resolution=32) as twin:
        held = ActionRepeat(inner, 3)
        held.reset(1001), twin.reset(1001)
        for _ in range(4):
            got = held.step(action, observe=False).reward
            assert got == pytest.approx(max(twin.step(action, observe=False).reward for _ in range(3)))


def _result(rewards, successes, env="metaworld/push-v3"):
    episodes = [EpisodeResult(i, i, ok, 10, 2, best_reward=r) for i, (ok, r) in enumerate(zip(successes, rewards))]
    known = None not in rewards
    mean, se = mean_sem(rewards) if known else (None, None)
    k = sum(successes)
    return EvalResult(env_name=env, task=env, episodes=len(episodes), successes=k, success_rate=k / len(episodes),
                      ci95=wilson_interval(k, len(episodes)), mean_episode_length=10.0, mean_success_length=None,
                      execute_horizon=8, chunk_length=8, max_episode_steps=200, resolution=64, seed=1, num_steps=2,
                      policy_source={}, training_step=7, seconds=1.0, per_episode=episodes, mean_best_reward=mean,
                      best_reward_se=se)


def test_reports_show_the_mean_best_reward_only_where_the_sim_gives_one(tmp_path):
    assert mean_sem([1.0, 3.0]) == pytest.approx((2.0, 1.0)) and mean_sem([4.0]) == (4.0, None)
    graded = _result([0.5, 1.5], [False, False])
    assert "- best reward: 1.00 ± 0.50, the mean" in write_report(graded, tmp_path / "a").read_text()
    assert "- best reward: 7.00, the mean" in write_report(_result([7.0], [False]), tmp_path / "c").read_text()  # one episode
    assert "best reward" not in write_report(_result([None, None], [False, True]), tmp_path / "b").read_text()

    both = [graded, _result([10.0, 2.0], [True, False], env="metaworld/reach-v3")]
    for task in both:
        task.out_dir = str(tmp_path / "suite" / task.env_name.replace("/", "_"))
    suite = suite_of(both, 1.0, tmp_path / "suite")
    assert suite.mean_best_reward == pytest.approx((1.0 + 6.0) / 2) and suite.to_json()["per_task_best_reward"] == {
        "metaworld/push-v3": 1.0, "metaworld/reach-v3": 6.0}
    report = (tmp_path / "suite" / "report.md").read_text()
    assert "| 1.00 ± 0.50 |" in report and "| 6.00 ± 4.00 |" in report and "| 3.50 |" in report

    mixed = suite_of([graded, _result([None, None], [False, False], env="so101/pick-place")], 1.0, None)
    assert mixed.mean_best_reward is None  # one task without a reward: no average of unlike things
