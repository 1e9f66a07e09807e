"""Every process a watched job started ends with the job: its ranks, their children, and what escaped.

A rank runs in its own session, so killing that session's process group reaches its ordinary children
(DataLoader workers). It does not reach a child the script started in a *new* session
(``subprocess.Popen(..., start_new_session=True)``, ``setsid``, a fork-setsid-fork daemon): that child has
its own process group, and once its parent exits it is re-parented away from the job, to init. So:

- **Linux**: the supervisor makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER, 1)``, see
  ``man 2 PR_SET_CHILD_SUBREAPER``): an orphan anywhere below it is re-parented to it instead of to init,
  so at teardown every leftover is still a descendant of the supervisor and is found with psutil. Orphans
  that exit during the run are reaped as they go (without touching the ranks, whose exit statuses belong
  to their ``Popen``). The previous setting is restored afterwards (``watch`` may run inside a longer-lived
  process, a test runner).
- **Elsewhere** (no prctl, or it fails): process tracking. Every rank's descendants are snapshotted while
  the job runs (pid + start time, so a reused pid is never signalled), with their session ids; at
  teardown the snapshots, the current descendants, and every process still in one of those sessions that
  started after ``watch`` did are killed. A daemon that forks and leaves its session between two snapshots
  (every :data:`SNAPSHOT_S`) can be missed there; the subreaper has no such gap.

Teardown is torchrun's: SIGTERM, a grace period (``--shutdown-timeout``, 30 s by default), SIGKILL for what is
left, then a bounded wait that reaps our own children (see :meth:`Reaper.teardown`). After a run that ended
well, a process the script deliberately detached (its own session) is left running and listed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PR_GET_CHILD_SUBREAPER = 37
SNAPSHOT_S = 0.5
# torchrun's default (``--shutdown-timeout``, TORCH_ELASTIC_SHUTDOWN_TIMEOUT): seconds between SIGTERM and SIGKILL.
DEFAULT_GRACE_S = 30.0
GRACE_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
KILL_WAIT_S = 5.0
POLL_S = 0.05


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_supervisor() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL a rank when the supervisor dies (``prctl(PR_SET_PDEATHSIG)``);
    None off Linux.

    A rank whose supervisor is gone ends itself when its channel closes, from its watchdog thread; but a rank
    whose main thread holds the GIL in a C call that never returns (a regex that backtracks for ever, a C
    extension's loop) has no watchdog that can run, and would outlive a SIGKILLed ``watch`` for ever. Safe as a
    ``preexec_fn`` because the supervisor starts its ranks before it starts any thread of its own (the
    output forwarder comes after); the libc function is looked up before the fork."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the prctl took effect
            os._exit(1)

    return set_death_signal


class Reaper:
    """Tracks and, at teardown, kills every process below the ranks (see the module docstring)."""

    def __init__(self) -> None:
        import psutil

        self.started = time.time()
        self.me = psutil.Process()
        self.previous: int | None = None
        self.subreaper = self._become_subreaper()
        # Our children before the job: never ours to kill or reap (watch may run inside a test runner).
        self.baseline = {p.pid for p in self._children(recursive=False)}
        self.tracked: dict[int, Any] = {}  # pid -> psutil.Process (identity checked on every signal)
        self.sessions: set[int] = set()
        self._last_snapshot = 0.0

    def _become_subreaper(self) -> bool:
        prctl = _prctl()
        if prctl is None:
            return False
        value = ctypes.c_int(0)
        if prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) == 0:
            self.previous = value.value
        return bool(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)

    def close(self) -> None:
        """Give the subreaper role back as it was."""
        prctl = _prctl()
        if self.subreaper and prctl is not None:
            prctl(PR_SET_CHILD_SUBREAPER, self.previous or 0, 0, 0, 0)
            self.subreaper = False

    def _children(self, recursive: bool) -> list[Any]:
        import psutil

        try:
            return list(self.me.children(recursive=recursive))
        except psutil.Error:
            return []

    def poll(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """While the job runs: reap orphans that exited; in the fallback, snapshot the ranks' trees."""
        rank_pids = {p.pid for p in procs}
        self._reap_orphans(rank_pids)
        now = time.monotonic()
        if not self.subreaper and now - self._last_snapshot >= SNAPSHOT_S:
            self._last_snapshot = now
            self._snapshot(procs)

    def _reap_orphans(self, rank_pids: set[int]) -> None:
        """Reap exited children that are neither a rank (its Popen reaps it) nor the caller's own."""
        if not self.subreaper:
            return
        for _ in range(64):
            try:
                # WNOWAIT: look without reaping, so a rank's status stays for its Popen.
                found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except (ChildProcessError, OSError):
                return
            if found is None or found.si_pid in rank_pids or found.si_pid in self.baseline:
                return
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(found.si_pid, os.WNOHANG)

    def _snapshot(self, procs: list[subprocess.Popen[bytes]]) -> None:
        import psutil

        for proc in procs:
            self.sessions.add(proc.pid)  # start_new_session: the rank leads its own session
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    self._track(child)

    def _track(self, proc: Any) -> None:
        import psutil

        if proc.pid in self.tracked or proc.pid == self.me.pid:
            return
        self.tracked[proc.pid] = proc
        with contextlib.suppress(psutil.Error, OSError):
            self.sessions.add(os.getsid(proc.pid))

    def leftovers(self, procs: list[subprocess.Popen[bytes]]) -> list[Any]:
        """Every process of the job still alive other than the ranks themselves."""
        import psutil

        rank_pids = {p.pid for p in procs}
        found: dict[int, Any] = {}
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    found[child.pid] = child
        # Re-parented orphans are our children now (subreaper), with whatever they started.
        for child in self._children(recursive=False):
            if child.pid in rank_pids or child.pid in self.baseline:
                continue
            found[child.pid] = child
            with contextlib.suppress(psutil.Error):
                for grandchild in child.children(recursive=True):
                    found[grandchild.pid] = grandchild
        found.update({pid: p for pid, p in self.tracked.items() if pid not in found})
        sessions = self.sessions | rank_pids
        for other in psutil.process_iter(["create_time"]):
            if other.pid in found or other.pid in rank_pids or other.pid == self.me.pid:
                continue
            try:
                if (other.info["create_time"] or 0) >= self.started - 1 and os.getsid(other.pid) in sessions:
                    found[other.pid] = other
            except (OSError, psutil.Error):
                continue
        for proc in found.values():
            self._track(proc)
        return [p for p in found.values() if p.pid not in rank_pids and _alive(p)]

    def teardown(self, procs: list[subprocess.Popen[bytes]], grace_s: float = DEFAULT_GRACE_S,
                 spare_detached: bool = False, hurry: threading.Event | None = None) -> Teardown:
        """Stop the job the way torchrun does, and say how it went.

        SIGTERM to every rank's process group (torchrun's ``SubprocessHandler.close``: ``os.killpg``) and to
        every other process of the job, up to ``grace_s`` for them to end (a script may save a checkpoint in
        its SIGTERM handler), then SIGKILL to whatever is left (torchrun's ``--shutdown-timeout``); finally a
        bounded wait that reaps what is ours. ``spare_detached`` (a run that ended well): a process the
        script started in a session of its own (an uploader, ``start_new_session=True``) is left running and
        listed instead. ``hurry`` set (a second Ctrl-C) cuts the grace short.
        """
        import psutil

        rank_sessions = {p.pid for p in procs}
        strays = self.leftovers(procs)
        spared = [s for s in strays if spare_detached and _session(s) not in rank_sessions]
        spared_pids = {s.pid for s in spared}
        strays = [s for s in strays if s.pid not in spared_pids]

        def signal_all(sig: int, ranks: list[subprocess.Popen[bytes]], targets: list[Any]) -> None:
            for proc in ranks:
                # start_new_session: the rank's pid is its process group id. Signal 0 first: only a group
                # that still has members is signalled (its id could otherwise be reused one day).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, 0)
                    os.killpg(proc.pid, sig)
            for stray in targets:
                with contextlib.suppress(psutil.Error):
                    stray.send_signal(sig)  # psutil checks the pid still names the process we saw

        def wait_all(seconds: float, targets: list[Any], stoppable: bool) -> list[Any]:
            deadline = time.monotonic() + seconds
            alive = list(targets)
            while True:
                ranks_done = all(p.poll() is not None for p in procs)
                # wait_procs reaps those that are our children (zombies included).
                _gone, alive = psutil.wait_procs(alive, timeout=0)
                alive = [p for p in alive if _alive(p)]
                if ranks_done and not alive:
                    return []
                if time.monotonic() >= deadline or (stoppable and hurry is not None and hurry.is_set()):
                    return alive
                time.sleep(POLL_S)

        started = time.monotonic()
        signal_all(signal.SIGTERM, procs, strays)
        wait_all(grace_s, strays, stoppable=True)
        ranks_left = [i for i, p in enumerate(procs) if p.poll() is None]
        # Whatever is left (a rank whose script ignores SIGTERM or is stuck in C++ with a Python handler, a
        # sleeper, what was forked meanwhile).
        strays = [s for s in self.leftovers(procs) if s.pid not in spared_pids] + [s for s in strays if _alive(s)]
        others_left = [_describe(s) for s in {s.pid: s for s in strays}.values() if _alive(s)]
        signal_all(signal.SIGKILL, procs, strays)
        wait_all(KILL_WAIT_S, strays, stoppable=False)
        self._reap_orphans({p.pid for p in procs})
        return Teardown(grace_s=grace_s, waited_s=round(time.monotonic() - started, 3), killed=ranks_left,
                        others_killed=others_left, left_running=[_describe(s) for s in spared if _alive(s)])


@dataclass
class Teardown:
    """How the job's processes ended at teardown: what needed SIGKILL, what was left running."""

    grace_s: float
    waited_s: float = 0.0
    killed: list[int] = field(default_factory=list)  # indexes into the ranks (the launched processes)
    others_killed: list[dict[str, Any]] = field(default_factory=list)  # {pid, cmdline} still alive at SIGKILL
    left_running: list[dict[str, Any]] = field(default_factory=list)  # detached after a run that ended well


def _session(proc: Any) -> int | None:
    try:
        return os.getsid(proc.pid)
    except OSError:
        return None


def _describe(proc: Any) -> dict[str, Any]:
    """{pid, cmdline} of a process, for the report (a gone process keeps what psutil cached)."""
    import psutil

    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        cmdline = ""
    return {"pid": proc.pid, "cmdline": cmdline[:300]}


def _alive(proc: Any) -> bool:
    import psutil

    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
