"""The training-only goal head (`diffusion.goal_state_loss_weight`, wamkit.model.goal_head): what it predicts from,
what its loss adds, that it trains the trunk, and that nothing outside training ever sees it."""

import pytest
import torch

from wamkit.config.schema import DiffusionConfig
from wamkit.diffusion.objective import ModeObjective
from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import build_transformer, load_pretrained_weights
from wamkit.model.goal_head import GOAL_HEAD, attach_goal_head, goal_state_predictions
from wamkit.model.tokenizer import build_text_tokenizer, build_video_tokenizer
from wamkit.model.weights import is_action_head_param
from wamkit.policy.loading import place_for_inference
from tests.diffusion.test_modes import A, _gens, _samples


def _model(goal_head: bool):
    torch.manual_seed(0)
    model = build_transformer("tiny", 12, A, 4)
    if goal_head:
        attach_goal_head(model)
    return model


def _objective(weight: float, mode: str = "policy", **kwargs) -> ModeObjective:
    model = _model(weight > 0)
    return ModeObjective(model, build_video_tokenizer("pixel", "", 8), build_text_tokenizer("", 32),
                         DiffusionConfig(goal_state_loss_weight=weight, action_prediction="x0", action_loss="l1"),
                         "{task}", 10.0, "sdpa", mode=mode, **kwargs)


def test_predictions_average_each_samples_noisy_rows():
    rows = torch.arange(24.0).view(6, 4)
    merged = goal_state_predictions(rows, [3], merged_samples=2)
    torch.testing.assert_close(merged, torch.stack([rows[:3].mean(0), rows[3:].mean(0)]))
    # one item a sample; an item without noisy rows (forward dynamics) has no prediction
    torch.testing.assert_close(goal_state_predictions(rows, [2, 0, 4]), torch.stack([rows[:2].mean(0), rows[2:].mean(0)]))


def test_goal_loss_is_the_heads_error_on_the_episodes_last_state_and_adds_to_the_total():
    samples = _samples(3)
    plain = _objective(0.0)(samples, _gens(3))
    objective = _objective(4.0)
    losses = objective(samples, _gens(3))
    assert plain.goal_state is None and losses.goal_state > 0
    torch.testing.assert_close(losses.total, plain.total + 4.0 * losses.goal_state)  # the rest of the model is the same
    # by hand: the head on what action_proj_out read, each sample's rows averaged, L1 over the state's channels
    hidden = {}
    objective.model.action_proj_out.register_forward_hook(lambda m, args, out: hidden.update(x=args[0]))
    again = objective(samples, _gens(3))
    predicted = objective.model.action_goal_head(hidden["x"]).view(3, -1, A).mean(1)
    target = torch.stack([s.goal_state for s in samples])
    mask = torch.stack([s.state_mask for s in samples]).float()
    expected = (((predicted - target).abs() * mask).sum(1) / mask.sum(1)).mean()
    torch.testing.assert_close(again.goal_state, expected)


def test_goal_loss_trains_the_head_and_the_trunk_beneath_the_action_rows():
    models = []
    for weight in (0.0, 1.0):
        objective = _objective(weight)
        objective(_samples(2), _gens(2)).total.backward()
        models.append(objective.model)
    plain, with_goal = models
    assert getattr(with_goal, GOAL_HEAD).weight.grad.abs().sum() > 0
    # the goal reaches the action rows through the trunk: its loss moves the first layer's gradient
    trunk = lambda m: m.layers[0].self_attn.add_q_proj.weight.grad  # noqa: E731
    assert not torch.allclose(trunk(with_goal), trunk(plain))


def test_samples_without_noisy_action_rows_give_zero_goal_loss_with_a_zero_head_gradient():
    objective = _objective(2.0, mode="forward_dynamics")
    losses = objective(_samples(2), _gens(2))
    assert float(losses.goal_state) == 0.0
    losses.total.backward()
    assert torch.count_nonzero(getattr(objective.model, GOAL_HEAD).weight.grad) == 0


def test_missing_goal_states_and_a_model_without_the_head_are_named():
    samples = [s for s in _samples(2)]
    for s in samples:
        s.goal_state = None
    with pytest.raises(ValueError, match="goal_state"):
        _objective(1.0)(samples, _gens(2))
    with pytest.raises(ValueError, match="no action_goal_head"):
        ModeObjective(_model(False), build_video_tokenizer("pixel", "", 8), build_text_tokenizer("", 32),
                      DiffusionConfig(goal_state_loss_weight=1.0), "{task}", 10.0, "sdpa")


def test_the_head_trains_with_the_action_pathway_and_is_never_read_from_a_base(tmp_path):
    assert is_action_head_param(f"{GOAL_HEAD}.weight")  # its learning rate and LoRA's unfrozen action pathway
    _model(False).save_pretrained(tmp_path / "base" / "transformer")
    target = _model(True)
    load_pretrained_weights(target, tmp_path / "base", fresh_action_domain=None)  # no base holds the head
    assert hasattr(target, GOAL_HEAD)


def test_inference_and_export_see_the_plain_transformer():
    model = place_for_inference(_model(True), "cpu", torch.float32)
    assert not hasattr(model, GOAL_HEAD) and GOAL_HEAD not in str(list(model.state_dict()))


def test_config_validation():
    from wamkit.config import load_experiment

    base = ['data.path="x"']
    assert load_experiment(None, base + ["diffusion.goal_state_loss_weight=1"]).diffusion.goal_state_loss_weight == 1.0
    with pytest.raises(ConfigError, match="goal_state_loss_weight.*negative"):
        load_experiment(None, base + ["diffusion.goal_state_loss_weight=-1"])
    with pytest.raises(ConfigError, match="goal_state_horizon.*negative"):
        load_experiment(None, base + ["diffusion.goal_state_horizon=-1"])
    with pytest.raises(ConfigError, match="goal_state_loss_weight.*use_state"):
        load_experiment(None, base + ["diffusion.goal_state_loss_weight=1", "data.use_state=false"])
