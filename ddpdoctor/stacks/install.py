"""In-process stack dumps on a signal: the fallback when py-spy may not attach to the ranks.

``ddpdoctor.install_stack_dumps()`` (one line near the top of the training script) registers
:func:`faulthandler.register` for SIGUSR1. faulthandler's handler is C code that walks every thread's
Python frames without taking the GIL, so it writes the stacks even while the main thread is blocked inside
a C++ collective (a Python-level ``signal.signal`` handler would only run once the collective returned,
i.e. never; see https://docs.python.org/3/library/signal.html#execution-of-python-signal-handlers and
https://docs.python.org/3/library/faulthandler.html#dumping-the-tracebacks-on-a-user-signal).

Each process writes into one directory (``$DDPDOCTOR_STACK_DIR``, else ``/tmp/ddpdoctor-stacks-<uid>``):
``<stem>.txt`` receives the dumps (appended, one per signal) and ``<stem>.json`` says who the process is
(pid, rank, job, the signal, the main thread's id) so ``ddpdoctor stacks --signal`` knows which processes
are safe to signal: SIGUSR1's default action terminates a process that has not registered it.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import IO

from ddpdoctor.fileio import write_json_atomic
from ddpdoctor.stacks.ident import identity

STACK_DIR_ENV = "DDPDOCTOR_STACK_DIR"

# faulthandler keeps only the file descriptor; the file object must outlive the registration.
_open_files: dict[int, IO[str]] = {}


def default_stack_dir() -> Path:
    """Where ranks write and ``ddpdoctor stacks --signal`` reads: per user, so users never collide."""
    configured = os.environ.get(STACK_DIR_ENV)
    if configured:
        return Path(configured)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path("/tmp") / f"ddpdoctor-stacks-{uid}"


def _process_start_time() -> float | None:
    """Start time as psutil reports it, so the collector can tell a reused pid from this process."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # without psutil the collector falls back to pid liveness only
        return None


def install_stack_dumps(signum: int = signal.SIGUSR1, directory: str | os.PathLike[str] | None = None) -> Path:
    """Make this process write all its threads' stacks to a per-rank file when it receives ``signum``.

    Returns the file the stacks go to. Call it once per process (again replaces the registration).
    Then ``ddpdoctor stacks --signal`` sends the signal to every registered rank and groups the dumps.
    """
    folder = Path(directory) if directory is not None else default_stack_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    ident = identity(os.environ)
    pid = os.getpid()
    rank = "x" if ident.rank is None else str(ident.rank)
    stem = folder / f"rank{rank}-pid{pid}"
    old = _open_files.pop(signum, None)
    out = open(f"{stem}.txt", "a", encoding="utf-8")  # noqa: SIM115 - must stay open for faulthandler
    faulthandler.register(signum, file=out, all_threads=True, chain=False)
    if old is not None:
        old.close()
    _open_files[signum] = out
    meta = {
        "pid": pid,
        "rank": ident.rank,
        "local_rank": ident.local_rank,
        "world_size": ident.world_size,
        "local_world_size": ident.local_world_size,
        "job": ident.job,
        "parent_pid": os.getppid(),
        "launcher_env": {k: os.environ[k] for k in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID")
                         if k in os.environ},
        "host": socket.gethostname(),
        "signal": int(signum),
        "main_thread_id": threading.main_thread().ident,
        "create_time": _process_start_time(),
        "cmdline": " ".join(sys.argv),
        "stack_file": f"{stem}.txt",
        "installed_at_s": time.time(),
    }
    write_json_atomic(f"{stem}.json", meta)  # the collector never reads half a file
    return Path(f"{stem}.txt")
