"""Where a killed training process was: every thread's Python stack on SIGTERM.

A job stopped from outside (a scheduler's time limit, `timeout`, a cluster pre-emption) otherwise ends
silently; when the cause was a hang (a stalled loader, a collective waiting on a dead rank) the log
then says nothing about where. faulthandler writes the stacks from its C handler, so it works even
while the interpreter is stuck in a C call, and then lets the signal terminate the process as before."""

from __future__ import annotations

import faulthandler
import signal
import sys


def dump_stacks_on_sigterm() -> bool:
    """Register once per process, by the command that owns it (`wamkit train`, `wamkit distill`: a library
    call installs no process-wide handler); the signal still terminates it (chain=True re-raises the default
    action). faulthandler writes to a file descriptor: where sys.stderr has none (the CLI run in-process
    under a captured stream) the process's original stderr is used, and where that has none either nothing
    is registered. Returns whether the handler is in place."""
    if not hasattr(faulthandler, "register"):  # not on Windows
        return False
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            continue
        faulthandler.register(signal.SIGTERM, file=stream, all_threads=True, chain=True)
        return True
    return False
