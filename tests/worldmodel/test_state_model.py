"""The affine state model that advances a robot state through an imagined rollout (wm-policy --state affine)."""

import numpy as np
import pytest

from wamkit.worldmodel.state_model import AffineStateModel, StateTrack


def _lagged_arm(rng, length: int, lag: float = 0.3):
    """An end effector that moves by 0.01 x its action, part of it one step late, its gripper value following
    the last command (like a mocap-driven arm); states [L, 4], actions [L, 4]."""
    actions = rng.uniform(-1, 1, (length, 4))
    states = np.zeros((length, 4))
    states[0] = rng.uniform(-0.2, 0.2, 4)
    for t in range(length - 1):
        previous = actions[t - 1] if t else np.zeros(4)
        states[t + 1, :3] = states[t, :3] + 0.01 * ((1 - lag) * actions[t, :3] + lag * previous[:3])
        states[t + 1, 3] = 0.5 * states[t, 3] + 0.25 * actions[t, 3]
    return states, actions


def test_fit_recovers_a_lagged_controller_and_reports_it_on_other_episodes():
    rng = np.random.default_rng(0)
    fit = [_lagged_arm(rng, 60) for _ in range(20)]
    held = [_lagged_arm(rng, 60) for _ in range(4)]
    model = AffineStateModel.fit([s for s, _ in fit], [a for _, a in fit])
    assert model.transitions == 20 * 59
    report = model.fit_report([s for s, _ in held], [a for _, a in held])
    assert report["episodes"] == 4 and min(report["step_change_r2"]) > 0.99  # clipped where a held-out episode leaves the fitted range
    assert max(report["final_drift"]) < 5e-3  # an open-loop roll of 59 steps stays near the recorded states
    states, actions = held[0]
    rolled = model.roll(states[0], actions)
    assert rolled.shape == states.shape and np.allclose(rolled, np.clip(states, model.low, model.high), atol=5e-3)


def test_a_poor_fit_shows_in_the_report():
    rng = np.random.default_rng(1)
    states = [rng.normal(size=(40, 2)) for _ in range(5)]  # a state that ignores the actions: nothing to explain
    actions = [rng.normal(size=(40, 2)) for _ in range(5)]
    model = AffineStateModel.fit(states, actions)
    assert max(model.fit_report(states, actions)["step_change_r2"]) < 0.8


def test_states_are_clipped_to_the_recorded_range_and_constant_values_stay_solvable():
    states = [np.stack([np.linspace(0, 1, 11), np.full(11, 0.5)], 1)]  # the second value never moves
    actions = [np.full((11, 1), 1.0)]
    model = AffineStateModel.fit(states, actions)
    far = model.roll(np.array([1.0, 0.5]), np.full((30, 1), 1.0))
    assert far[:, 0].max() <= 1.0 + 1e-12 and np.allclose(far[:, 1], 0.5)
    assert np.isnan(model.fit_report(states, actions)["step_change_r2"][1])  # no change to explain: no R^2


def test_fit_refuses_mismatched_or_empty_episodes():
    with pytest.raises(ValueError, match="3 state rows and 4 action rows"):
        AffineStateModel.fit([np.zeros((3, 2))], [np.zeros((4, 1))])
    with pytest.raises(ValueError, match="two or more steps"):
        AffineStateModel.fit([np.zeros((1, 2))], [np.zeros((1, 1))])


def test_track_holds_the_recorded_state_or_advances_it_with_the_actions_taken():
    rng = np.random.default_rng(2)
    fit = [_lagged_arm(rng, 50) for _ in range(10)]
    model = AffineStateModel.fit([s for s, _ in fit], [a for _, a in fit])
    recorded = [fit[0][0][:5], fit[1][0][:5]]  # 5 recorded steps: held at the last beyond them
    track = StateTrack(recorded)
    track.advance(np.zeros((2, 7, 4)))
    assert np.array_equal(track.now(), np.stack([recorded[0][4], recorded[1][4]]))

    mine = np.full((2, 6, 4), 0.5)  # the policy's own actions, not the recorded ones
    affine = StateTrack([s for s, _ in fit[:2]], model)
    assert np.array_equal(affine.now(), np.stack([fit[0][0][0], fit[1][0][0]]))  # starts at the recorded first state
    affine.advance(mine[:, :4])
    affine.advance(mine[:, 4:])  # two chunks in a row: the lag carries over
    expected = np.stack([model.roll(fit[i][0][0], np.concatenate([mine[i], mine[i][:1]]))[-1] for i in range(2)])
    assert np.allclose(affine.now(), expected)
    assert not np.allclose(affine.now(), np.stack([fit[0][0][6], fit[1][0][6]]), atol=1e-3)  # not the recorded path
