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

Teardown is SIGTERM, a short grace, SIGKILL, then a bounded wait that reaps our own children.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from typing import Any

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PR_GET_CHILD_SUBREAPER = 37
SNAPSHOT_S = 0.5
TERM_GRACE_S = 1.5
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

    def teardown(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """SIGTERM every rank's process group and every other process of the job, a grace, then SIGKILL;
        reap what is ours. Bounded: at most TERM_GRACE_S + KILL_WAIT_S and a little."""
        import psutil

        strays = self.leftovers(procs)

        def signal_all(sig: int, targets: list[Any]) -> None:
            for proc in procs:
                # start_new_session: the rank's pid is its process group id. Signal 0 first: only a group
                # that still has members is signalled (its id could otherwise be reused one day).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, 0)
                    os.killpg(proc.pid, sig)
            for stray in targets:
                with contextlib.suppress(psutil.Error):
                    stray.send_signal(sig)  # psutil checks the pid still names the process we saw

        def wait_all(seconds: float, targets: list[Any]) -> list[Any]:
            deadline = time.monotonic() + seconds
            alive = list(targets)
            while True:
                ranks_done = all(p.poll() is not None for p in procs)
                # wait_procs reaps those that are our children (zombies included).
                _gone, alive = psutil.wait_procs(alive, timeout=0)
                alive = [p for p in alive if _alive(p)]
                if ranks_done and not alive:
                    return []
                if time.monotonic() >= deadline:
                    return alive
                time.sleep(POLL_S)

        signal_all(signal.SIGTERM, strays)
        wait_all(TERM_GRACE_S, strays)
        # Whatever is left (a rank whose script ignores SIGTERM, a sleeper, what was forked meanwhile).
        strays = self.leftovers(procs) + [s for s in strays if _alive(s)]
        signal_all(signal.SIGKILL, strays)
        wait_all(KILL_WAIT_S, strays)
        self._reap_orphans({p.pid for p in procs})


def _alive(proc: Any) -> bool:
    import psutil

    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
