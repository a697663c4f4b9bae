"""Fixtures of the train tests: the one-process device mesh the trainer itself uses (FSDP2 without torchrun)."""

import pytest
import torch

from wamkit.train.parallel import DistContext, ParallelDims, run_mesh


@pytest.fixture
def one_process_group():
    """The (1, 1, 1) device mesh of a one-rank gloo group (kept for the rest of the session, as a
    trainer in this process keeps it)."""
    return run_mesh(DistContext(0, 1, 0, torch.device("cpu")), ParallelDims(1, 1))
