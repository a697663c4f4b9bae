"""Fixtures of the train tests: a one-process gloo group for FSDP2 without torchrun."""

import os

import pytest
import torch
import torch.distributed as dist

from wamkit.train.parallel import ParallelDims, build_mesh


@pytest.fixture
def one_process_group(tmp_path):
    """The (1, 1, 1) device mesh of a one-process gloo group, destroyed after the test."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield build_mesh(ParallelDims(1, 1), torch.device("cpu"))
    dist.destroy_process_group()
