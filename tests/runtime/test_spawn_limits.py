"""Self-launch at the machine's limits, for real: absurd --nproc, and a fork that fails midway.

The fork failure is produced by the kernel, not mocked: the CLI runs inside a fresh cgroup-v1 ``pids``
controller whose ``pids.max`` leaves room for a few ranks, so the launcher's next ``fork`` gets EAGAIN
("Resource temporarily unavailable"), exactly what a full process table or RLIMIT_NPROC gives. The cgroup
also counts what is left behind: after the CLI exits, ``cgroup.procs`` must be empty (no orphan ranks).
Needs root and a writable pids controller; skipped cleanly otherwise.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import clean_env

PIDS_ROOT = Path("/sys/fs/cgroup/pids")


@pytest.fixture
def pids_cgroup() -> Iterator[Path]:
    """A private pids cgroup; every process still in it at the end is killed and reported."""
    if os.geteuid() != 0 or not (PIDS_ROOT / "cgroup.procs").exists():
        pytest.skip("needs root and a cgroup-v1 pids controller at /sys/fs/cgroup/pids")
    group = PIDS_ROOT / f"ddpdoctor-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a pids cgroup: {exc}")
    try:
        yield group
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = _members(group)
            if not pids:
                break
            for pid in pids:  # only processes this test started live in this cgroup
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            group.rmdir()


def _members(group: Path) -> list[int]:
    return [int(p) for p in (group / "cgroup.procs").read_text().split()]


def _run_in(group: Path, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    procs = group / "cgroup.procs"

    def enter() -> None:  # in the child, before exec: it and everything it starts are counted
        procs.write_text(str(os.getpid()))

    return subprocess.run([sys.executable, "-m", "ddpdoctor", *args], capture_output=True, text=True,
                          timeout=timeout, env=clean_env(), preexec_fn=enter)


def _left_behind(group: Path) -> list[int]:
    """Processes still in the cgroup a moment after the CLI returned (a killed rank needs an instant)."""
    deadline = time.monotonic() + 3
    while (pids := _members(group)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


def test_absurd_nproc_is_refused_before_anything_starts(pids_cgroup: Path) -> None:
    # pids.max only keeps an unfixed build from filling the machine: the refusal must come first.
    (pids_cgroup / "pids.max").write_text("40")
    proc = _run_in(pids_cgroup, ["check", "--nproc", "100000"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "at most" in lines[0] and "MiB per rank" in lines[0], lines
    assert not _left_behind(pids_cgroup)
    # Nothing was forked at all: the cgroup never held more than the CLI itself.
    assert int((pids_cgroup / "pids.peak").read_text()) <= 2 if (pids_cgroup / "pids.peak").exists() else True


def test_fork_failing_midway_stops_the_ranks_already_started(pids_cgroup: Path) -> None:
    # Room for the launcher (a few threads: the agent, the store) and a few ranks, not for 12.
    (pids_cgroup / "pids.max").write_text("9")
    proc = _run_in(pids_cgroup, ["check", "--nproc", "12", "--timeout", "20"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode in (1, 2), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert any("could not start" in line for line in lines), lines
    assert not _left_behind(pids_cgroup), "ranks outlived the launcher"
