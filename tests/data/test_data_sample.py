"""SampleTransform: normalization, padding, masks, camera tiling, dimension errors."""

from __future__ import annotations

import pytest
import torch

from wamkit.data import Normalizer, SampleTransform, Window, WindowDataset
from wamkit.errors import DataError

T = 6


@pytest.fixture(scope="module")
def window(demo_ds):
    return WindowDataset(demo_ds, [4], chunk_length=T)[10]


@pytest.fixture(scope="module")
def norms(demo_ds):
    return (Normalizer.from_stats(demo_ds.stats, "action", "quantile"),
            Normalizer.from_stats(demo_ds.stats, "observation.state", "minmax"))


def test_sample_normalized_padded_masked(window, norms):
    act_norm, state_norm = norms
    sample = SampleTransform(act_norm, state_norm, max_action_dim=8, use_state=True, domain_id=3)(window)
    assert sample.video.shape == (T + 1, 64, 64, 3) and sample.video.dtype == torch.uint8
    assert torch.equal(sample.video, window.video[0])
    assert sample.actions.shape == (T, 8) and sample.actions.dtype == torch.float32
    torch.testing.assert_close(sample.actions[:, :3], act_norm.normalize(window.action))
    assert torch.all(sample.actions[:, 3:] == 0)
    assert sample.actions[:, :3].abs().max() <= 1.0
    assert sample.action_mask.tolist() == [True] * 3 + [False] * 5
    assert sample.state.shape == (8,)
    torch.testing.assert_close(sample.state[:4], state_norm.normalize(window.state[0]))
    assert torch.all(sample.state[4:] == 0)
    assert sample.task == window.task and sample.domain_id == 3


def test_goal_state_is_the_episodes_last_state(demo_ds, window, norms):
    """diffusion.goal_state_loss_weight's target: every window of an episode carries the state of its last frame
    (asked for with a goal horizon; without one nothing past the window is read)."""
    assert window.goal_state is None
    window = WindowDataset(demo_ds, [4], chunk_length=T, goal_horizon=0)[10]
    last = torch.from_numpy(demo_ds.episode_columns(4, ["observation.state"])["observation.state"][-1]).float()
    assert window.start == 10 and torch.equal(window.goal_state, last)
    sample = SampleTransform(*norms, max_action_dim=8, use_state=True, domain_id=0)(window)
    torch.testing.assert_close(sample.goal_state[:4], norms[1].normalize(last))
    assert torch.all(sample.goal_state[4:] == 0) and sample.state_mask.tolist() == [True] * 4 + [False] * 4


def test_goal_horizon_takes_the_state_that_many_frames_ahead_within_the_episode(demo_ds):
    states = demo_ds.episode_columns(4, ["observation.state"])["observation.state"]
    ahead = WindowDataset(demo_ds, [4], chunk_length=T, goal_horizon=10)
    assert torch.equal(ahead[10].goal_state, torch.from_numpy(states[10 + 10]).float())
    late = ahead[len(ahead) - 1]  # the last window's start + 10 lies past the episode: its last frame
    assert late.start + 10 > len(states) - 1 and torch.equal(late.goal_state, torch.from_numpy(states[-1]).float())


def test_without_state(window, norms):
    sample = SampleTransform(norms[0], None, max_action_dim=3, use_state=False, domain_id=0)(window)
    assert sample.state is None and sample.action_mask.all()


def test_cameras_tiled_side_by_side(window, norms):
    left = window.video[0]
    right = 255 - left
    two = Window(torch.stack([left, right]), window.state, window.action, window.task, 4, 10)
    sample = SampleTransform(norms[0], None, 8, use_state=False, domain_id=0)(two)
    assert sample.video.shape == (T + 1, 64, 128, 3)
    assert torch.equal(sample.video[:, :, :64], left) and torch.equal(sample.video[:, :, 64:], right)


def test_action_dim_too_large(norms):
    with pytest.raises(DataError, match=r"model.max_action_dim.*is 2.*'action' has 3 channels") as err:
        SampleTransform(norms[0], None, max_action_dim=2, use_state=False, domain_id=0)
    assert "at least 3" in err.value.fix


def test_state_dim_too_large(norms):
    with pytest.raises(DataError, match=r"model.max_action_dim.*'observation.state' has 4 channels"):
        SampleTransform(norms[0], norms[1], max_action_dim=3, use_state=True, domain_id=0)


def test_dim_checked_on_data_for_mode_none(window):
    """Mode 'none' has no stats width, so the check happens on the window itself."""
    transform = SampleTransform(Normalizer.from_stats(None, "action", "none"), None, 2, False, 0)
    with pytest.raises(DataError, match="model.max_action_dim"):
        transform(window)


def test_use_state_without_state(window, norms):
    with pytest.raises(DataError, match="data.use_state"):
        SampleTransform(norms[0], None, 8, use_state=True, domain_id=0)
    stateless = Window(window.video, None, window.action, window.task, 4, 10)
    with pytest.raises(DataError, match="data.use_state.*has no state"):
        SampleTransform(norms[0], norms[1], 8, use_state=True, domain_id=0)(stateless)
