"""What the doctor learns from the recorded values themselves: a running per-channel summary of each
numeric feature (compared with meta/stats.json, so stats from another dataset or a stale recompute
are caught), and the recording defects a normalizer or a policy would silently learn from (a glitch
spike that stretches min/max, a teleop stall frozen in the actions, embedded frames that do not decode).

Functions here return :class:`Finding` lists and never raise on bad values; `wamkit.data.doctor`
decides where they run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

OUTLIER_STDS = 10.0  # a value this many data stds from the mean is a glitch, not motion
FROZEN_FRACTION, FROZEN_MIN_FRAMES = 0.25, 10  # identical consecutive action rows over this much of an episode
STATS_MOMENT_RTOL = 0.01  # stats mean/std may differ from the data's by this fraction of the data's std
STATS_ABS_RTOL = 1e-5  # ... plus this x max(1, |value|) for float32 rounding
IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")  # PNG, JPEG: what LeRobot embeds


@dataclass
class Finding:
    severity: str  # "error" | "warning"
    code: str
    where: str
    problem: str
    fix: str = ""


@dataclass
class ChannelSummary:
    """Per-channel min/max (and the episodes holding them), mean and std of a feature's finite values."""

    lo: np.ndarray
    hi: np.ndarray
    lo_ep: np.ndarray
    hi_ep: np.ndarray
    count: np.ndarray = field(default=None)
    total: np.ndarray = field(default=None)
    total_sq: np.ndarray = field(default=None)

    @classmethod
    def of(cls, x: np.ndarray, ep: int) -> "ChannelSummary":
        """Summary of rows x [L, D] (float64) of episode `ep`."""
        finite = np.isfinite(x)
        z = np.where(finite, x, 0.0)
        eps = np.full(x.shape[1], ep)
        return cls(np.where(finite, x, np.inf).min(0), np.where(finite, x, -np.inf).max(0), eps, eps.copy(),
                   finite.sum(0), z.sum(0), (z * z).sum(0))

    def merge(self, other: "ChannelSummary") -> "ChannelSummary":
        lower, higher = other.lo < self.lo, other.hi > self.hi
        return ChannelSummary(np.where(lower, other.lo, self.lo), np.where(higher, other.hi, self.hi),
                              np.where(lower, other.lo_ep, self.lo_ep), np.where(higher, other.hi_ep, self.hi_ep),
                              self.count + other.count, self.total + other.total, self.total_sq + other.total_sq)

    @property
    def mean(self) -> np.ndarray:
        return self.total / np.maximum(self.count, 1)

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(np.maximum(self.total_sq / np.maximum(self.count, 1) - self.mean ** 2, 0.0))


def stats_moment_findings(where: str, key: str, fields: dict[str, np.ndarray], data: ChannelSummary,
                          used: set[str]) -> list[Finding]:
    """mean/std/q01/q99 (and min/max wider than the data) of meta/stats.json against the data: an error
    when the recipe's normalization reads the field (training would scale by numbers of another
    dataset), a warning otherwise.
    Channels the data holds constant inside a wider stats range are a declared range (the writer's
    `state_bounds`), not a disagreement."""
    std, scale = data.std, lambda v: STATS_ABS_RTOL * np.maximum(1.0, np.abs(v))
    declared = (data.lo == data.hi) & (fields["min"] < fields["max"]) if {"min", "max"} <= set(fields) else \
        np.zeros_like(std, dtype=bool)
    checks = {"mean": lambda v: np.abs(v - data.mean) > STATS_MOMENT_RTOL * std + scale(data.mean),
              "std": lambda v: ~declared & (np.abs(v - std) > STATS_MOMENT_RTOL * std + scale(std)),
              "q01": lambda v: ~declared & ((v < data.lo - scale(data.lo)) | (v > data.hi + scale(data.hi))),
              "q99": lambda v: ~declared & ((v < data.lo - scale(data.lo)) | (v > data.hi + scale(data.hi))),
              # wider than the data (narrower is an error of its own): minmax would use a sliver of [-1, 1]
              "min": lambda v: ~declared & (v < data.lo - STATS_MOMENT_RTOL * (data.hi - data.lo) - scale(data.lo)),
              "max": lambda v: ~declared & (v > data.hi + STATS_MOMENT_RTOL * (data.hi - data.lo) + scale(data.hi))}
    out = []
    for name, bad_of in checks.items():
        v = fields.get(name)
        if v is None or v.shape != std.shape:
            continue
        bad = np.flatnonzero(bad_of(v))
        if bad.size:
            c = int(bad[0])
            severity = "error" if name in used else "warning"
            note = "the recipe's normalization reads it" if name in used else "this recipe does not read it"
            out.append(Finding(severity, "stats_data_mismatch", f'{where}: stats["{key}"]["{name}"][{c}]',
                               f"{name} is {v[c]:.6g} but the data of {key!r} at channel {c} has mean {data.mean[c]:.6g}, "
                               f"std {std[c]:.6g}, range [{data.lo[c]:.6g}, {data.hi[c]:.6g}] ({bad.size} channel(s) "
                               f"off; {note}): stats of another dataset?",
                               "recompute meta/stats.json for this data (`wamkit data stats PATH --overwrite`)"))
    return out


def outlier_findings(where: str, key: str, data: ChannelSummary) -> list[Finding]:
    """A value OUTLIER_STDS data stds from the mean: minmax normalization would squeeze every other frame
    of that channel into a sliver of [-1, 1]."""
    std = data.std
    z_hi = np.where(std > 0, (data.hi - data.mean) / np.where(std > 0, std, 1), 0)
    z_lo = np.where(std > 0, (data.mean - data.lo) / np.where(std > 0, std, 1), 0)
    z = np.maximum(z_hi, z_lo)
    bad = np.flatnonzero(z > OUTLIER_STDS)
    if not bad.size:
        return []
    c = int(bad[np.argmax(z[bad])])
    value, ep = (data.hi[c], data.hi_ep[c]) if z_hi[c] >= z_lo[c] else (data.lo[c], data.lo_ep[c])
    return [Finding("warning", "value_outlier", f"{where}[{key!r}] (episode {int(ep)})",
                    f"channel {c} reaches {value:.6g}, {z[c]:.0f} stds from its mean {data.mean[c]:.6g} "
                    f"({bad.size} channel(s) with such values): a sensor or logging glitch?",
                    "repair or drop that episode; or use data.normalization = 'quantile', which ignores the extremes")]


def frozen_findings(where: str, key: str, ep: int, x: np.ndarray) -> list[Finding]:
    """Identical consecutive rows over FROZEN_FRACTION of an episode: a stalled teleop or a dropped link
    that the policy would learn as 'stand still'."""
    if len(x) < 2:
        return []
    same = np.all(x[1:] == x[:-1], axis=1)
    edges = np.diff(np.concatenate([[0], same.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if not starts.size:
        return []
    k = int(np.argmax(ends - starts))
    frames = int(ends[k] - starts[k]) + 1  # a run of n equal steps covers n + 1 rows
    if frames < max(FROZEN_MIN_FRAMES, FROZEN_FRACTION * len(x)):
        return []
    return [Finding("warning", "values_frozen", f"{where}[{key!r}] (episode {ep})",
                    f"{frames} consecutive identical rows (frames {int(starts[k])}..{int(ends[k])}, "
                    f"{frames / len(x):.0%} of the episode): a stalled recording?",
                    "trim the frozen frames or drop the episode if the robot really stood still by mistake")]


def image_cell_findings(where: str, cells: list, frames: np.ndarray, shape: list) -> list[Finding]:
    """Embedded camera frames (struct<bytes, path>): every cell must hold PNG/JPEG bytes (the loader
    decodes them lazily, so a bad one crashes training mid-run); the first one is decoded and its size
    compared with info.json."""
    bad = [i for i, cell in enumerate(cells) if not _is_image(cell)]
    if bad:
        i = bad[0]
        return [Finding("error", "image_undecodable", f"{where} frame_index {int(frames[i])}",
                        f"{len(bad)} embedded frame(s) hold no PNG/JPEG bytes (first at row {i}): "
                        f"{_describe(cells[i])}", "re-export the dataset (LeRobot writes PNG bytes per frame)")]
    if not cells:
        return []
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(cells[0]["bytes"])) as image:
            size = [image.height, image.width, 3]
    except OSError as exc:
        return [Finding("error", "image_undecodable", f"{where} frame_index {int(frames[0])}",
                        f"embedded frame does not decode: {exc}", "re-export the dataset")]
    if size != list(shape) and [size[2], size[0], size[1]] != list(shape):
        return [Finding("error", "image_shape_mismatch", where, f"embedded frames are {size} but info.json says "
                        f"{list(shape)}", "fix features[...]['shape'] in meta/info.json or re-export the images")]
    return []


def _is_image(cell) -> bool:
    blob = cell.get("bytes") if isinstance(cell, dict) else None
    return isinstance(blob, (bytes, bytearray)) and blob.startswith(IMAGE_MAGIC)


def _describe(cell) -> str:
    blob = cell.get("bytes") if isinstance(cell, dict) else cell
    return "null" if blob is None else f"{type(blob).__name__} starting {bytes(blob[:8])!r}" if isinstance(
        blob, (bytes, bytearray)) else repr(blob)[:60]
