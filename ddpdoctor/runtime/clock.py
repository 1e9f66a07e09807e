"""The user's clock: when the command they typed started, so a report says how long they waited.

A rank starts long after the user pressed Enter: the launcher (self-launch or torchrun) started first, then
Python and torch loaded in every rank (seconds on a loaded node). Timing from the rank's own start would
print "1.1 s" for a command that took 4 s from the prompt. The launching process is the rank's parent
under self-launch (the ``ddpdoctor`` process itself runs PyTorch's elastic agent) and under torchrun, so
its start time is the user's; under srun or mpirun the parent is the scheduler's daemon, started for the
job step at about the same moment, but not ours to trust, so the rank's own start is used there.
"""

from __future__ import annotations

import os
import time

# Launchers whose agent is this process's parent and was started by the user's command.
_PARENT_IS_THE_COMMAND = ("local", "torchrun")


def process_started_epoch(pid: int | None = None) -> float | None:
    """Wall-clock time a process started (psutil, from /proc), None when it cannot be read."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError, ValueError):
        return None


def command_started_epoch(launcher: str) -> float:
    """When the user's command started: the launching parent's start under self-launch and torchrun,
    else this process's own; never later than now."""
    now = time.time()
    own = process_started_epoch() or now
    if launcher in _PARENT_IS_THE_COMMAND:
        parent = process_started_epoch(os.getppid())
        if parent is not None and parent <= own:
            return parent
    return min(own, now)
