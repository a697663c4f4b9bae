"""Per-channel normalization of state/action vectors from dataset statistics.

The model predicts actions in a normalized space; the same parameters must be used to denormalize at
inference, so a Normalizer serializes to plain lists and travels inside checkpoints. Bad statistics
(missing, NaN, zero range) would silently produce inf/NaN losses, so they are rejected up front.

A channel whose recorded values are constant (min == max: an unused gripper, a fixed joint, a padded
dim) is not bad statistics: every mode maps it to exactly 0 and back to exactly its value, and the
state_dict carries which channels those are ("constant"), so a checkpoint's contract round-trips it.
Whether the data really is constant there is checked against the parquets by the doctor and by
training (Normalizer.check_constant).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from wamkit.errors import DataError

from wamkit.config.schema import NORMALIZATION_MODES  # one list for recipes and the data layer
_FIELDS = {"minmax": ("min", "max"), "quantile": ("q01", "q99"), "meanstd": ("mean", "std"), "none": (),
           "asinh": ("scale",)}
# asinh: y = asinh(x / scale), scale per channel = stats["asinh_scale"] if present, else stats["std"];
# its params hold the resolved "scale" (so a state_dict round-trips without the original stats).
_FIX_ZERO = ("recompute meta/stats.json (`wamkit data stats PATH --overwrite`); a constant channel needs "
             "min == max, or use 'minmax' or 'meanstd' for this feature")
# max - min (or the data's spread) within this fraction of max(1, |value|) is rounding: a constant channel
CONSTANT_RTOL = 1e-6


def constant_channels(fields: Mapping[str, Any]) -> dict[int, float]:
    """{channel: value} of the channels the stats record as constant: 0 <= max - min <= rounding (value
    the midpoint, i.e. min when equal); without min/max, std == 0 (value the mean)."""
    def arr(name):
        return np.asarray(fields[name], dtype=np.float64).reshape(-1) if name in fields else None

    if "min" in fields and "max" in fields:
        lo, hi = arr("min"), arr("max")
        width, value = hi - lo, (lo + hi) / 2.0
    elif "mean" in fields and "std" in fields:
        value, width = arr("mean"), arr("std")
    else:
        return {}
    if width.shape != value.shape:
        return {}
    with np.errstate(invalid="ignore"):
        ok = (width >= 0) & (width <= CONSTANT_RTOL * np.maximum(1.0, np.abs(value))) & np.isfinite(value)
    return {int(c): float(value[c]) for c in np.flatnonzero(ok)}


class Normalizer:
    """Maps one feature's channels (last axis) to a normalized range and back."""

    def __init__(self, key: str, mode: str, params: Mapping[str, np.ndarray], source: str = "meta/stats.json",
                 constant: Mapping[int, float] | None = None):
        """`constant` {channel: value}: channels recorded as constant; None -> read from `params`."""
        _check_mode(mode, source)
        self.key, self.mode, self.source = key, mode, source
        self._scale_source = "scale"
        if constant is None:
            constant = constant_channels(params) if mode != "none" else {}
        if mode == "asinh":
            params = _asinh_params(params, key, source)
            self._scale_source = params.pop("_scale_source")
        self.params = {name: _check_field(params, key, name, source) for name in _FIELDS[mode]}
        _check_same_dim(self.params, key, source)
        self.constant = _check_constant(constant, self.dim, key, source)
        self._check_range()

    @classmethod
    def from_stats(cls, stats: Mapping[str, Mapping[str, Any]] | None, key: str, mode: str,
                   source: str = "meta/stats.json") -> "Normalizer":
        """Build from a stats dict (as in meta/stats.json); mode 'none' needs no stats."""
        _check_mode(mode, source)
        if mode == "none":
            return cls(key, mode, {}, source)
        if stats is None:
            raise DataError(source, "statistics file is missing", f"compute stats for {key!r} (e.g. "
                            "wamkit.data.compute_stats) and write meta/stats.json, or use normalization 'none'")
        if key not in stats:
            raise DataError(f"{source}: stats[{key!r}]", f"no statistics for feature {key!r} (have {sorted(stats)})",
                            "recompute meta/stats.json including this feature")
        return cls(key, mode, stats[key], source, constant_channels(stats[key]))

    @property
    def dim(self) -> int | None:
        """Number of channels, or None for mode 'none' (any width)."""
        return None if not self.params else int(next(iter(self.params.values())).shape[0])

    def _mask(self) -> np.ndarray:
        """True at the constant channels."""
        mask = np.zeros(self.dim or 0, dtype=bool)
        mask[list(self.constant)] = True
        return mask

    def _check_range(self) -> None:
        """Zero range would divide by zero: name the first offending channel (constant channels aside)."""
        if self.mode == "none":
            return
        varies = ~self._mask()
        if self.mode == "asinh":
            bad = np.flatnonzero(~(self.params["scale"] > 0) & varies)
            if bad.size:
                c = int(bad[0])
                raise DataError(f'{self.source}: stats["{self.key}"]["{self._scale_source}"][{c}]',
                                f"asinh scale is {self.params['scale'][c]} at channel {c} (zero or negative)",
                                _FIX_ZERO)
            return
        lo_name, hi_name = _FIELDS[self.mode]
        width = self.params[hi_name] if self.mode == "meanstd" else self.params[hi_name] - self.params[lo_name]
        bad = np.flatnonzero(~(width > 0) & varies)
        if bad.size:
            c = int(bad[0])
            if self.mode == "meanstd":
                problem = f"std is {width[c]} at channel {c} (zero or negative)"
            else:
                problem = f"{hi_name} == {lo_name} (or below) at channel {c}: zero range"
            raise DataError(f'{self.source}: stats["{self.key}"]["{hi_name}"][{c}]', problem, _FIX_ZERO)

    def _scale_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """y = (x - shift) / scale for every mode but asinh (shift 0); constant channels get scale 1 and are
        overwritten afterwards, so no division by zero happens."""
        p, mask = self.params, self._mask()
        if self.mode == "asinh":
            scale, shift = p["scale"], np.zeros_like(p["scale"])
        elif self.mode == "meanstd":
            scale, shift = p["std"], p["mean"]
        else:
            lo, hi = (p["min"], p["max"]) if self.mode == "minmax" else (p["q01"], p["q99"])
            scale, shift = (hi - lo) / 2.0, (hi + lo) / 2.0
        return np.where(mask, 1.0, scale), shift

    def _pin(self, x, fill):
        """x with the constant channels set to `fill` (0 when normalizing, their values when denormalizing)."""
        if not self.constant:
            return x
        mask = self._mask()
        if isinstance(x, torch.Tensor):
            return torch.where(torch.as_tensor(mask, device=x.device), _like(fill, x), x)
        return np.where(mask, _like(fill, x), x)

    def _values(self) -> np.ndarray:
        values = np.zeros(self.dim or 0)
        for c, v in self.constant.items():
            values[c] = v
        return values

    def check_constant(self, x, where: str) -> None:
        """Raise when a channel the stats call constant varies in `x` (rows of data, channels last): stats
        that disagree with the data would silently erase that channel."""
        if not self.constant or len(x) == 0:
            return
        x = np.asarray(x, dtype=np.float64).reshape(-1, x.shape[-1])
        for c, v in sorted(self.constant.items()):
            lo, hi = float(x[:, c].min()), float(x[:, c].max())
            if max(hi - v, v - lo) > CONSTANT_RTOL * max(1.0, abs(v)):
                raise DataError(f'{self.source}: stats["{self.key}"]["max"][{c}]', f"the stats record channel {c} "
                                f"as constant ({v}) but {where} has values from {lo} to {hi} there",
                                "recompute meta/stats.json (`wamkit data stats PATH --overwrite`)")

    def _check_width(self, x) -> None:
        if self.dim is not None and x.shape[-1] != self.dim:
            raise DataError(f"{self.source}: stats[{self.key!r}]", f"stats have {self.dim} channels but the data "
                            f"has {x.shape[-1]}", "recompute meta/stats.json for this dataset")

    def normalize(self, x):
        """numpy or torch float array, channels last -> normalized (quantile is clipped to [-1, 1])."""
        if self.mode == "none":
            return x
        self._check_width(x)
        scale, shift = (_like(v, x) for v in self._scale_shift())
        if self.mode == "asinh":
            y = np.arcsinh(x / scale) if isinstance(x, np.ndarray) else torch.asinh(x / scale)
        else:
            y = (x - shift) / scale
        if self.mode == "quantile":
            y = y.clip(-1.0, 1.0) if isinstance(y, np.ndarray) else y.clamp(-1.0, 1.0)
        return self._pin(y, np.zeros(self.dim))

    def denormalize(self, y):
        """Inverse of normalize (exact except where quantile clipping happened); a constant channel is its
        recorded value whatever `y` holds there."""
        if self.mode == "none":
            return y
        self._check_width(y)
        scale, shift = (_like(v, y) for v in self._scale_shift())
        if self.mode == "asinh":
            x = scale * (np.sinh(y) if isinstance(y, np.ndarray) else torch.sinh(y))
        else:
            x = y * scale + shift
        return self._pin(x, self._values())

    def state_dict(self) -> dict[str, Any]:
        """Plain python values so it can be saved in a checkpoint's JSON/torch metadata."""
        return {"key": self.key, "mode": self.mode, "source": self.source,
                "params": {k: v.tolist() for k, v in self.params.items()},
                "constant": {"channels": sorted(self.constant), "values": [self.constant[c] for c in sorted(self.constant)]}}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> "Normalizer":
        missing = [k for k in ("key", "mode", "params") if k not in state]
        if missing:
            raise DataError("normalizer state_dict", f"missing entries {missing}",
                            "save the checkpoint with Normalizer.state_dict()")
        constant = state.get("constant")  # absent in contracts written before constant channels
        if constant is not None:
            try:
                constant = dict(zip((int(c) for c in constant["channels"]), (float(v) for v in constant["values"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise DataError("normalizer state_dict: constant", f"is malformed ({exc!r}): {constant!r}",
                                "save the checkpoint with Normalizer.state_dict()") from exc
        return cls(state["key"], state["mode"], state["params"], state.get("source", "checkpoint"), constant)


def check_constant_channels(dataset, normalizers: "list[Normalizer | None]") -> None:
    """Training's check that the channels the stats record as constant are constant in every episode of
    `dataset` (a LeRobotV3Dataset or MultiDataset); reads the columns only when there are such channels."""
    norms = [n for n in normalizers if n is not None and n.constant]
    for ep in dataset.episode_indices if norms else ():
        cols = dataset.episode_columns(ep, [n.key for n in norms])
        for n in norms:
            x = np.asarray(cols[n.key], dtype=np.float64)
            n.check_constant(x.reshape(len(x), -1), f"{dataset._data_path(ep)} (episode {ep})")


def _asinh_params(params: Mapping[str, Any], key: str, source: str) -> dict[str, Any]:
    """Resolve the asinh scale: an explicit "scale" (state_dict), else "asinh_scale", else "std"."""
    for name in ("scale", "asinh_scale", "std"):
        if name in params:
            return {"scale": params[name], "_scale_source": name}
    raise DataError(f'{source}: stats["{key}"]', f"asinh normalization needs 'asinh_scale' or 'std' "
                    f"(have {sorted(params)})", "recompute meta/stats.json with std, or add asinh_scale")


def _check_mode(mode: str, source: str) -> None:
    if mode not in NORMALIZATION_MODES:
        raise DataError(f"{source}: normalization mode", f"{mode!r} is not supported",
                        f"use one of {NORMALIZATION_MODES}")


def _check_field(params: Mapping[str, Any], key: str, name: str, source: str) -> np.ndarray:
    where = f'{source}: stats["{key}"]["{name}"]'
    if name not in params:
        raise DataError(where, f"field {name!r} is missing (have {sorted(params)})",
                        "recompute meta/stats.json with min/max/mean/std/q01/q99, or pick another normalization")
    value = np.asarray(params[name], dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(value))
    if bad.size:
        c = int(bad[0])
        raise DataError(f"{where}[{c}]", f"is {value[c]} (NaN/inf) at channel {c}",
                        "recompute meta/stats.json; drop NaN/inf samples from the data")
    if value.size == 0:
        raise DataError(where, "is empty", "recompute meta/stats.json")
    return value


def _check_constant(constant: Mapping[int, float], dim: int | None, key: str, source: str) -> dict[int, float]:
    out = {int(c): float(v) for c, v in constant.items()}
    bad = [c for c, v in out.items() if dim is None or not 0 <= c < dim or not np.isfinite(v)]
    if bad:
        raise DataError(f'{source}: stats["{key}"] constant channels', f"channel(s) {bad} are outside the "
                        f"{dim or 0} channels or not finite ({ {c: out[c] for c in bad} })",
                        "recompute meta/stats.json / re-save the checkpoint")
    return out


def _check_same_dim(params: Mapping[str, np.ndarray], key: str, source: str) -> None:
    dims = {name: v.shape[0] for name, v in params.items()}
    if len(set(dims.values())) > 1:
        raise DataError(f'{source}: stats["{key}"]', f"fields have different lengths {dims}",
                        "recompute meta/stats.json")


def _like(value: np.ndarray, x):
    """Parameters as the same array type / dtype / device as the data."""
    if isinstance(x, torch.Tensor):
        return torch.as_tensor(value, dtype=x.dtype, device=x.device)
    return value.astype(x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64)
