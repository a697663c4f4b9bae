"""One decision of where a run computes, made once and passed to every builder.

`--device auto` (the default of every command) is the GPU when there is one -- under torchrun each
rank takes the GPU of its LOCAL_RANK -- and the CPU otherwise. An explicit `cpu` on a GPU machine is
honoured with a one-line warning: a run that silently trains on the CPU beside an idle GPU wastes
hours before anyone notices."""

from __future__ import annotations

import os
import sys

import torch

from wamkit.errors import ConfigError

DEVICE_CHOICES = ("auto", "cuda", "cpu")
DEVICE_HELP = "auto (default): the GPU when one is present (under torchrun the rank's LOCAL_RANK GPU), else the CPU"


def resolve_device(requested: str | torch.device = "auto") -> torch.device:
    """`auto`, `cuda`, `cuda:N` or `cpu` -> the torch.device this process computes on."""
    text = str(requested)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if text == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(text)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device", f"{text!r} asked for but this machine has no usable CUDA GPU",
                              "use --device auto (or cpu), or install a CUDA build of torch")
        return device if device.index is not None else torch.device("cuda", local_rank)
    if device.type == "cpu" and torch.cuda.is_available() and os.environ.get("LOCAL_RANK", "0") == "0":
        print("[wamkit] warning: --device cpu on a machine with a CUDA GPU: computing on the CPU as asked "
              "(drop --device or use auto for the GPU)", file=sys.stderr, flush=True)
    return device
