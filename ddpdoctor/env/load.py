"""How busy a rank's cores are with other work: the runnable threads of other processes on those CPUs.

Three ``ddpdoctor check`` runs started together on a 2-core machine each measure bandwidth while the
others' ranks compete for the same cores; one of them then fails ``--min-busbw`` and blames the network.
Counting only our own ranks against the cores misses that, so this counts the threads that want a CPU now
(state ``R`` in ``/proc/<pid>/task/<tid>/stat``) on the given CPUs (the ``processor`` field: the CPU the
thread last ran on, proc(5)), leaving out this job's processes. A few samples a few tens of milliseconds
apart are averaged: a single look sees only an instant.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

# proc(5): after "pid (comm) ", the state is field 3 and the last CPU field 39 (index 36 from the state).
_PROCESSOR_FROM_STATE = 36


def parse_task_stat(text: str) -> tuple[str, int] | None:
    """(state, last CPU) from one ``/proc/<pid>/task/<tid>/stat`` line; None when malformed.

    ``comm`` may hold spaces and parentheses, so the fields are read after its last ``)``.
    """
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) <= _PROCESSOR_FROM_STATE or not fields[_PROCESSOR_FROM_STATE].lstrip("-").isdigit():
        return None
    return fields[0], int(fields[_PROCESSOR_FROM_STATE])


def runnable_threads(cpus: Iterable[int], exclude_pids: Iterable[int], proc: str | os.PathLike[str] = "/proc") -> int:
    """Threads of processes other than ``exclude_pids`` that are runnable now and last ran on ``cpus``."""
    wanted, excluded = set(cpus), set(exclude_pids)
    count = 0
    try:
        entries = os.listdir(proc)
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit() or int(entry) in excluded:
            continue
        task_dir = Path(proc) / entry / "task"
        try:
            tids = os.listdir(task_dir)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        for tid in tids:
            try:
                parsed = parse_task_stat((task_dir / tid / "stat").read_text(errors="replace"))
            except OSError:
                continue
            if parsed is not None and parsed[0] == "R" and parsed[1] in wanted:
                count += 1
    return count


def other_runnable(cpus: Iterable[int], exclude_pids: Iterable[int], samples: int = 5, interval_s: float = 0.04,
                   proc: str | os.PathLike[str] = "/proc") -> float:
    """The mean number of other processes' runnable threads on ``cpus`` over ``samples`` looks."""
    cpu_set, excluded = set(cpus), set(exclude_pids) | {os.getpid()}
    total = 0
    for i in range(max(1, samples)):
        if i:
            time.sleep(interval_s)
        total += runnable_threads(cpu_set, excluded, proc)
    return total / max(1, samples)
