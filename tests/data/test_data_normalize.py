"""Normalizer: numerics of each mode, inversion, serialization, and rejection of bad statistics."""

from __future__ import annotations

import json
import numpy as np
import pytest
import torch

from wamkit.data import NORMALIZATION_MODES, Normalizer
from wamkit.errors import DataError

STATS = {"action": {"min": [-2.0, 0.0], "max": [2.0, 10.0], "q01": [-1.0, 1.0], "q99": [1.0, 9.0],
                    "mean": [0.5, 5.0], "std": [2.0, 0.5]}}


def test_minmax_maps_min_max_to_unit_interval():
    norm = Normalizer.from_stats(STATS, "action", "minmax")
    x = np.array([[-2.0, 0.0], [2.0, 10.0], [0.0, 5.0]])
    np.testing.assert_allclose(norm.normalize(x), [[-1, -1], [1, 1], [0, 0]])
    np.testing.assert_allclose(norm.denormalize(norm.normalize(x)), x)


def test_quantile_maps_and_clips():
    norm = Normalizer.from_stats(STATS, "action", "quantile")
    x = np.array([[-1.0, 1.0], [1.0, 9.0], [5.0, -100.0]])
    np.testing.assert_allclose(norm.normalize(x), [[-1, -1], [1, 1], [1, -1]])
    inside = np.array([[0.25, 3.0]])
    np.testing.assert_allclose(norm.denormalize(norm.normalize(inside)), inside)


def test_meanstd_zero_mean_unit_std():
    norm = Normalizer.from_stats(STATS, "action", "meanstd")
    np.testing.assert_allclose(norm.normalize(np.array([0.5, 5.0])), [0, 0])
    np.testing.assert_allclose(norm.normalize(np.array([2.5, 5.5])), [1, 1])
    rng = np.random.default_rng(0)
    data = rng.normal([3.0, -1.0], [4.0, 0.1], size=(20000, 2))
    fitted = Normalizer("x", "meanstd", {"mean": data.mean(0), "std": data.std(0)})
    y = fitted.normalize(data)
    np.testing.assert_allclose(y.mean(0), 0, atol=1e-9)
    np.testing.assert_allclose(y.std(0), 1, atol=1e-9)


def test_none_is_identity_and_needs_no_stats():
    norm = Normalizer.from_stats(None, "action", "none")
    x = torch.randn(3, 5)
    assert norm.normalize(x) is x and norm.denormalize(x) is x and norm.dim is None


def test_torch_keeps_dtype_and_round_trips():
    norm = Normalizer.from_stats(STATS, "action", "minmax")
    x = torch.tensor([[[-2.0, 0.0], [1.0, 7.5]]])
    y = norm.normalize(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.shape == x.shape
    torch.testing.assert_close(y, torch.tensor([[[-1.0, -1.0], [0.5, 0.5]]]))
    torch.testing.assert_close(norm.denormalize(y), x)


@pytest.mark.parametrize("mode", NORMALIZATION_MODES)
def test_state_dict_round_trip(mode):
    norm = Normalizer.from_stats(STATS, "action", mode)
    state = norm.state_dict()
    assert all(isinstance(v, list) for v in state["params"].values())
    again = Normalizer.from_state_dict(state)
    x = np.array([[0.3, 4.0]])
    np.testing.assert_allclose(again.normalize(x), norm.normalize(x))


def _bad(**fields):
    stats = {"action": {k: list(v) for k, v in STATS["action"].items()}}
    stats["action"].update(fields)
    return stats


def test_zero_range_names_field_and_channel():
    """max below min, or a zero q01..q99 / std on a channel whose min..max varies: stats that cannot be true."""
    with pytest.raises(DataError, match=r'stats\["action"\]\["max"\]\[1\].*zero range') as err:
        Normalizer.from_stats(_bad(max=[2.0, -1.0]), "action", "minmax")
    assert "meta/stats.json" in str(err.value) and "min == max" in err.value.fix
    with pytest.raises(DataError, match=r'\["q99"\]\[0\]'):
        Normalizer.from_stats(_bad(q99=[-1.0, 9.0]), "action", "quantile")
    with pytest.raises(DataError, match=r'\["std"\]\[1\].*std is 0.0'):
        Normalizer.from_stats(_bad(std=[1.0, 0.0]), "action", "meanstd")


def test_nan_and_inf_rejected():
    with pytest.raises(DataError, match=r'my/stats.json: stats\["action"\]\["q01"\]\[1\].*NaN'):
        Normalizer.from_stats(_bad(q01=[0.0, float("nan")]), "action", "quantile", source="my/stats.json")
    with pytest.raises(DataError, match=r'\["mean"\]\[0\]'):
        Normalizer.from_stats(_bad(mean=[float("inf"), 0.0]), "action", "meanstd")


def test_missing_key_field_and_file():
    with pytest.raises(DataError, match=r"stats\['observation.state'\].*no statistics"):
        Normalizer.from_stats(STATS, "observation.state", "minmax")
    stats = _bad()
    del stats["action"]["q99"]
    with pytest.raises(DataError, match=r'stats\["action"\]\["q99"\].*missing'):
        Normalizer.from_stats(stats, "action", "quantile")
    with pytest.raises(DataError, match="statistics file is missing"):
        Normalizer.from_stats(None, "action", "minmax")
    with pytest.raises(DataError, match="'zscore' is not supported"):
        Normalizer.from_stats(STATS, "action", "zscore")


def test_channel_count_mismatch():
    norm = Normalizer.from_stats(STATS, "action", "minmax")
    with pytest.raises(DataError, match="stats have 2 channels but the data has 3"):
        norm.normalize(np.zeros((4, 3)))


def test_demo_stats_are_usable(demo_ds):
    for key in ("action", "observation.state"):
        for mode in NORMALIZATION_MODES:
            Normalizer.from_stats(demo_ds.stats, key, mode)


# ---- asinh ---------------------------------------------------------------------------------------
def test_asinh_uses_std_and_round_trips():
    norm = Normalizer.from_stats(STATS, "action", "asinh")
    assert "asinh" in NORMALIZATION_MODES
    x = np.array([[-50.0, 0.0], [3.0, 1e4], [0.5, -7.0]])
    np.testing.assert_allclose(norm.normalize(x), np.arcsinh(x / np.array([2.0, 0.5])))
    np.testing.assert_allclose(norm.denormalize(norm.normalize(x)), x, rtol=1e-12)
    t = torch.tensor(x, dtype=torch.float64)
    torch.testing.assert_close(norm.denormalize(norm.normalize(t)), t)


def test_asinh_prefers_asinh_scale_and_serializes():
    stats = {"action": {**STATS["action"], "asinh_scale": [4.0, 0.1]}}
    norm = Normalizer.from_stats(stats, "action", "asinh")
    x = np.array([[8.0, 0.1]])
    np.testing.assert_allclose(norm.normalize(x), np.arcsinh([[2.0, 1.0]]))
    again = Normalizer.from_state_dict(norm.state_dict())
    np.testing.assert_allclose(again.normalize(x), norm.normalize(x))


def test_asinh_rejects_bad_scale():
    with pytest.raises(DataError, match=r'\["asinh_scale"\]\[1\]'):
        Normalizer.from_stats({"action": {"asinh_scale": [1.0, 0.0]}}, "action", "asinh")
    with pytest.raises(DataError, match="asinh_scale' or 'std'"):
        Normalizer.from_stats({"action": {"min": [0.0], "max": [1.0]}}, "action", "asinh")


# ---- constant channels -----------------------------------------------------------------------------
CONST = {"action": {"min": [-2.0, 0.7], "max": [2.0, 0.7], "q01": [-1.0, 0.7], "q99": [1.0, 0.7],
                    "mean": [0.5, 0.7], "std": [2.0, 0.0], "count": [100]}}


@pytest.mark.parametrize("mode", [m for m in NORMALIZATION_MODES if m != "none"])
def test_constant_channel_maps_to_zero_and_back_exactly(mode):
    """min == max: 0 in every mode, and exactly the constant back (also from a JSON'd state_dict, and
    whatever the model predicts there), in numpy and torch."""
    norm = Normalizer.from_stats(CONST, "action", mode)
    assert norm.constant == {1: 0.7}
    x = np.array([[0.3, 0.7], [-0.9, 0.7]], dtype=np.float32)
    y = norm.normalize(x)
    assert np.all(y[:, 1] == 0.0) and np.all(np.isfinite(y))
    np.testing.assert_allclose(norm.denormalize(y)[:, 0], x[:, 0], rtol=1e-6)
    assert np.all(norm.denormalize(y)[:, 1] == np.float32(0.7))
    again = Normalizer.from_state_dict(json.loads(json.dumps(norm.state_dict())))
    noisy = torch.tensor(y, dtype=torch.float64) + 0.37
    assert torch.all(again.denormalize(noisy)[:, 1] == 0.7)
    assert torch.all(again.normalize(torch.tensor(x))[:, 1] == 0.0)


def test_old_state_dict_without_constant_key_loads():
    state = Normalizer.from_stats(STATS, "action", "minmax").state_dict()
    del state["constant"]
    again = Normalizer.from_state_dict(state)
    assert again.constant == {} and again.normalize(np.array([2.0, 10.0])).tolist() == [1.0, 1.0]


def test_check_constant_rejects_data_that_varies():
    norm = Normalizer.from_stats(CONST, "action", "minmax")
    norm.check_constant(np.array([[0.1, 0.7], [5.0, 0.7]]), "ep 0")  # the other channel may vary freely
    with pytest.raises(DataError, match=r'stats\["action"\]\["max"\]\[1\].*constant \(0.7\).*ep 3.*0.7 to 0.9'):
        norm.check_constant(np.array([[0.1, 0.7], [0.2, 0.9]]), "ep 3")


def test_quantile_zero_range_with_varying_min_max_stays_an_error():
    stats = {"action": {**CONST["action"], "max": [2.0, 0.9]}}  # q01 == q99 but the channel varies
    with pytest.raises(DataError, match=r'\["q99"\]\[1\].*zero range'):
        Normalizer.from_stats(stats, "action", "quantile")
    with pytest.raises(DataError, match=r'\["std"\]\[1\]'):
        Normalizer.from_stats(stats, "action", "meanstd")
