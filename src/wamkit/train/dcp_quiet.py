"""torch.distributed.checkpoint's save and load without the warning a one-process run cannot act on.

DCP warns "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to
save (load) in a single process" at every save and load outside a process group. A one-process run
is a supported wamkit setup, so that is exactly the intent and the warning only trains users to skip
warnings. This filter hides that one message, around these calls only; every other warning stays."""

from __future__ import annotations

import warnings

import torch.distributed.checkpoint as _dcp
from torch.distributed.checkpoint import FileSystemReader  # noqa: F401  (the rest of DCP that wamkit uses)

ONE_PROCESS_WARNING = (r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to "
                       r"(save|load) in a single process")


def save(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=ONE_PROCESS_WARNING, category=UserWarning)
        return _dcp.save(*args, **kwargs)


def load(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=ONE_PROCESS_WARNING, category=UserWarning)
        return _dcp.load(*args, **kwargs)
