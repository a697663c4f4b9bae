"""Per-channel normalization of state/action vectors from dataset statistics.

The model predicts actions in a normalized space; the same parameters must be used to denormalize at
inference, so a Normalizer serializes to plain lists and travels inside checkpoints. Bad statistics
(missing, NaN, zero range) would silently produce inf/NaN losses, so they are rejected up front.
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
_FIX_ZERO = "recompute stats over more data, or drop the constant channel from the feature"


class Normalizer:
    """Maps one feature's channels (last axis) to a normalized range and back."""

    def __init__(self, key: str, mode: str, params: Mapping[str, np.ndarray], source: str = "meta/stats.json"):
        _check_mode(mode, source)
        self.key, self.mode, self.source = key, mode, source
        self._scale_source = "scale"
        if mode == "asinh":
            params = _asinh_params(params, key, source)
            self._scale_source = params.pop("_scale_source")
        self.params = {name: _check_field(params, key, name, source) for name in _FIELDS[mode]}
        _check_same_dim(self.params, key, source)
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
        return cls(key, mode, stats[key], source)

    @property
    def dim(self) -> int | None:
        """Number of channels, or None for mode 'none' (any width)."""
        return None if not self.params else int(next(iter(self.params.values())).shape[0])

    def _check_range(self) -> None:
        """Zero range would divide by zero: name the first offending channel."""
        if self.mode == "none":
            return
        if self.mode == "asinh":
            bad = np.flatnonzero(~(self.params["scale"] > 0))
            if bad.size:
                c = int(bad[0])
                raise DataError(f'{self.source}: stats["{self.key}"]["{self._scale_source}"][{c}]',
                                f"asinh scale is {self.params['scale'][c]} at channel {c} (zero or negative)",
                                _FIX_ZERO)
            return
        lo_name, hi_name = _FIELDS[self.mode]
        width = self.params[hi_name] if self.mode == "meanstd" else self.params[hi_name] - self.params[lo_name]
        bad = np.flatnonzero(~(width > 0))
        if bad.size:
            c = int(bad[0])
            if self.mode == "meanstd":
                problem = f"std is {width[c]} at channel {c} (zero or negative)"
            else:
                problem = f"{hi_name} == {lo_name} (or below) at channel {c}: zero range"
            raise DataError(f'{self.source}: stats["{self.key}"]["{hi_name}"][{c}]', problem, _FIX_ZERO)

    def _scale_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """y = (x - shift) / scale for every mode."""
        p = self.params
        if self.mode == "meanstd":
            return p["std"], p["mean"]
        lo, hi = (p["min"], p["max"]) if self.mode == "minmax" else (p["q01"], p["q99"])
        return (hi - lo) / 2.0, (hi + lo) / 2.0

    def _check_width(self, x) -> None:
        if self.dim is not None and x.shape[-1] != self.dim:
            raise DataError(f"{self.source}: stats[{self.key!r}]", f"stats have {self.dim} channels but the data "
                            f"has {x.shape[-1]}", "recompute meta/stats.json for this dataset")

    def normalize(self, x):
        """numpy or torch float array, channels last -> normalized (quantile is clipped to [-1, 1])."""
        if self.mode == "none":
            return x
        self._check_width(x)
        if self.mode == "asinh":
            scale = _like(self.params["scale"], x)
            return np.arcsinh(x / scale) if isinstance(x, np.ndarray) else torch.asinh(x / scale)
        scale, shift = (_like(v, x) for v in self._scale_shift())
        y = (x - shift) / scale
        if self.mode == "quantile":
            y = y.clip(-1.0, 1.0) if isinstance(y, np.ndarray) else y.clamp(-1.0, 1.0)
        return y

    def denormalize(self, y):
        """Inverse of normalize (exact except where quantile clipping happened)."""
        if self.mode == "none":
            return y
        self._check_width(y)
        if self.mode == "asinh":
            scale = _like(self.params["scale"], y)
            return scale * (np.sinh(y) if isinstance(y, np.ndarray) else torch.sinh(y))
        scale, shift = (_like(v, y) for v in self._scale_shift())
        return y * scale + shift

    def state_dict(self) -> dict[str, Any]:
        """Plain python values so it can be saved in a checkpoint's JSON/torch metadata."""
        return {"key": self.key, "mode": self.mode, "source": self.source,
                "params": {k: v.tolist() for k, v in self.params.items()}}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> "Normalizer":
        missing = [k for k in ("key", "mode", "params") if k not in state]
        if missing:
            raise DataError("normalizer state_dict", f"missing entries {missing}",
                            "save the checkpoint with Normalizer.state_dict()")
        return cls(state["key"], state["mode"], state["params"], state.get("source", "checkpoint"))


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
