"""The Debian packages some tests need, installed when root: one way, one lock, one fallback.

The launcher tests need Open MPI and Slurm, the lab needs libfaketime, the blocked-port scenario nftables
(brief: tests that need root, Slurm or MPI install what they need when root, Debian packages by name, and
skip with the reason otherwise). Every install goes through :func:`ensure_packages`:

- a file lock serialises installs between pytest-xdist workers (two ``apt-get`` at once: the second fails on
  dpkg's lock), and apt's own lock timeout covers a package manager run by someone else;
- a clean machine may have no package lists (a container image usually ships none): when an install fails,
  ``apt-get update`` runs once and the install is tried again;
- every command has a deadline.

:func:`prefetch_in_background` starts the whole set installing when the run starts (tests/conftest.py), so the
download and unpacking (~25-60 s on a 2-core machine) overlap the first tests instead of holding up the
worker that first needs a package; that worker waits on the lock for what is left of it.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass

INSTALL_DEADLINE_S = 600
UPDATE_DEADLINE_S = 300
LOCK_FILE = "/tmp/ddpdoctor-tests-apt.lock"


@dataclass(frozen=True)
class Need:
    """Debian packages, and what shows they are installed: commands on PATH, files matching globs."""

    packages: tuple[str, ...]
    commands: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        return ([c for c in self.commands if shutil.which(c) is None]
                + [f for f in self.files if not glob.glob(f)])


MPI = Need(("openmpi-bin",), commands=("mpirun",))
SLURM = Need(("slurmd", "slurmctld", "slurm-client", "munge"),
             commands=("munged", "slurmctld", "slurmd", "srun", "sinfo"))
# libfaketime's thread-safe build (torch starts threads): the lab's host whose clock is off.
FAKETIME = Need(("faketime",), files=("/usr/lib/*/faketime/libfaketimeMT.so.1",))
NFTABLES = Need(("nftables",), commands=("nft",))
EVERY_NEED = (MPI, SLURM, FAKETIME, NFTABLES)


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _apt(args: Sequence[str], deadline_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, timeout=deadline_s,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def ensure_packages(need: Need) -> str | None:
    """Install ``need``'s packages when what shows them is missing; why they are unavailable, or None."""
    if not need.missing():
        return None
    if not is_root():
        return f"needs root to install {' '.join(need.packages)} (missing: {', '.join(need.missing())})"
    if shutil.which("apt-get") is None:
        return f"no apt-get to install {' '.join(need.packages)}"
    install = ["install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300", *need.packages]
    try:
        with open(LOCK_FILE, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # held at most for the two deadlines below, by whoever has it
            if need.missing():
                done = _apt(install, INSTALL_DEADLINE_S)
                if done.returncode != 0:
                    # "Unable to locate package": no package lists yet on a clean machine.
                    _apt(["update", "-o", "DPkg::Lock::Timeout=300"], UPDATE_DEADLINE_S)
                    done = _apt(install, INSTALL_DEADLINE_S)
                if done.returncode != 0:
                    return f"apt-get install {' '.join(need.packages)} failed: {done.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired as exc:
        return f"apt-get did not finish within {exc.timeout:.0f} s"
    missing = need.missing()
    return f"still missing after install: {', '.join(missing)}" if missing else None


def prefetch_in_background() -> threading.Thread | None:
    """Start installing every package the tests need, when root and some are missing; the thread, or None.

    Not a daemon: pytest's exit waits for it rather than killing dpkg halfway (bounded by the deadlines)."""
    wanted = [need for need in EVERY_NEED if need.missing()]
    if not wanted or not is_root() or shutil.which("apt-get") is None:
        return None
    everything = Need(tuple(p for need in wanted for p in need.packages),
                      tuple(c for need in wanted for c in need.commands),
                      tuple(f for need in wanted for f in need.files))
    thread = threading.Thread(target=ensure_packages, args=(everything,), name="apt-prefetch")
    thread.start()
    return thread
