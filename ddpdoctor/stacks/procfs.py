"""This machine's processes, read straight from ``/proc`` (Linux): what ``ddpdoctor stacks`` needs to find
ranks, at a fraction of psutil's import and per-process cost (``stacks`` must start fast on a stuck node).

Start times are computed as psutil computes them (boot time from ``/proc/stat`` plus the start tick of
``/proc/PID/stat``), so a start time recorded by a rank through psutil compares with one read here.
"""

from __future__ import annotations

import os

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_boot_time: list[float] = []


def boot_time() -> float:
    if not _boot_time:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime"):
                    _boot_time.append(float(line.split()[1]))
                    break
            else:
                _boot_time.append(0.0)
    return _boot_time[0]


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _read(pid: int | str, name: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:  # gone, or another user's (environ needs the same rights as ptrace)
        return None


def stat(pid: int) -> tuple[int, str, float] | None:
    """(parent pid, state letter, start time in seconds since the epoch), or None when gone."""
    raw = _read(pid, "stat")
    if raw is None:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), fields[0].decode(), boot_time() + int(fields[19]) / _CLOCK_TICKS


def cmdline(pid: int) -> str:
    raw = _read(pid, "cmdline") or b""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def environ(pid: int) -> dict[str, str] | None:
    """The environment the process started with; None when it cannot be read (another user's)."""
    raw = _read(pid, "environ")
    if raw is None:
        return None
    env = {}
    for entry in raw.decode(errors="replace").split("\0"):
        key, sep, value = entry.partition("=")
        if sep and key:
            env[key] = value
    return env


def status_field(pid: int | str, name: str) -> list[str] | None:
    """The words of one ``/proc/PID/status`` line (``Uid``, ``NSpid``, ``CapEff``...); ``pid`` may be
    ``"self"``. None when the process is gone or the kernel has no such line."""
    prefix = name.encode() + b":"
    for line in (_read(pid, "status") or b"").splitlines():
        if line.startswith(prefix):
            return line[len(prefix):].decode().split()
    return None


def real_uid(pid: int) -> int | None:
    words = status_field(pid, "Uid")
    return int(words[0]) if words else None


def namespace_pid(pid: int) -> int:
    """``pid`` as the process sees itself (the last NSpid): what its main thread's native id equals, also
    in a container with its own pid namespace."""
    words = status_field(pid, "NSpid")
    return int(words[-1]) if words else pid


def ancestors(pid: int) -> list[int]:
    """Parent, grandparent, ... up to init."""
    found: list[int] = []
    info = stat(pid)
    while info is not None and info[0] > 0 and len(found) < 256:
        found.append(info[0])
        info = stat(info[0])
    return found


def same_process_alive(pid: int, create_time: float | None) -> bool:
    """``pid`` still runs and is the process seen before (its start time matches), not a reused pid."""
    info = stat(pid)
    if info is None or info[1] in ("Z", "X"):
        return False
    return create_time is None or abs(info[2] - create_time) < 0.5
