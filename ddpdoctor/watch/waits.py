"""Where a rank waits, in words a user acts on: the classification behind every hang report (issue 25).

When no rank makes progress for ``--hang-timeout``, each rank's main-thread stack (every frame, with its
source line), the call it is in (if the recorder wrapped it), what it issued that has not completed, and
(for a DataLoader wait) which worker it waits for are turned into one of:

- ``collective``: inside a recorded call: a collective, ``work.wait()`` on an async one, DDP's ``backward()``;
- ``rendezvous``: inside ``init_process_group`` (waiting for the other ranks to arrive);
- ``gpu``: blocked on the GPU: in ``torch.cuda.synchronize()`` / an event or stream ``synchronize()``, or at a
  line that copies a result back to the host (``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``) while
  collectives it issued are still pending on the GPU. The C call itself has no Python frame, so the line
  and the pending collectives are the evidence;
- ``dataloader``: waiting for a batch from a DataLoader worker process (the worker's pid and stack);
- ``lock``: in ``threading`` (a Lock, Condition, Event, Thread.join) or ``queue``, or at an ``.acquire()``;
- ``io``: in socket, ssl, selectors, subprocess, http/urllib, shutil, or at a read/recv/input/open line;
- ``user_code``: anything else: the user's own code (a long evaluation, a sleep, an endless loop).

A hang where every live rank is in ``user_code`` or ``io`` with nothing in flight is a *stall*: no rank
waits for another, for the GPU or for a worker, so it may be a legitimate long phase (an evaluation, a
checkpoint) and the report says to raise ``--hang-timeout`` if it is. Pure functions, no processes.
"""

from __future__ import annotations

import os
import re
from typing import Any

import ddpdoctor
from ddpdoctor.watch.recorder import site_name

COLLECTIVE, RENDEZVOUS, GPU, DATALOADER, LOCK, IO, USER_CODE = (
    "collective", "rendezvous", "gpu", "dataloader", "lock", "io", "user_code")
NOT_STARTED, ENDED, UNKNOWN = "not_started", "ended", "unknown"
STALL_KINDS = (USER_CODE, IO)

_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "/lib64/python3", "/torch/", "<frozen", "<string>")
_OURS = os.path.dirname(ddpdoctor.__file__) + os.sep
_GPU_FRAMES = re.compile(r"torch/cuda/(__init__|streams)\.py$")
_GPU_LINE = re.compile(r"\.(item|cpu|tolist|numpy)\(\)|synchronize\(|\.to\(\s*['\"]cpu['\"]")
_LOCK_FILES = re.compile(r"/(threading|queue)\.py$|multiprocessing/(synchronize|queues|connection)\.py$")
_LOCK_LINE = re.compile(r"\.acquire\(|\.join\(\s*\)|\.wait\(")
_IO_FILES = re.compile(r"/(socket|ssl|selectors|subprocess|shutil|tarfile|zipfile)\.py$|/(http|urllib|email)/"
                       r"|/(requests|urllib3|boto3|botocore|fsspec|s3fs)/")
_IO_LINE = re.compile(r"\b(input|open)\(|\.(read|readline|readlines|readinto|recv|recv_into|load)\(")


def is_user_file(path: str) -> bool:
    """The user's own code: not the standard library, an installed package, torch or ddpdoctor."""
    normal = path.replace("\\", "/")
    return not (any(marker in normal for marker in _LIBRARY) or path.startswith(_OURS) or normal.startswith("<"))


def _short(frame: list[Any]) -> str:
    return f"{site_name(frame[0])}:{frame[1]}"


def _pending_text(inflight: list[dict[str, Any]]) -> str:
    """'2 collectives still pending: #6 all_reduce float32[4] (issued at train.py:38, 14.2 s ago), ...'."""
    if not inflight:
        return ""
    shown = []
    for entry in inflight[:3]:
        seq = f"#{entry['seq']} " if entry.get("seq") is not None else ""
        desc = f" {entry['desc']}" if entry.get("desc") else ""
        shown.append(f"{seq}{entry['op']}{desc} (issued at {entry.get('site') or '?'}, {entry['age_s']:.1f} s ago)")
    more = f", and {len(inflight) - 3} more" if len(inflight) > 3 else ""
    noun = "collective" if len(inflight) == 1 else "collectives"
    return f"{len(inflight)} {noun} still pending: " + ", ".join(shown) + more


def classify(cur: dict[str, Any] | None, frames: list[list[Any]], inflight: list[dict[str, Any]],
             loader: dict[str, Any] | None) -> dict[str, Any]:
    """One rank's wait: ``{"kind", "site", "summary", "pending", "worker"}`` (see the module docstring)."""
    user_index = max((i for i, f in enumerate(frames) if is_user_file(f[0])), default=None)
    user = frames[user_index] if user_index is not None else None
    below = frames[user_index + 1:] if user_index is not None else frames
    site = _short(user) if user is not None else (cur or {}).get("site")
    code = user[3] if user is not None else ""
    at = f" at {site}" + (f": {code}" if code else "") if site else ""
    pending = _pending_text(inflight)
    gpu_pending = [entry for entry in inflight if entry.get("on") == "gpu"]
    wait: dict[str, Any] = {"kind": USER_CODE, "site": site, "summary": "", "pending": inflight, "worker": None}

    if cur is not None:
        op, seq = cur.get("op", "?"), cur.get("seq")
        wait["site"] = cur.get("site") or site
        if op == "init_process_group":
            wait.update(kind=RENDEZVOUS, summary=f"in init_process_group at {wait['site']} (the rendezvous)")
        else:
            number = f" #{seq}" if seq is not None else ""
            desc = f" {cur['desc']}" if cur.get("desc") else ""
            wait.update(kind=COLLECTIVE, summary=f"in {op}{number}{desc} at {wait['site']}")
    elif loader is not None:
        worker = loader.get("worker_id")
        which = (f"worker {worker} (pid {loader.get('worker_pid')})" if worker is not None
                 else f"its workers (pids {', '.join(map(str, loader.get('workers') or [])) or 'unknown'})")
        wait.update(kind=DATALOADER, summary=f"waiting for a batch from DataLoader {which}{at}",
                    worker={"id": worker, "pid": loader.get("worker_pid"), "stack": loader.get("worker_stack") or []})
    elif any(_GPU_FRAMES.search(f[0].replace("\\", "/")) and "synchronize" in f[2] for f in below) or (
            gpu_pending and _GPU_LINE.search(code)):
        wait.update(kind=GPU, summary=f"waiting for the GPU{at}")
    elif any(_LOCK_FILES.search(f[0].replace("\\", "/")) for f in below) or (not below and _LOCK_LINE.search(code)):
        inner = below[0] if below else None
        how = f" ({os.path.basename(inner[0])[:-3]}.{inner[2]})" if inner is not None else ""
        wait.update(kind=LOCK, summary=f"waiting on a lock or condition{how}{at}")
    elif any(_IO_FILES.search(f[0].replace("\\", "/")) for f in below) or (not below and _IO_LINE.search(code)):
        wait.update(kind=IO, summary=f"in I/O{at}")
    elif frames:
        wait.update(kind=USER_CODE, summary=f"in its own code{at}")
    else:
        wait.update(kind=UNKNOWN, summary="where, unknown: its stack could not be read")
    if pending:
        wait["summary"] += f"; {pending}"
    if wait["kind"] == GPU and not gpu_pending:
        wait["summary"] += "; nothing this rank issued is pending (a kernel of its own, or a collective "\
                           "issued from C++ such as DDP's, is what the GPU is on)"
    return wait


def is_stall(waits: list[dict[str, Any]]) -> bool:
    """Every live rank busy in its own code or I/O, nothing in flight: nobody waits for anybody."""
    return bool(waits) and all(w["kind"] in STALL_KINDS and not w["pending"] for w in waits)


def moved_on(cur: dict[str, Any] | None, sites: list[str]) -> bool:
    """Whether a rank read from outside has left the call it last reported: no frame of its stack is at that
    call's site. A rank whose main thread took the GIL right after a call (a C loop, a regex) could not report
    the call's end; without this its wait read "in init_process_group" while py-spy showed it in its own code."""
    site = (cur or {}).get("site")
    if not site or not sites:
        return False
    # The rank names files relative to its own working directory: compare base names and lines.
    return _file_line(site) not in {_file_line(s) for s in sites}


def _file_line(site: str) -> str:
    path, _, line = site.rpartition(":")
    return f"{os.path.basename(path)}:{line}"


def innermost(stack: list[str] | None) -> str | None:
    """'train.py:55' from the innermost stack entry 'train.py:55 in main: ...'."""
    if not stack:
        return None
    return stack[-1].split(" in ", 1)[0]
