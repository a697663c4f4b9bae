"""Shared fixtures: small demo datasets written once per session with the real writer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from wamkit.data import LeRobotV3Dataset, generate_episodes, write_demo_dataset
from wamkit.data.video import close_all

DEMO = {"num_episodes": 8, "episodes_per_file": 3, "fps": 10, "image_size": 64, "seed": 3}


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory) -> Path:
    """8 episodes over 3 data/mp4 files (3 + 3 + 2), H.264."""
    return write_demo_dataset(tmp_path_factory.mktemp("h264") / "demo", **DEMO)


@pytest.fixture(scope="session")
def demo_truth():
    """The simulator's ground truth of demo_root (the writer is deterministic for a seed)."""
    return generate_episodes(DEMO["num_episodes"], DEMO["fps"], DEMO["image_size"], DEMO["seed"])


@pytest.fixture(scope="session")
def demo_ds(demo_root) -> LeRobotV3Dataset:
    return LeRobotV3Dataset(demo_root)


@pytest.fixture
def demo_copy(demo_root, tmp_path) -> Path:
    """A private copy to break on purpose."""
    close_all()
    return Path(shutil.copytree(demo_root, tmp_path / "copy"))
