"""In-process stack dumps on a signal: the fallback when py-spy may not attach to the ranks.

``ddpdoctor.install_stack_dumps()`` (one line near the top of the training script) registers
:func:`faulthandler.register` for SIGUSR1. faulthandler's handler is C code that walks every thread's
Python frames without taking the GIL, so it writes the stacks even while the main thread is blocked inside
a C++ collective (a Python-level ``signal.signal`` handler would only run once the collective returned,
i.e. never; see https://docs.python.org/3/library/signal.html#execution-of-python-signal-handlers and
https://docs.python.org/3/library/faulthandler.html#dumping-the-tracebacks-on-a-user-signal).

Each process writes into one private folder (:func:`default_stack_dir`): ``<stem>.txt`` receives the dumps
(appended, one per signal) and ``<stem>.json`` says who the process is (pid, its owner and start time, rank,
job, the signal, the main thread's id) so ``ddpdoctor stacks --signal`` knows which processes are safe to
signal: SIGUSR1's default action terminates a process that has not registered it.

The folder is trusted only as far as its owner (issue 27): a folder under the shared temp dir that another
user created first (``/tmp/ddpdoctor-stacks-0`` planted for root) could hold registrations that make root
signal a process of the planter's choosing, or symlinks that make a rank append to a file of theirs. So the
default folder is ``$XDG_RUNTIME_DIR/ddpdoctor-stacks`` (the per-user runtime folder, 0700 by the XDG Base
Directory spec) or ``<tempdir>/ddpdoctor-stacks-<uid>``, created 0700 and refused when it exists with another
owner or a looser mode; a folder named explicitly (``$DDPDOCTOR_STACK_DIR``, ``--stack-dir``, ``directory=``)
must be a real folder that nobody but its owner can write. Files are opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from ddpdoctor.errors import DoctorError
from ddpdoctor.outputs import write_private_json
from ddpdoctor.stacks.ident import identity

STACK_DIR_ENV = "DDPDOCTOR_STACK_DIR"
RUNTIME_DIR_ENV = "XDG_RUNTIME_DIR"

# faulthandler keeps only the file descriptor; the file object must outlive the registration.
_open_files: dict[int, IO[str]] = {}


def _usable_runtime_dir() -> Path | None:
    """``$XDG_RUNTIME_DIR`` when it is this user's own folder that nobody else can write (``sudo -E`` keeps
    the invoking user's, which root must not use: its owner could swap what root puts there)."""
    value = os.environ.get(RUNTIME_DIR_ENV)
    if not value or not os.path.isabs(value):
        return None
    try:
        st = os.lstat(value)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return Path(value)


def default_stack_dirs() -> list[Path]:
    """Where ranks write and ``ddpdoctor stacks --signal`` reads, most preferred first: the per-user runtime
    folder, then the per-user folder under the temp dir (a rank started without ``$XDG_RUNTIME_DIR``, under
    a scheduler, writes there; the collector looks in both)."""
    uid = os.geteuid()
    dirs = []
    runtime = _usable_runtime_dir()
    if runtime is not None:
        dirs.append(runtime / "ddpdoctor-stacks")
    dirs.append(Path(tempfile.gettempdir()) / f"ddpdoctor-stacks-{uid}")
    return dirs


def default_stack_dir() -> Path:
    """The folder this process registers in: ``$DDPDOCTOR_STACK_DIR``, else :func:`default_stack_dirs`' first."""
    configured = os.environ.get(STACK_DIR_ENV)
    return Path(configured) if configured else default_stack_dirs()[0]


def check_private_dir(folder: Path, *, explicit: bool, create: bool) -> int:
    """The owner of ``folder`` once it is safe to trust with registrations; DoctorError (one line) if not.

    A default folder is created 0700 and must be ours with no access for anyone else. An explicit one
    may belong to another user (root reading a user's ranks), but must be a real folder (not a symlink)
    that only its owner can write; its owner is the only user whose processes are then signalled.
    """
    if create:
        try:
            os.makedirs(folder.parent, exist_ok=True)
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise DoctorError(f"cannot create the stack-dump folder {folder}: {exc.strerror or exc}") from None
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise DoctorError(f"stack-dump folder {folder}: {exc.strerror or exc}") from None
    fix = f"remove it (rm -r {folder}) if you did not create it, or set {STACK_DIR_ENV} to a folder of your own"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise DoctorError(f"stack-dump folder {folder} is {'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a folder'}; "
                          f"refusing to trust it: {fix}")
    if not explicit and st.st_uid != os.geteuid():
        raise DoctorError(f"stack-dump folder {folder} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): "
                          f"another user may have planted it; refusing to trust it: {fix}")
    loose = 0o022 if explicit else 0o077
    if st.st_mode & loose:
        raise DoctorError(f"stack-dump folder {folder} has mode {stat.S_IMODE(st.st_mode):04o}: other users can "
                          f"{'write' if explicit else 'read or write'} it; refusing to trust it: chmod 700 {folder}")
    return st.st_uid


def _process_start_time() -> float | None:
    """Start time as psutil reports it, so the collector can tell a reused pid from this process."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # the collector then never signals this process (a reused pid cannot be told apart)
        return None


def install_stack_dumps(signum: int = signal.SIGUSR1, directory: str | os.PathLike[str] | None = None) -> Path:
    """Make this process write all its threads' stacks to a per-rank file when it receives ``signum``.

    Returns the file the stacks go to. Call it once per process (again replaces the registration).
    Then ``ddpdoctor stacks --signal`` sends the signal to every registered rank and groups the dumps.
    DoctorError when the folder cannot be trusted (see :func:`check_private_dir`).
    """
    explicit = directory is not None or bool(os.environ.get(STACK_DIR_ENV))
    folder = Path(directory) if directory is not None else default_stack_dir()
    check_private_dir(folder, explicit=explicit, create=True)
    ident = identity(os.environ)
    pid = os.getpid()
    rank = "x" if ident.rank is None else str(ident.rank)
    stem = folder / f"rank{rank}-pid{pid}"
    old = _open_files.pop(signum, None)
    # O_NOFOLLOW: a link planted under the name must not make this process append to someone's file.
    try:
        fd = os.open(f"{stem}.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:  # ELOOP: a symlink sits under the name
        raise DoctorError(f"cannot open {stem}.txt for stack dumps ({exc.strerror or exc}; a link there is never "
                          "followed): remove it, or set DDPDOCTOR_STACK_DIR to a folder of your own") from None
    out = os.fdopen(fd, "a", encoding="utf-8")
    faulthandler.register(signum, file=out, all_threads=True, chain=False)
    if old is not None:
        old.close()
    _open_files[signum] = out
    meta = {
        "pid": pid,
        "uid": os.geteuid(),
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
    write_private_json(Path(f"{stem}.json"), meta)  # the collector never reads half a file
    return Path(f"{stem}.txt")
