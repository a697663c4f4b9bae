"""Which windows train: a keep-ranges filter (`data.keep_ranges_path`), keyed by trajectory.

The filter is JSON ``{trajectory_key: [[start, end], ...]}``. A window of `chunk_length` actions
starting at frame `s` is kept when ``start <= s < end - chunk_length`` for one of its episode's ranges,
i.e. all its T+1 frames lie in [start, end). Episodes whose key is absent are dropped.

The trajectory key of an episode is its ``episode_index`` as a string, or, with
`data.trajectory_key_field`, the value of that column in meta/episodes (e.g. DROID's recording path).
In a success/ + failure/ MultiDataset the default key is ``"<subdir>/<episode_index>"`` (e.g. "success/12").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow.parquet as pq

from wamkit.errors import DataError


class NoWindowsKept(DataError):
    """The keep-ranges filter left no window of the selected episodes."""


class KeepRanges:
    def __init__(self, ranges: Mapping[str, Sequence[Sequence[int]]], source: str = "keep_ranges"):
        self.source = source
        self.ranges: dict[str, list[tuple[int, int]]] = {}
        for key, spans in ranges.items():
            if not isinstance(spans, (list, tuple)):
                raise DataError(f"{source}[{key!r}]", f"is {type(spans).__name__}, expected a list of [start, end]",
                                'write {"key": [[start, end], ...]}')
            parsed = []
            for span in spans:
                if (not isinstance(span, (list, tuple)) or len(span) != 2
                        or not all(isinstance(v, int) and not isinstance(v, bool) for v in span)):
                    raise DataError(f"{source}[{key!r}]", f"range {span!r} is not [start, end] of two integers",
                                    "write each range as [start, end] frame indices")
                if span[0] < 0 or span[1] < span[0]:
                    raise DataError(f"{source}[{key!r}]", f"range {list(span)} is not 0 <= start <= end",
                                    "fix the range")
                parsed.append((int(span[0]), int(span[1])))
            self.ranges[str(key)] = parsed

    @classmethod
    def load(cls, path: str | Path) -> "KeepRanges":
        """Load the JSON filter; a set path that does not exist is an error, never 'no filter'."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise DataError(f"data.keep_ranges_path: {path}", "does not exist",
                            "point it at the keep-ranges JSON, or leave it empty for no filter")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(str(path), f"invalid JSON: {exc}", "fix the keep-ranges file") from exc
        if not isinstance(raw, dict):
            raise DataError(str(path), f"top level is {type(raw).__name__}, expected an object",
                            'write {"trajectory_key": [[start, end], ...], ...}')
        return cls(raw, str(path))

    def starts(self, key: str, starts: np.ndarray, chunk_length: int) -> np.ndarray:
        """The window starts of trajectory `key` that the filter keeps (none if the key is absent)."""
        spans = self.ranges.get(key)
        if not spans:
            return starts[:0]
        keep = np.zeros(len(starts), dtype=bool)
        for lo, hi in spans:
            keep |= (starts >= lo) & (starts < hi - chunk_length)
        return starts[keep]


def read_episode_field(root: Path, field: str) -> dict[int, Any]:
    """{episode_index: value} of one column of meta/episodes/*/*.parquet; error if the column is missing."""
    files = sorted((Path(root) / "meta" / "episodes").glob("*/*.parquet"))
    out: dict[int, Any] = {}
    for path in files:
        names = pq.read_schema(path).names
        if field not in names:
            raise DataError(f"{path}: {field!r}", f"data.trajectory_key_field names a column meta/episodes does not have "
                            f"(have {names})", "set data.trajectory_key_field to one of those columns, or leave it "
                            "empty to key by episode_index")
        table = pq.read_table(path, columns=["episode_index", field])
        for ep, value in zip(table.column("episode_index").to_pylist(), table.column(field).to_pylist()):
            out[int(ep)] = value
    return out


def trajectory_keys(dataset, field: str = "") -> dict[int, str]:
    """{episode: trajectory key} for a LeRobotV3Dataset or MultiDataset."""
    if hasattr(dataset, "trajectory_keys"):
        return dataset.trajectory_keys(field)
    if not field:
        return {ep: str(ep) for ep in dataset.episode_indices}
    values = read_episode_field(dataset.root, field)
    return {ep: str(values[ep]) for ep in dataset.episode_indices}
