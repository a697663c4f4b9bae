"""Policy: load a freshly trained tiny run, predict raw action chunks, reject bad inputs by name."""

import json

import numpy as np
import pytest
import torch

from tests.helpers import train_tiny_run
from wamkit.data import Normalizer
from wamkit.errors import CheckpointError
from wamkit.policy import Policy, config_from_dict
from wamkit.policy.policy import PolicyInputError



@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="module")
def policy(run_dir):
    return Policy.from_checkpoint(run_dir, num_steps=4)


def _obs(seed=0, prompt="move to the green target"):
    rng = np.random.default_rng(seed)
    return {"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "state": rng.uniform(0.2, 0.8, 4), "prompt": prompt}


def test_config_from_dict_round_trips_the_resolved_config(run_dir):
    data = json.loads((run_dir / "resolved_config.json").read_text())
    cfg = config_from_dict(data)
    assert cfg.model.max_action_dim == 8 and cfg.data.chunk_length == 8 and cfg.trainer.max_iter == 4
    with pytest.raises(Exception, match="model.not_a_knob"):
        config_from_dict({**data, "model": {**data["model"], "not_a_knob": 1}})


def test_predict_shapes_and_raw_units(policy):
    out = policy.predict([_obs(0), _obs(1)], seed=3)
    assert len(out) == 2
    for chunk in out:
        assert chunk.shape == (8, 3) and chunk.dtype == np.float32 and np.isfinite(chunk).all()
    # raw units: re-normalizing the output gives back exactly the sampler's normalized actions
    normalized = policy.predict_normalized([_obs(0), _obs(1)], seed=3)
    assert torch.count_nonzero(normalized[..., 3:]) == 0  # padded channels
    action_norm = Normalizer.from_state_dict(policy.contract["action_normalizer"])
    for chunk, norm in zip(out, normalized):
        np.testing.assert_allclose(action_norm.normalize(chunk.astype(np.float64)), norm[:, :3].double().numpy(), atol=1e-5, rtol=1e-5)
    # and values the sampler puts in [-1, 1] land inside the dataset's [min, max]
    lo, hi = (np.asarray(action_norm.params[k]) for k in ("min", "max"))
    for chunk, norm in zip(out, normalized):
        inside = (norm[:, :3].abs() <= 1).numpy()
        assert np.all((chunk >= lo - 1e-5) | ~inside) and np.all((chunk <= hi + 1e-5) | ~inside)


def test_same_seed_same_actions_and_batch_matches_singles(policy):
    a = policy.predict([_obs(0)], seed=11)[0]
    b = policy.predict([_obs(0)], seed=11)[0]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, policy.predict([_obs(0)], seed=12)[0])
    g = torch.Generator().manual_seed(4)
    batched = policy.predict([_obs(0), _obs(1)], seed=torch.Generator().manual_seed(4))
    singles = [policy.predict([o], seed=g)[0] for o in (_obs(0), _obs(1))]
    for x, y in zip(batched, singles):
        np.testing.assert_allclose(x, y, atol=1e-4, rtol=1e-4)


def test_ema_and_raw_weights_differ(run_dir, policy):
    raw = Policy.from_checkpoint(run_dir, use_ema=False, num_steps=4)
    ema_params = dict(policy.model.named_parameters())
    differs = [n for n, p in raw.model.named_parameters() if not torch.equal(p, ema_params[n])]
    assert differs and all("lm_head" not in n for n in differs)
    assert not np.allclose(raw.predict([_obs(0)], seed=1)[0], policy.predict([_obs(0)], seed=1)[0])


def test_raw_weights_are_refused_for_an_export_which_holds_one_set(run_dir, tmp_path):
    from wamkit.export import export_run
    from wamkit.policy.policy import load_policy
    from wamkit.worldmodel.rollout import WorldModel

    export = export_run(run_dir, tmp_path / "export")
    assert load_policy(run_dir, use_ema=False, num_steps=2).loaded.source["weights"] == "raw"
    with pytest.raises(CheckpointError, match="export --raw"):
        load_policy(export, use_ema=False)
    with pytest.raises(CheckpointError, match="export --raw"):  # `eval wm --raw` loads through the same door
        WorldModel.from_path(export, use_ema=False)


def test_iteration_dir_loads_like_the_run_dir(run_dir, policy):
    same = Policy.from_checkpoint(run_dir / "checkpoints" / "iter_000000004", num_steps=4)
    np.testing.assert_array_equal(same.predict([_obs(2)], seed=5)[0], policy.predict([_obs(2)], seed=5)[0])


@pytest.mark.parametrize("field, value, message", [
    ("image", np.zeros((64, 64, 3), np.float32), "dtype"),
    ("image", np.zeros((64, 64), np.uint8), "shape"),
    ("image", np.zeros((2, 64, 64, 3), np.uint8), "camera"),
    ("image", np.zeros((60, 64, 3), np.uint8), "spatial factor"),
    ("image", None, "missing"),
    ("state", np.zeros(3), r"expects \[4\]"),
    ("state", None, "missing"),
    ("state", np.array([0.0, np.nan, 0.0, 0.0]), "NaN"),
    ("prompt", None, "missing"),
    ("prompt", 7, "str"),
])
def test_bad_inputs_name_the_field(policy, field, value, message):
    obs = _obs(0)
    obs[field] = value
    with pytest.raises(PolicyInputError, match=message) as info:
        policy.predict([_obs(1), obs])
    assert f"observations[1]['{field}']" in str(info.value)


def test_observations_must_be_a_list(policy):
    with pytest.raises(PolicyInputError, match="list"):
        policy.predict(_obs(0))
    with pytest.raises(PolicyInputError, match="empty"):
        policy.predict([])


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        Policy.from_checkpoint(tmp_path / "nope")
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        Policy.from_checkpoint(tmp_path / "empty_run")


def test_use_ema_without_ema_weights_is_refused(tmp_path):
    run = train_tiny_run(tmp_path, "no_ema", ["ema.enabled=false"])
    with pytest.raises(CheckpointError, match="use_ema=False"):
        Policy.from_checkpoint(run)
    assert Policy.from_checkpoint(run, use_ema=False, num_steps=2).predict([_obs(0)])[0].shape == (8, 3)


def test_noise_scale_zero_samples_one_chunk_whatever_the_seed(run_dir):
    """The sampler's starting noise, scaled: at 0 every seed gives the mode-seeking chunk, at 1 seeds differ."""
    from wamkit.policy.policy import load_policy

    cold = load_policy(run_dir, num_steps=4, noise_scale=0.0)
    np.testing.assert_array_equal(cold.predict([_obs(0)], seed=11)[0], cold.predict([_obs(0)], seed=12)[0])
    warm = load_policy(run_dir, num_steps=4)
    assert warm.noise_scale == 1.0
    assert not np.allclose(warm.predict([_obs(0)], seed=11)[0], cold.predict([_obs(0)], seed=11)[0])
    with pytest.raises(PolicyInputError, match="noise_scale"):
        load_policy(run_dir, noise_scale=-0.5)
    with pytest.raises(PolicyInputError, match="noise_scale"):  # set on a loaded policy, checked the same way
        warm.noise_scale = float("nan")
    assert warm.noise_scale == 1.0
