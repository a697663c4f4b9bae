"""The doctor's checks of meta/stats.json: the fields a normalization reads, ranges, and stats against the data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from wamkit.data import doctor_signals as signals
from wamkit.data.doctor_base import MODE_FIELDS, PARTIAL_DATA, STATS_RANGE_RTOL, DoctorBase
from wamkit.data.normalize import CONSTANT_RTOL, constant_channels


class StatsChecks(DoctorBase):
    """stats.json alone, then against the data summaries the data checks gathered."""

    # ---- stats.json ------------------------------------------------------------------------------
    def check_stats(self) -> None:
        e = self.expect
        needs = [(e.action_key, e.normalization)]
        if e.state_key:
            needs.append((e.state_key, e.state_normalization or e.normalization))
        needs = [(k, m) for k, m in needs if m != "none"]
        path = self.root / "meta" / "stats.json"
        if not path.is_file():
            if needs:
                self.error("stats_missing", path, "meta/stats.json is missing but the recipe normalizes "
                           f"{[k for k, _ in needs]}", "run `wamkit data stats PATH` (wamkit.data.stats.write_stats)")
            return
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self.error("stats_invalid", path, f"invalid JSON: {exc}", "recompute with `wamkit data stats --overwrite`")
            return
        if not isinstance(raw, dict):
            self.error("stats_invalid", path, "top level is not an object", "recompute meta/stats.json")
            return
        from wamkit.data.stats import default_stat_keys

        unread = sorted(k for k in default_stat_keys({"features": self.features}) if k not in raw
                        and k not in (e.action_key, e.state_key))
        if unread:
            self.warn("stats_key_missing", path, f"no statistics for {unread}, features this recipe does not read "
                      "(a recipe that normalizes them would stop)", "recompute meta/stats.json (`wamkit data stats "
                      "PATH --overwrite`)")
        for key, mode in needs:
            if key not in raw:
                self.error("stats_key_missing", f'{path}: stats["{key}"]', f"no statistics for {key!r} (have "
                           f"{sorted(raw)})", "recompute meta/stats.json including this feature")
                continue
            fields = raw[key]
            if not isinstance(fields, dict):
                self.error("stats_invalid", f'{path}: stats["{key}"]', "is not an object of stat fields",
                           "recompute meta/stats.json")
                continue
            wanted = MODE_FIELDS.get(mode)
            if wanted is None:
                self.error("normalization_unknown", f"recipe normalization for {key!r}", f"{mode!r} is unknown",
                           f"use one of {sorted(MODE_FIELDS)}")
                continue
            if mode == "asinh" and "asinh_scale" in fields:
                wanted = ("asinh_scale",)
            self.stat_used[key] = set(wanted)
            values = {}
            for name in wanted:
                where = f'{path}: stats["{key}"]["{name}"]'
                if name not in fields:
                    self.error("stats_field_missing", where, f"field {name!r} needed by normalization {mode!r} is "
                               f"missing (have {sorted(fields)})", "recompute meta/stats.json with all fields")
                    continue
                try:
                    v = np.asarray(fields[name], dtype=np.float64).reshape(-1)
                except (TypeError, ValueError) as exc:
                    self.error("stats_invalid", where, f"not numeric: {exc}", "recompute meta/stats.json")
                    continue
                bad = np.flatnonzero(~np.isfinite(v))
                if bad.size:
                    c = int(bad[0])
                    self.error("stats_nonfinite", f"{where}[{c}]", f"is {v[c]} (NaN/inf) at channel {c} "
                               f"({bad.size} channel(s) bad)", "recompute stats; drop NaN/inf samples from the data")
                    continue
                dim = self.feature_dim(key)
                if dim is not None and v.size != dim:
                    self.error("stats_dim_mismatch", where, f"has {v.size} channels but info.json says {key!r} has "
                               f"{dim}", "recompute meta/stats.json for this dataset")
                    continue
                values[name] = v
            self._read_bounds(key, fields)
            self._check_range(path, key, mode, values)

    def _read_bounds(self, key: str, fields: dict) -> None:
        """Remember min/max and the moments (compared with the data later) and the channels the stats call
        constant; a field that does not parse is left out (reported by the field checks when the mode needs it)."""
        dim = self.feature_dim(key)
        self.stat_fields[key] = {}
        for name in ("min", "max", "mean", "std", "q01", "q99"):
            try:
                v = np.asarray(fields.get(name), dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                continue
            if name in fields and v.size == dim and np.isfinite(v).all():
                self.stat_fields[key][name] = v
        try:
            bounds = {n: np.asarray(fields[n], dtype=np.float64).reshape(-1) for n in ("min", "max") if n in fields}
            constant = constant_channels(fields)
        except (TypeError, ValueError):
            return
        self.stat_constants[key] = {c: v for c, v in constant.items() if dim is None or c < dim}
        if len(bounds) == 2 and all(b.size == dim and np.isfinite(b).all() for b in bounds.values()):
            self.stat_bounds[key] = (bounds["min"], bounds["max"])

    def _check_range(self, path: Path, key: str, mode: str, v: dict[str, np.ndarray]) -> None:
        """Zero or negative ranges, except on channels the stats record as constant (see check_stats_vs_data)."""
        constant = list(self.stat_constants.get(key, {}))
        if mode in ("minmax", "quantile"):
            lo, hi = MODE_FIELDS[mode]
            if lo in v and hi in v and v[lo].shape == v[hi].shape:
                ok = v[hi] > v[lo]
                ok[[c for c in constant if c < ok.size]] = True
                bad = np.flatnonzero(~ok)
                if bad.size:
                    c = int(bad[0])
                    self.error("stats_zero_range", f'{path}: stats["{key}"]["{hi}"][{c}]', f"{hi} ({v[hi][c]}) <= "
                               f"{lo} ({v[lo][c]}) at channel {c}: zero range divides by zero, and min/max say "
                               "the channel is not constant", "recompute meta/stats.json, or use 'minmax' or "
                               "'meanstd' for this feature")
        else:
            for name in ("std", "asinh_scale"):
                if name in v:
                    ok = v[name] > 0
                    ok[[c for c in constant if c < ok.size]] = True
                    bad = np.flatnonzero(~ok)
                    if bad.size:
                        c = int(bad[0])
                        self.error("stats_zero_range", f'{path}: stats["{key}"]["{name}"][{c}]', f"{name} is "
                                   f"{v[name][c]} at channel {c} (zero or negative)",
                                   "recompute meta/stats.json (a constant channel needs min == max)")

    def check_stats_vs_data(self) -> None:
        """Stats against the parquets: data outside [min, max] and a 'constant' channel that varies are
        errors; a channel constant in both is a warning naming its value (it trains and serves fine)."""
        path = self.root / "meta" / "stats.json"
        for key, constant in self.stat_constants.items():
            summary = self.data_summary.get(key)
            data = None if summary is None else (summary.lo, summary.hi)
            if data is not None and any(c >= data[0].size for c in constant):
                continue  # a width mismatch, reported on its own
            for c, value in sorted(constant.items()):
                where = f'{path}: stats["{key}"]["max"][{c}]'
                if data is not None and max(data[1][c] - value, value - data[0][c]) > \
                        CONSTANT_RTOL * max(1.0, abs(value)):
                    self.error("stats_zero_range", where, f"min == max == {value} says channel {c} of {key!r} is "
                               f"constant, but the data varies from {data[0][c]} to {data[1][c]} there",
                               "recompute meta/stats.json (`wamkit data stats PATH --overwrite`)")
                elif data is not None:
                    self.warn("constant_channel", f'{path}: stats["{key}"] channel {c}', f"channel {c} of {key!r} "
                              f"is constant at {value} in every frame (an unused gripper or a fixed joint?)",
                              f"nothing to fix: it is normalized to 0 and unnormalized back to exactly {value}; drop it "
                              "from the feature if the robot never moves it")
        for key, (lo, hi) in self.stat_bounds.items():
            summary = self.data_summary.get(key)
            data = None if summary is None else (summary.lo, summary.hi)
            if data is None or data[0].shape != lo.shape:
                continue
            tol = STATS_RANGE_RTOL * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi)))
            outside = np.flatnonzero((data[0] < lo - tol) | (data[1] > hi + tol))
            if outside.size:
                c = int(outside[0])
                self.error("stats_data_mismatch", f'{path}: stats["{key}"]["min"/"max"][{c}]', f"the data of "
                           f"{key!r} spans [{data[0][c]}, {data[1][c]}] at channel {c}, outside the stats' "
                           f"[{lo[c]}, {hi[c]}] ({outside.size} channel(s) outside)",
                           "recompute meta/stats.json for this data (`wamkit data stats PATH --overwrite`)")
        if self.report.codes("error") & PARTIAL_DATA:
            return  # the moments of the rows that were read say nothing about the stats of all of them
        for key, fields in self.stat_fields.items():
            if key in self.data_summary:
                self.report.findings += signals.stats_moment_findings(str(path), key, fields, self.data_summary[key],
                                                                      self.stat_used.get(key, set()))

    def check_outliers(self) -> None:
        """Glitch values in the action/state channels the recipe reads (after every data file was read)."""
        for key in (self.expect.action_key, self.expect.state_key):
            if key in self.data_summary:
                self.report.findings += signals.outlier_findings(f"{self.root}/data", key, self.data_summary[key])
