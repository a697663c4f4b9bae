"""eval.expert_agreement: per action dimension, how often the policy moved the way the scripted expert firmly asked
and how far apart they were, in half ranges of the action bounds, over all episodes and over the failed ones."""

import numpy as np

from wamkit.eval.expert_agreement import agreement, agreement_line

NAMES = ("dx", "grip")
BOUNDS = ((-1.0, 0.0), (1.0, 2.0))  # grip's range is [0, 2]: its centre 1 is "no move"


def test_a_policy_that_ignores_the_lateral_direction_follows_none_of_the_expert_s_firm_moves():
    expert = [np.array([[1.0, 2.0], [-1.0, 2.0], [0.1, 1.0]]), np.array([[1.0, 0.0]])]
    frozen = [np.array([[0.0, 2.0], [0.0, 2.0], [0.0, 1.0]]), np.array([[0.0, 0.0]])]  # dx always 0
    out = agreement(frozen, expert, [False, True], NAMES, BOUNDS)
    assert out["all"]["steps"] == 4 and out["failed"]["steps"] == 1
    assert out["all"]["same_direction"][0] == 0.0  # 3 firm dx moves (|0.1| is not firm), none followed
    assert out["all"]["same_direction"][1] == 1.0  # grip: the firm moves (2 -> +1, 0 -> -1 in half ranges) all followed
    np.testing.assert_allclose(out["all"]["mean_abs_diff"], [(1 + 1 + 0.1 + 1) / 4, 0.0])
    assert "dx 0% (failed episodes 0%)" in agreement_line(out)


def test_the_expert_itself_agrees_fully_and_no_failures_means_no_failed_summary():
    expert = [np.array([[0.5, 1.5], [-0.3, 0.5]])]
    out = agreement(expert, expert, [False], NAMES, BOUNDS)
    assert out["all"]["same_direction"] == [1.0, 1.0] and out["all"]["mean_abs_diff"] == [0.0, 0.0]
    assert out["failed"] is None and "failed episodes -" in agreement_line(out)


def test_a_dimension_the_expert_never_moves_firmly_has_no_share():
    expert = [np.array([[0.05, 1.0], [0.0, 1.1]])]
    out = agreement([np.zeros((2, 2))], expert, [True], NAMES, BOUNDS)
    assert out["all"]["same_direction"] == [None, None] and out["failed"]["steps"] == 2
