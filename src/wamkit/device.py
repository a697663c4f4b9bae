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


INFERENCE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE_CHOICES = ("auto", *INFERENCE_DTYPES)
DTYPE_HELP = ("the weights' dtype at inference. auto (default): on a GPU, the compute dtype the run trained in "
              "(parallel.param_dtype, bfloat16 in the GPU recipes); on the CPU, the dtype the weights are stored in "
              "(float32 for a run's checkpoint)")


def resolve_inference_dtype(requested: str | torch.dtype, device: str | torch.device, compute_dtype: str | None,
                            stored: torch.dtype) -> torch.dtype:
    """The dtype a loaded model computes in. A run's checkpoint holds fp32 masters, but training
    computed in `compute_dtype`: on a GPU, "auto" serves and evaluates in that dtype (the numerics the
    model was trained under, and bf16 tensor-core matmuls instead of ~15x slower full-fp32 ones); on the
    CPU it keeps `stored`, where bf16 matmuls are slower than fp32 ones."""
    if isinstance(requested, torch.dtype):
        return requested
    if requested != "auto":
        if requested not in INFERENCE_DTYPES:
            raise ConfigError("--dtype", f"{requested!r} is not one of {', '.join(DTYPE_CHOICES)}", "pass one of those")
        return INFERENCE_DTYPES[requested]
    if torch.device(device).type == "cuda" and compute_dtype in INFERENCE_DTYPES:
        return INFERENCE_DTYPES[compute_dtype]
    return stored
