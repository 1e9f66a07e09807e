"""This machine's processes, as ``ddpdoctor stacks`` needs them.

psutil (a dependency) reads everything it exposes: the process list, parents, environments, command
lines, owners, start times and states. Only what psutil does not expose is read here by hand: the
capability sets of ``/proc/PID/status`` (``CapEff``), to tell a container that dropped CAP_SYS_PTRACE.

Start times are psutil's ``create_time()``, the value a rank records through psutil when it calls
``install_stack_dumps()`` (:mod:`ddpdoctor.stacks.install`), so the two compare.
"""

from __future__ import annotations

import psutil

# A start time recorded by a rank and one read now differ by rounding only (clock ticks, float text).
_SAME_START_S = 0.5


def same_process_alive(pid: int, create_time: float | None) -> bool:
    """``pid`` still runs and is the process seen before (its start time matches), not a reused pid."""
    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        return create_time is None or abs(proc.create_time() - create_time) < _SAME_START_S
    except (psutil.Error, ValueError, OverflowError):  # gone; or a pid no process can have
        return False


def registered_process(pid: int, owner: int, create_time: float | None) -> str:
    """Whether a registered pid may be signalled: ``"ok"``; ``"gone"`` when it is not the process that
    registered (exited, a reused pid, another user's process: a registration planted to aim a signal);
    ``"no start time"`` when the registration cannot tell a reused pid apart (then it is never signalled).
    ``owner`` is the uid whose folder holds the registration: the process must run as that user."""
    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return "gone"
        uids = proc.uids()
        if uids.real != owner or uids.effective != owner:
            return "gone"
        if create_time is None:
            return "no start time"
        return "ok" if abs(proc.create_time() - create_time) < _SAME_START_S else "gone"
    except (psutil.Error, ValueError, OverflowError):
        return "gone"


def status_field(pid: int | str, name: str) -> list[str] | None:
    """The words of one ``/proc/PID/status`` line that psutil does not expose (``CapEff``...); ``pid`` may
    be ``"self"``. None when the process is gone or the kernel has no such line."""
    prefix = name + ":"
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(prefix):
                    return line[len(prefix):].split()
    except OSError:
        return None
    return None
