"""Real-time chunking in Policy.predict: the committed actions come back at the head of the new chunk,
zero guidance is plain sampling, bad RTC inputs are named."""

import math

import numpy as np
import pytest
import torch

from tests.helpers import VELOCITY_HEAD, train_tiny_run
from wamkit.diffusion.rtc import guidance_weight, soft_mask
from wamkit.errors import WamkitError
from wamkit.policy import Policy
from wamkit.policy.policy import PolicyInputError


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """The velocity action head (tests.helpers.VELOCITY_HEAD): steering has two plans to reconcile."""
    return Policy.from_checkpoint(train_tiny_run(tmp_path_factory.mktemp("rtc"), extra=VELOCITY_HEAD), num_steps=4)


def _obs(seed=0):
    rng = np.random.default_rng(seed)
    return {"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "state": rng.uniform(0.2, 0.8, 4),
            "prompt": "move to the green target"}


def test_soft_mask_is_the_papers():
    w = soft_mask(10, 2, 7).double()
    assert w[:2].tolist() == [1.0, 1.0] and w[7:].tolist() == [0.0, 0.0, 0.0]
    for i in range(2, 7):  # c_i (e^c_i - 1) / (e - 1), c_i = (H - s - i) / (H - s - d + 1)
        c = (7 - i) / 6
        assert w[i].item() == pytest.approx(c * math.expm1(c) / (math.e - 1), rel=1e-6)
    assert torch.all(w[2:7].diff() < 0) and 0 < w[6] < w[2] < 1
    assert soft_mask(8, 3, 3).tolist() == [1, 1, 1, 0, 0, 0, 0, 0]  # horizon == delay: hard inpainting
    with pytest.raises(ValueError, match="delay"):
        soft_mask(8, 5, 4)


def test_guidance_weight_is_clipped():
    assert guidance_weight(1.0, 5.0) == 5.0 and guidance_weight(0.999, 5.0) == 5.0
    assert guidance_weight(0.5, 5.0) == pytest.approx(2.0)  # (0.25 + 0.25) / 0.25
    assert guidance_weight(0.5, 1.5) == 1.5 and guidance_weight(0.5, 0.0) == 0.0


def test_first_delay_actions_follow_the_committed_ones(policy):
    obs, d = _obs(0), 3
    committed = policy.predict([obs], seed=1)[0]  # the previous chunk (another noise draw: another plan)
    plain = policy.predict([obs], seed=2)[0]
    steered = policy.predict([{**obs, "committed_actions": committed, "inference_delay": d}], seed=2)[0]
    scale = np.abs(committed).mean()
    free_gap = np.abs(plain[:d] - committed[:d]).mean()
    rtc_gap = np.abs(steered[:d] - committed[:d]).mean()
    assert free_gap > 0.2 * scale  # without guidance the two draws disagree
    assert rtc_gap < 0.1 * free_gap and rtc_gap < 0.05 * scale
    assert steered.shape == plain.shape and np.isfinite(steered).all()
    assert not np.allclose(steered[d:], committed[d:], atol=1e-3)  # the rest is sampled, not copied


def test_zero_guidance_equals_plain_predict(policy, monkeypatch):
    obs = _obs(1)
    committed = policy.predict([obs], seed=5)[0][:6]
    plain = policy.predict([obs], seed=6)[0]
    monkeypatch.setattr(policy, "rtc_max_guidance", 0.0)
    unguided = policy.predict([{**obs, "committed_actions": committed, "inference_delay": 2}], seed=6)[0]
    np.testing.assert_allclose(unguided, plain, atol=1e-5, rtol=1e-5)  # same noise, the gradient path runs


def test_a_steered_sample_leaves_its_batch_mates_alone(policy):
    a, b = _obs(2), _obs(3)
    committed = policy.predict([a], seed=7)[0]
    g = torch.Generator().manual_seed(9)
    batched = policy.predict([{**a, "committed_actions": committed, "inference_delay": 2}, b],
                             seed=torch.Generator().manual_seed(9))
    alone = [policy.predict([{**a, "committed_actions": committed, "inference_delay": 2}], seed=g)[0],
             policy.predict([b], seed=g)[0]]
    for x, y in zip(batched, alone):
        np.testing.assert_allclose(x, y, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("extra, field, message", [
    ({"committed_actions": np.zeros((4, 2))}, "committed_actions", r"shape is \(4, 2\), expected \[K, 3\]"),
    ({"committed_actions": np.zeros((9, 3)), "inference_delay": 1}, "committed_actions", r"1 <= K <= 8"),
    ({"committed_actions": np.full((4, 3), np.nan), "inference_delay": 1}, "committed_actions", "NaN"),
    ({"committed_actions": np.zeros((4, 3))}, "inference_delay", "is missing"),
    ({"committed_actions": np.zeros((4, 3)), "inference_delay": 5}, "inference_delay", "len"),
    ({"committed_actions": np.zeros((4, 3)), "inference_delay": 1.0}, "inference_delay", "int"),
    ({"committed_actions": np.zeros((4, 3)), "inference_delay": 2, "execution_horizon": 1}, "execution_horizon", "<= horizon"),
    ({"inference_delay": 2}, "inference_delay", "without 'committed_actions'"),
])
def test_bad_rtc_inputs_name_the_field(policy, extra, field, message):
    with pytest.raises(PolicyInputError, match=message) as info:
        policy.predict([{**_obs(0), **extra}])
    assert info.value.where == f"observations[0]['{field}']"


def test_negative_guidance_clip_is_refused(policy):
    with pytest.raises(WamkitError, match="rtc_max_guidance"):
        Policy(policy.loaded, rtc_max_guidance=-1.0)
