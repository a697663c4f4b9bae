"""The sync diagnostic (wamkit.train.sync_check): off CUDA it counts nothing and changes nothing; its
line names the places it counted."""

from collections import Counter

import torch

from wamkit.train.sync_check import counting_syncs, sync_line


def test_off_cuda_nothing_is_counted_and_the_block_runs():
    with counting_syncs(torch.device("cpu")) as found:
        value = torch.ones(3).sum().item()
    assert value == 3.0 and found == Counter()


def test_the_line_names_the_most_frequent_places():
    line = sync_line(2, Counter({"objective.py:153": 64, "packing.py:170": 2}))
    assert line == "step 2 synchronised host and GPU 66 times: objective.py:153 x64, packing.py:170 x2"
    assert sync_line(2, Counter()) == "step 2 synchronised host and GPU 0 times"
