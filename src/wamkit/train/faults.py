"""Crash injection for the resume and atomic-save tests: a real SIGKILL at a chosen point, so the
tests exercise exactly what a pre-empted cluster job does. Inactive unless the variable is set."""

from __future__ import annotations

import os
import signal

KILL_AFTER_SAVE = "WAMKIT_FAULT_KILL_AFTER_SAVE_STEP"  # SIGKILL once the checkpoint of this step is complete
KILL_DURING_SAVE = "WAMKIT_FAULT_KILL_DURING_SAVE_STEP"  # SIGKILL with this step's files written but not renamed
KILL_RANK_DURING_SAVE = "WAMKIT_FAULT_KILL_RANK_DURING_SAVE"  # "<rank>:<step>": dies after its shards, object-store saves


def maybe_kill(variable: str, point: int | str) -> None:
    if os.environ.get(variable) == str(point):
        os.kill(os.getpid(), signal.SIGKILL)

