"""`ddpdoctor stacks --signal`: signal the ranks that called ``install_stack_dumps()`` and read their dumps.

No ptrace needed: each rank's own faulthandler writes its threads (see :mod:`ddpdoctor.stacks.install`). Only
processes that left a registration file in a trusted (private) folder are signalled, and only if the pid
still belongs to the process that registered (it runs as the folder's owner and its start time matches):
SIGUSR1 kills a process that did not register a handler.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpdoctor.errors import DoctorError
from ddpdoctor.fileio import read_regular
from ddpdoctor.safejson import UntrustedJSONError, loads_untrusted
from ddpdoctor.stacks.ident import job_matches
from ddpdoctor.stacks.install import STACK_DIR_ENV, check_private_dir, default_stack_dirs
from ddpdoctor.stacks.model import MAX_WORLD_SIZE, Frame, ProcessStacks, ThreadStack
from ddpdoctor.stacks.procfs import registered_process

# faulthandler's format (Python/traceback.c, dump_traceback / write_thread_id):
#   "Thread 0x00007f... (most recent call first):" or "Current thread 0x... (most recent call first):"
#   '  File "train.py", line 55 in main'
_THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[([^\]]*)\])? \(most recent call first\):")
_FRAME_RE = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')


def parse_faulthandler(text: str, main_thread_id: int | None) -> list[ThreadStack]:
    """Threads from one faulthandler dump (innermost frame first, as written)."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        head = _THREAD_RE.match(line)
        if head:
            tid = int(head.group(2), 16)
            threads.append(ThreadStack(tid, head.group(3) or "", tid == main_thread_id, []))
            continue
        frame = _FRAME_RE.match(line)
        if frame and threads:
            lineno = int(frame.group(2)) if frame.group(2).isdigit() else 0
            threads[-1].frames.append(Frame(frame.group(3), frame.group(1), lineno))
    for thread in threads:
        if thread.main and not thread.name:
            thread.name = "MainThread"
    return threads


# A registration is a few hundred bytes; a stack file grows by a few kilobytes per dump.
MAX_REGISTRATION_BYTES = 1 << 20
MAX_STACK_BYTES = 64 << 20


def _valid_registration(meta: Any) -> bool:
    """What :func:`~ddpdoctor.stacks.install.install_stack_dumps` writes: a file that says otherwise (a
    string rank, a world size of ten million, a signal number no kernel has) is not one to trust with a
    signal, nor to let size the report."""
    if not isinstance(meta, dict):
        return False

    def integer(key: str, low: int, high: int | None, optional: bool = True) -> bool:
        value = meta.get(key)
        if value is None:
            return optional
        return isinstance(value, int) and not isinstance(value, bool) and value >= low and (
            high is None or value <= high)

    texts = ("host", "job", "cmdline")
    return (integer("pid", 1, None, optional=False) and integer("signal", 1, signal.NSIG - 1, optional=False)
            and integer("uid", 0, None)
            and isinstance(meta.get("stack_file"), str)
            and integer("rank", 0, MAX_WORLD_SIZE) and integer("local_rank", 0, MAX_WORLD_SIZE)
            and integer("world_size", 1, MAX_WORLD_SIZE) and integer("local_world_size", 1, MAX_WORLD_SIZE)
            and integer("main_thread_id", 0, None) and integer("parent_pid", 0, None)
            and all(meta.get(k) is None or isinstance(meta.get(k), str) for k in texts)
            and (meta.get("create_time") is None or (isinstance(meta["create_time"], (int, float))
                                                     and not isinstance(meta["create_time"], bool)))
            and (meta.get("launcher_env") is None or isinstance(meta["launcher_env"], dict)))


def _folders(directory: str | os.PathLike[str] | None) -> list[tuple[Path, int]]:
    """The registry folders to read, each with the uid it is trusted for (:func:`check_private_dir`).

    Named (``--stack-dir``, ``$DDPDOCTOR_STACK_DIR``): that folder. Else every default folder that exists
    (:func:`default_stack_dirs`); one planted by another user is refused, never read."""
    named = directory if directory is not None else os.environ.get(STACK_DIR_ENV) or None
    candidates = [(Path(named), True)] if named is not None else [(d, False) for d in default_stack_dirs()]
    found = []
    for folder, explicit in candidates:
        if os.path.lexists(folder):
            found.append((folder, check_private_dir(folder, explicit=explicit, create=False)))
    return found


def _registrations(folder: Path, owner: int) -> list[dict[str, Any]]:
    regs = []
    for path in sorted(folder.glob("rank*-pid*.json")):
        try:  # only regular files are opened, never through a link: a FIFO would block the collector
            meta = loads_untrusted(read_regular(path, MAX_REGISTRATION_BYTES, follow_links=False))
        except (OSError, DoctorError, UntrustedJSONError):
            continue  # a foreign, half-written or hostile file: not ours to signal
        if _valid_registration(meta) and meta.get("uid", owner) == owner:
            # The dump file is the registration's twin in the same folder, whatever the file says.
            meta["stack_file"] = str(path.with_suffix(".txt"))
            meta["_owner"] = owner
            regs.append(meta)
    return regs


def _state(meta: dict[str, Any]) -> str:
    started = meta.get("create_time")
    return registered_process(int(meta["pid"]), int(meta["_owner"]), None if started is None else float(started))


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def collect(pids: Sequence[int] = (), job: str | None = None, directory: str | os.PathLike[str] | None = None,
            timeout: float = 10.0) -> list[ProcessStacks]:
    """Signal every live registered rank (optionally only ``pids``/``job``) and parse what each wrote.

    A pid is signalled only when it runs as the registry folder's owner and its start time matches the
    registration; a registration without a start time is listed, never signalled (its pid may be reused)."""
    folders = _folders(directory)
    found = [m for folder, owner in folders for m in _registrations(folder, owner)]
    if pids:
        found = [m for m in found if int(m["pid"]) in set(pids)]
    if job is not None:
        found = [m for m in found if job_matches(job, dict(m.get("launcher_env") or {}), m.get("job"),
                                                 m.get("parent_pid"))]
    states = {id(m): _state(m) for m in found}
    regs = [m for m in found if states[id(m)] == "ok"]
    unsure = [m for m in found if states[id(m)] == "no start time"]
    if not regs and not unsure:
        named = directory if directory is not None else os.environ.get(STACK_DIR_ENV) or None
        where = str(named) if named is not None else " or ".join(str(d) for d in default_stack_dirs())
        raise DoctorError(
            f"no live process registered for stack dumps in {where} (set {STACK_DIR_ENV} or --stack-dir "
            "if the ranks use another directory): add `import ddpdoctor; ddpdoctor.install_stack_dumps()` "
            "near the top of the training script and restart it. ddpdoctor never signals a process that did "
            "not register: SIGUSR1 would kill it.")
    procs: dict[int, ProcessStacks] = {}
    for meta in unsure:
        procs[int(meta["pid"])] = _process(meta, "registered without a start time (psutil was missing in the "
                                                 "rank), so a reused pid cannot be told apart: not signalled")
    before = {int(m["pid"]): _size(m["stack_file"]) for m in regs}
    for meta in regs:
        pid = int(meta["pid"])
        procs[pid] = _process(meta)
        try:
            os.kill(pid, int(meta["signal"]))
        except ProcessLookupError:
            procs[pid].error = "the process exited before it could be signalled"
        except PermissionError:
            procs[pid].error = "not permitted to signal it (another user's process): run as that user or root"
    # Wait until each file has grown and then stopped growing (faulthandler writes in small pieces).
    deadline = time.monotonic() + timeout
    pending = {pid for pid, p in procs.items() if p.error is None}
    last: dict[int, int] = {}
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        for meta in regs:
            pid = int(meta["pid"])
            if pid not in pending:
                continue
            size = _size(meta["stack_file"])
            if size > before[pid] and last.get(pid) == size:
                pending.discard(pid)
            last[pid] = size
    for meta in regs:
        pid = int(meta["pid"])
        proc = procs[pid]
        if proc.error is not None:
            continue
        if pid in pending:
            proc.error = (f"wrote no stacks to {meta['stack_file']} within {timeout:g} s"
                          + ("" if _state(meta) == "ok" else ": the process exited"))
            continue
        try:
            text = read_regular(meta["stack_file"], MAX_STACK_BYTES, before[pid],
                                follow_links=False).decode("utf-8", "replace")
        except (OSError, DoctorError) as exc:
            proc.error = f"cannot read {meta['stack_file']}: {getattr(exc, 'strerror', None) or exc}"
            continue
        proc.threads = parse_faulthandler(text, meta.get("main_thread_id"))
        if not proc.threads:
            proc.error = f"{meta['stack_file']} holds no faulthandler dump after the signal"
    return list(procs.values())


def _process(meta: dict[str, Any], error: str | None = None) -> ProcessStacks:
    pid = int(meta["pid"])
    return ProcessStacks(pid=pid, host=str(meta.get("host") or ""), rank=meta.get("rank"),
                         local_rank=meta.get("local_rank"), world_size=meta.get("world_size"),
                         local_world_size=meta.get("local_world_size"), job=meta.get("job"),
                         cmdline=str(meta.get("cmdline") or ""), error=error)
