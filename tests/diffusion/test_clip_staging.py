"""The batch of clips on its way to the encoder (wamkit.diffusion.objective.stacked_clips)."""

import torch

CPU = torch.device("cpu")


def test_clips_for_a_gpu_are_stacked_into_page_locked_memory(monkeypatch):
    """For a GPU the batch of clips goes to pinned memory (an asynchronous copy, no page faults); on the
    CPU it is a plain stack. torch.empty is watched: the CPU box has no pinned memory to give."""
    from wamkit.diffusion import objective

    clips = [torch.full((2, 3), i, dtype=torch.uint8) for i in range(4)]
    assert torch.equal(objective.stacked_clips(clips, CPU), torch.stack(clips))
    asked = []
    real_empty = torch.empty

    def empty(*shape, **kwargs):
        asked.append(kwargs.pop("pin_memory", False))
        return real_empty(*shape, **kwargs)

    monkeypatch.setattr(objective.torch, "empty", empty)
    stacked = objective.stacked_clips(clips, torch.device("cuda"))
    assert asked == [True] and torch.equal(stacked, torch.stack(clips))
