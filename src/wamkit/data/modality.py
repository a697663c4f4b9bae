"""GR00T-style ``meta/modality.json``: named slices of the state/action vectors.

The file maps each group ("state", "action", ...) to named sub-vectors::

    {"state": {"arm": {"start": 0, "end": 7}, "gripper": {"start": 7, "end": 8}},
     "action": {"arm": {"start": 0, "end": 7}, "gripper": {"start": 7, "end": 8}}}

A :class:`ModalitySelector` turns a list of names into one index array that selects and orders
those sub-vectors from the last axis of a feature (``x[..., selector.indices]``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from wamkit.errors import DataError

# The dataset feature a group slices when an entry gives no "original_key".
DEFAULT_FEATURE = {"state": "observation.state", "action": "action"}


@dataclass(frozen=True)
class ModalitySelector:
    """Index array selecting `names` (in that order) from a `group` vector of width `dim` (None = unknown)."""

    group: str
    names: tuple[str, ...]
    slices: tuple[tuple[int, int], ...]
    indices: np.ndarray
    dim: int | None = None

    @property
    def width(self) -> int:
        return int(self.indices.size)

    def select(self, x):
        """Select and order channels from the last axis of a numpy array or torch tensor."""
        if x.shape[-1] < (int(self.indices.max()) + 1 if self.indices.size else 0):
            raise DataError(f"modality[{self.group!r}]", f"data has {x.shape[-1]} channels but the selection "
                            f"reaches channel {int(self.indices.max())}", "fix meta/modality.json or the data")
        if isinstance(x, np.ndarray):
            return x[..., self.indices]
        import torch

        return x[..., torch.as_tensor(self.indices, device=x.device)]

    @classmethod
    def from_dict(cls, spec: Any, group: str, names: Sequence[str] | None = None, dim: int | None = None,
                  source: str = "meta/modality.json") -> "ModalitySelector":
        """Validate the group's slices (ints, 0 <= start < end <= dim, no overlap) and select `names`
        (None -> every entry, ordered by start)."""
        if not isinstance(spec, dict):
            raise DataError(source, f"top level must be a JSON object, got {type(spec).__name__}",
                            'write {"state": {...}, "action": {...}}')
        if group not in spec:
            raise DataError(f"{source}: [{group!r}]", f"group is missing (have {sorted(spec)})",
                            f"add a {group!r} group or choose one of {sorted(spec)}")
        entries = spec[group]
        if not isinstance(entries, dict) or not entries:
            raise DataError(f"{source}: [{group!r}]", "must be a non-empty object of {name: {start, end}}",
                            'e.g. {"arm": {"start": 0, "end": 7}}')
        spans: dict[str, tuple[int, int]] = {}
        for name, entry in entries.items():
            where = f"{source}: [{group!r}][{name!r}]"
            if not isinstance(entry, dict) or "start" not in entry or "end" not in entry:
                raise DataError(where, "needs integer 'start' and 'end'", 'e.g. {"start": 0, "end": 7}')
            start, end = entry["start"], entry["end"]
            if any(isinstance(v, bool) or not isinstance(v, int) for v in (start, end)):
                raise DataError(where, f"start={start!r}, end={end!r} are not integers", "use integer indices")
            if not 0 <= start < end:
                raise DataError(where, f"slice [{start}, {end}) is empty or negative", "use 0 <= start < end")
            if dim is not None and end > dim:
                raise DataError(where, f"slice [{start}, {end}) is out of range: the {group} vector has {dim} "
                                "channels", f"keep end <= {dim}")
            spans[name] = (start, end)
        ordered = sorted(spans.items(), key=lambda kv: kv[1])
        for (n1, (s1, e1)), (n2, (s2, e2)) in zip(ordered, ordered[1:]):
            if s2 < e1:
                raise DataError(f"{source}: [{group!r}]", f"slices {n1!r} [{s1}, {e1}) and {n2!r} [{s2}, {e2}) "
                                "overlap", "give every channel to at most one name")
        if names is None:
            names = [n for n, _ in ordered]
        names = list(names)
        if not names:
            raise DataError(f"{source}: [{group!r}]", "no names selected", f"choose from {sorted(spans)}")
        unknown = [n for n in names if n not in spans]
        if unknown:
            raise DataError(f"{source}: [{group!r}]", f"unknown names {unknown} (have {sorted(spans)})",
                            "use names defined in meta/modality.json")
        if len(set(names)) != len(names):
            raise DataError(f"{source}: [{group!r}]", f"names repeated in the selection {names}",
                            "select each name once")
        slices = tuple(spans[n] for n in names)
        indices = np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in slices])
        return cls(group, tuple(names), slices, indices, dim)

    @classmethod
    def from_file(cls, path: str | Path, group: str, names: Sequence[str] | None = None,
                  dim: int | None = None) -> "ModalitySelector":
        """`path` is meta/modality.json or a dataset root. Without `dim`, the width is read from the
        sibling info.json feature (the entry's "original_key", else observation.state / action) if any."""
        path = Path(path)
        if path.is_dir():
            path = path / "meta" / "modality.json"
        if not path.is_file():
            raise DataError(str(path), "modality file is missing", "write meta/modality.json (GR00T format)")
        try:
            spec = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(str(path), f"invalid JSON: {exc}", "fix meta/modality.json") from exc
        if dim is None:
            dim = _dim_from_info(path.parent / "info.json", spec, group)
        return cls.from_dict(spec, group, names, dim, source=str(path))


def _dim_from_info(info_path: Path, spec: Any, group: str) -> int | None:
    """Width of the feature a group slices, from info.json next to modality.json (None if unknown)."""
    if not info_path.is_file() or not isinstance(spec, dict) or not isinstance(spec.get(group), dict):
        return None
    keys = {e.get("original_key") for e in spec[group].values() if isinstance(e, dict)} - {None}
    key = keys.pop() if len(keys) == 1 else DEFAULT_FEATURE.get(group)
    try:
        feature = json.loads(info_path.read_text())["features"][key]
        return int(math.prod(feature["shape"]))
    except (KeyError, TypeError, ValueError, json.JSONDecodeError):
        return None
