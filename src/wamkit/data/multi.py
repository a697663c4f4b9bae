"""Several LeRobot v3.0 datasets read as one: DROID's ``success/`` + ``failure/`` layout.

`data.path` may point at a parent folder holding ``success/`` (and optionally ``failure/``), each a
LeRobot v3.0 dataset root. :func:`open_lerobot` opens it as a :class:`MultiDataset` -- ``success/``
only unless `data.include_failures` -- whose episodes are numbered globally (the sub-datasets' episodes
one after the other, in order), so WindowDataset, the split and the stream see one dataset.
Normalization statistics come from ``success/``. Sub-datasets must agree on fps and features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from wamkit.data.episode_frames import fits
from wamkit.data.lerobot_v3 import LeRobotV3Dataset
from wamkit.data.selection import read_episode_field
from wamkit.errors import DataError

SUBSETS = ("success", "failure")


def is_multi_root(root: Path) -> bool:
    root = Path(root)
    return not (root / "meta" / "info.json").exists() and (root / "success" / "meta" / "info.json").exists()


def open_lerobot(root: str | Path, expected_fps: float = 0.0, include_failures: bool = False):
    """A LeRobotV3Dataset for a dataset root, a MultiDataset for a success/ (+ failure/) parent."""
    root = Path(root)
    if is_multi_root(root):
        return MultiDataset.from_root(root, expected_fps, include_failures)
    if include_failures and (root / "meta" / "info.json").exists():
        raise DataError("data.include_failures", f"is true but {root} is a single dataset, not a parent of "
                        "success/ and failure/", "set data.include_failures = false or point data.path at the parent")
    return LeRobotV3Dataset(root, expected_fps=expected_fps)


class MultiDataset:
    """Concatenation of LeRobotV3Datasets with global episode indices; the LeRobotV3Dataset reading API."""

    def __init__(self, parts: Sequence[LeRobotV3Dataset], names: Sequence[str], root: Path | None = None):
        if not parts:
            raise DataError("MultiDataset", "no sub-datasets", "give at least one dataset")
        self.parts, self.names = list(parts), list(names)
        first = self.parts[0]
        self.root = Path(root) if root is not None else first.root
        self.info, self.fps, self.features = first.info, first.fps, first.features
        self.camera_keys, self.stats, self.tasks = first.camera_keys, first.stats, first.tasks
        for name, part in zip(self.names[1:], self.parts[1:]):
            if abs(part.fps - self.fps) > 1e-6:
                raise DataError(f"{part.root}/meta/info.json: fps", f"is {part.fps} but {self.names[0]}/ has "
                                f"{self.fps}", "sub-datasets must share fps")
            for key, feat in self.features.items():
                other = part.features.get(key)
                if other is None or other.get("dtype") != feat.get("dtype") or \
                        list(other.get("shape", [])) != list(feat.get("shape", [])):
                    raise DataError(f"{part.root}/meta/info.json: features[{key!r}]", f"is {other!r} but "
                                    f"{self.names[0]}/ has {feat!r}", "sub-datasets must share features")
        self._map: dict[int, tuple[int, int]] = {}
        for p, part in enumerate(self.parts):
            for ep in part.episode_indices:
                self._map[len(self._map)] = (p, ep)
        self.episode_indices = list(range(len(self._map)))

    @classmethod
    def from_root(cls, root: Path, expected_fps: float = 0.0, include_failures: bool = False) -> "MultiDataset":
        root = Path(root)
        names = ["success"]
        if include_failures:
            if not (root / "failure" / "meta" / "info.json").exists():
                raise DataError(f"{root}/failure", "data.include_failures is true but there is no failure/ dataset",
                                "set data.include_failures = false or add the failure/ dataset")
            names.append("failure")
        return cls([LeRobotV3Dataset(root / n, expected_fps=expected_fps) for n in names], names, root)

    def locate(self, ep: int) -> tuple[LeRobotV3Dataset, int]:
        if ep not in self._map:
            raise DataError(f"{self.root}: episodes", f"episode {ep} not found",
                            f"use one of the {len(self.episode_indices)} global episode indices")
        p, local = self._map[ep]
        return self.parts[p], local

    def source(self, ep: int) -> str:
        """'success/12': the sub-dataset and its own episode_index."""
        p, local = self._map[ep]
        return f"{self.names[p]}/{local}"

    def trajectory_keys(self, field: str = "") -> dict[int, str]:
        if not field:
            return {ep: self.source(ep) for ep in self.episode_indices}
        values = [read_episode_field(part.root, field) for part in self.parts]
        return {ep: str(values[self._map[ep][0]][self._map[ep][1]]) for ep in self.episode_indices}

    # ---- the LeRobotV3Dataset API, per episode -----------------------------------------------------
    def episode_length(self, ep: int) -> int:
        part, local = self.locate(ep)
        return part.episode_length(local)

    def episode_task(self, ep: int) -> str:
        part, local = self.locate(ep)
        return part.episode_task(local)

    def frame_task(self, ep: int, frame: int) -> str:
        part, local = self.locate(ep)
        return part.frame_task(local, frame)

    def feature_dim(self, key: str) -> int:
        return self.parts[0].feature_dim(key)

    def episode_columns(self, ep: int, keys: Sequence[str]) -> dict[str, np.ndarray]:
        part, local = self.locate(ep)
        return part.episode_columns(local, keys)

    def frame_size(self, camera_key: str) -> tuple[int, int]:
        return self.parts[0].frame_size(camera_key)

    def decode_frames(self, ep: int, camera_key: str, frame_indices: Sequence[int],
                      out: np.ndarray | None = None) -> np.ndarray:
        part, local = self.locate(ep)
        return part.decode_frames(local, camera_key, frame_indices, out)

    def decoded_video_bytes(self) -> int:
        return sum(part.decoded_video_bytes() for part in self.parts)

    def enable_frame_cache(self, budget_mb: float) -> bool:
        """LeRobotV3Dataset.enable_frame_cache over every part: on when all of them together fit."""
        total = self.decoded_video_bytes()
        on = fits(total, budget_mb)
        for part in self.parts:
            part.enable_frame_cache(budget_mb * part.decoded_video_bytes() / max(total, 1) if on else 0)
        return on

    def video_path(self, ep: int, camera_key: str) -> Path:
        part, local = self.locate(ep)
        return part.video_path(local, camera_key)

    def _data_path(self, ep: int) -> Path:
        part, local = self.locate(ep)
        return part._data_path(local)
