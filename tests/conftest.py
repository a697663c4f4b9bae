"""Shared fixtures: the generated demo dataset."""

from pathlib import Path

import pytest

from wamkit.data import write_demo_dataset


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory) -> Path:
    return write_demo_dataset(tmp_path_factory.mktemp("demo") / "reach", num_episodes=12)
