"""How many local ranks this machine can hold, decided before any rank is started.

A self-launched rank is a whole Python process with torch imported: about 280 MB resident for a
``check`` rank and 240 MB for a ``bench`` rank on torch 2.13 CPU (measured with psutil, peak RSS per
rank), ~7 threads, and with gloo one socket per peer (a full mesh). Asking for more ranks than the
machine holds does not fail cleanly: forks start failing midway (EAGAIN), the OOM killer picks ranks,
and hundreds of ranks on a few cores miss every deadline. So ``--nproc`` is refused up front with the
numbers that bound it. No torch here (psutil and /proc only): the refusal must be fast.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

# Resident memory of one rank, rounded up from the measured ~280 MB (see the module docstring).
RANK_MEMORY_BYTES = 300 << 20
# Ranks per CPU core beyond which the ranks only wait for each other: deadlines expire while they start.
RANKS_PER_CORE = 32
# Threads of one rank (measured: 7), for the per-user process limit, which counts threads.
THREADS_PER_RANK = 8
# File descriptors a rank keeps besides its gloo sockets (one per peer): the store, pipes, libraries.
FDS_PER_RANK_BASE = 64
# No single machine runs more local ranks than this usefully; the rest goes through a real launcher.
HARD_CAP = 2048
_UNLIMITED_CGROUP = 1 << 60


@dataclass(frozen=True)
class Capacity:
    """The most local ranks this machine can hold, and each limit that went into it."""

    limit: int
    available_bytes: int
    cpus: int
    limits: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        return "; ".join(f"{why} = {n}" for why, n in self.limits)


def available_memory() -> int:
    """Bytes that new processes may still take: MemAvailable, or less where a memory cgroup caps us."""
    import psutil

    available = int(psutil.virtual_memory().available)
    room = _cgroup_memory_room()
    return min(available, room) if room is not None else available


def _cgroup_memory_room() -> int | None:
    """limit - usage of this process's memory cgroup (v2 or v1), None when it has no limit or none is found."""
    candidates: list[tuple[Path, Path]] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2
            for base in (Path("/sys/fs/cgroup") / rel, Path("/sys/fs/cgroup")):
                candidates.append((base / "memory.max", base / "memory.current"))
        elif "memory" in controllers.split(","):
            for base in (Path("/sys/fs/cgroup/memory") / rel, Path("/sys/fs/cgroup/memory")):
                candidates.append((base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"))
    for limit_file, usage_file in candidates:
        try:
            raw = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if raw == "max" or not raw.isdigit() or int(raw) >= _UNLIMITED_CGROUP:
            return None
        return max(0, int(raw) - usage)
    return None


def _user_threads() -> int:
    """Threads of this user now (what RLIMIT_NPROC counts)."""
    import psutil

    uid, total = os.getuid(), 0
    for proc in psutil.process_iter(["uids", "num_threads"]):
        uids, threads = proc.info.get("uids"), proc.info.get("num_threads")
        if uids is not None and uids.real == uid and threads:
            total += int(threads)
    return total


def local_capacity() -> Capacity:
    """The most local ranks this machine holds now, from memory, CPUs, process and file limits."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    available = available_memory()
    limits: list[tuple[str, int]] = [
        (f"{available / (1 << 30):.1f} GiB available memory / ~{RANK_MEMORY_BYTES >> 20} MiB per rank",
         available // RANK_MEMORY_BYTES),
        (f"{cpus} CPU core{'s' if cpus != 1 else ''} x {RANKS_PER_CORE}", cpus * RANKS_PER_CORE),
    ]
    soft_files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_files != resource.RLIM_INFINITY:
        limits.append((f"open-file limit {soft_files} (a gloo socket per peer)",
                       max(0, soft_files - FDS_PER_RANK_BASE)))
    soft_procs, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft_procs != resource.RLIM_INFINITY and os.geteuid() != 0:  # root is exempt from RLIMIT_NPROC
        free_threads = max(0, soft_procs - _user_threads())
        limits.append((f"{free_threads} more processes/threads allowed by ulimit -u / ~{THREADS_PER_RANK} per rank",
                       free_threads // THREADS_PER_RANK))
    limits.append(("the cap for one machine", HARD_CAP))
    return Capacity(max(1, min(n for _, n in limits)), available, cpus, tuple(limits))


def nproc_refusal(nproc: int) -> str | None:
    """Why ``--nproc nproc`` cannot run on this machine (one line), or None when it fits."""
    cap = local_capacity()
    if nproc <= cap.limit:
        return None
    shown = str(nproc) if len(str(nproc)) <= 20 else f"a {len(str(nproc))}-digit number"
    return (f"--nproc {shown}: this machine can run at most {cap.limit} local ranks ({cap.describe()}); "
            f"use --nproc {cap.limit} or fewer, or spread the ranks over several nodes with torchrun or srun")
