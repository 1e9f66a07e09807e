"""The multi-host lab for `ddpdoctor check` (issue 32): a host whose clock and interpreter differ.

One real two-host job, shared by every test here (a module-scoped fixture): nodeA and nodeB are network,
UTS, PID and mount namespaces of their own (tests/netns.py, ``whole_hosts``) joined by one link, one rank
each with srun-style variables (as tests/check/test_netns.py), ``ddpdoctor check --only env,barrier``. nodeB
differs from nodeA in two ways at once, as a node that missed an image update does:

1. **Its clock is 90 s ahead**: its rank runs under libfaketime (Debian's ``faketime``; ``LD_PRELOAD`` of
   libfaketimeMT with ``FAKETIME=+90s``). Its monotonic clock is shifted too: with
   ``FAKETIME_DONT_FAKE_MONOTONIC=1`` libfaketime 0.9.10 makes Python 3.11's ``time.sleep`` (an absolute
   ``clock_nanosleep`` on CLOCK_MONOTONIC) fail with EINVAL; a shifted monotonic clock still measures the
   same durations, and nothing compares its absolute value across hosts. Installed when root, skipped with
   the reason otherwise.
2. **Its interpreter differs**: nodeB runs Debian's ``/usr/bin/python3.11`` (3.11.2) with the venv's
   site-packages on PYTHONPATH, nodeA the venv's Python (3.11.7). What differs is *Python's patch version,
   not torch's*: this machine has one torch build (the venv's), which both interpreters import, so a stale
   torch on one node is stood in for by the stale interpreter; the env check compares both the same way
   (torch, python, CUDA, NCCL versions per rank).

What the user must read: the python version FAIL naming nodeb with both versions and the remedy; a WARN
"nodeb: clock 90 s ahead of nodea"; each cause once; exit 1 (a FAIL); the barrier's wait times are
durations on each rank's monotonic clock, so the 90 s do not show up in them; the report fits one screen.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.debian import FAKETIME, ensure_packages
from tests.netns import NetnsHosts
from tests.support import REPO, clean_env, communicate_all, have_netns

pytestmark = [pytest.mark.requires_netns, pytest.mark.slow]

PORT = 29556
SKEW = "+90s"
OLD_PYTHON = "/usr/bin/python3.11"
HOSTS = ("nodea", "nodeb")


@dataclass
class Job:
    codes: list[int]
    out: str  # rank 0's report
    errs: list[str]
    report: dict[str, Any]

    def why(self) -> str:
        return f"exit {self.codes}\n{self.out}\n--- rank 0 stderr:\n{self.errs[0][-2000:]}\n--- rank 1:\n{self.errs[1][-2000:]}"


def faketime_library() -> str | None:
    """libfaketime's thread-safe build (torch starts threads), installing Debian's ``faketime`` when root."""
    ensure_packages(FAKETIME)
    found = sorted(glob.glob(FAKETIME.files[0]))
    return found[0] if found else None


def old_interpreter_problem() -> str | None:
    """Why Debian's python3.11 cannot stand in for a stale interpreter here, or None."""
    if not os.path.exists(OLD_PYTHON):
        return f"{OLD_PYTHON} (Debian's python3.11) is not installed"
    probe = subprocess.run([OLD_PYTHON, "-c", "import platform, torch; print(platform.python_version())"],
                           env=clean_env({"PYTHONPATH": site_packages()}), capture_output=True, text=True,
                           timeout=120)
    if probe.returncode != 0:
        return f"{OLD_PYTHON} cannot import the venv's torch: {probe.stderr.strip().splitlines()[-1:]}"
    if probe.stdout.strip() == ".".join(map(str, sys.version_info[:3])):
        return f"{OLD_PYTHON} is the same version as this interpreter ({probe.stdout.strip()})"
    return None


def site_packages() -> str:
    import torch

    return os.pathsep.join([str(REPO), str(Path(torch.__file__).resolve().parents[1])])


def rank_env(rank: int, master: str, ifname: str) -> dict[str, str]:
    return clean_env({"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                      "SLURM_NODEID": str(rank), "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4343",
                      "SLURM_JOB_NODELIST": "nodea,nodeb", "SLURM_TASKS_PER_NODE": "1(x2)",
                      "MASTER_ADDR": master, "MASTER_PORT": str(PORT), "GLOO_SOCKET_IFNAME": ifname,
                      "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    if not have_netns():
        pytest.skip("needs root and iproute2 (ip, tc, unshare) for network namespaces")
    library = faketime_library()
    if library is None:
        pytest.skip("libfaketime (Debian's faketime) is not installed and could not be installed (needs root)")
    problem = old_interpreter_problem()
    if problem is not None:
        pytest.skip(problem)
    tmp = tmp_path_factory.mktemp("check-lab")
    report = tmp / "report.json"
    with NetnsHosts(2, whole_hosts=True, subnet="10.79") as hosts:
        procs = []
        for rank, name in enumerate(HOSTS):
            python = sys.executable if rank == 0 else OLD_PYTHON
            argv = [python, "-m", "ddpdoctor", "check", "--only", "env,barrier", "--timeout", "30"]
            env = rank_env(rank, hosts.ip(0), hosts.ifname(rank))
            if rank == 0:
                argv += ["--json", str(report)]
            else:
                env.update({"PYTHONPATH": site_packages(), "LD_PRELOAD": library, "FAKETIME": SKEW})
            procs.append(subprocess.Popen(hosts.command(rank, name, argv), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, cwd=tmp))
        results = communicate_all(procs, timeout=180)
    yield Job([r[0] for r in results], results[0][1], [r[2] for r in results],
              json.loads(report.read_text()) if report.exists() else {})


def env_findings(job: Job) -> list[dict[str, Any]]:
    return [f for f in job.report.get("findings", []) if f["check"] == "env"]


def test_the_stale_interpreter_fails_naming_nodeb_both_versions_and_the_remedy(job: Job) -> None:
    assert job.codes[0] == 1, job.why()  # a FAIL: exit 1 (rank 1 exits 0 under srun, as torchrun's ranks do)
    mine = ".".join(map(str, sys.version_info[:3]))
    python = [f for f in env_findings(job) if f["details"].get("component") == "python"]
    assert len(python) == 1 and python[0]["status"] == "fail", job.why()
    summary = python[0]["summary"]
    assert f"'{mine}' on rank 0 (nodea)" in summary and "'3.11.2' on rank 1 (nodeb)" in summary, summary
    assert python[0]["ranks"] == [1]
    assert "install the same python version on every node" in python[0]["remedy"]
    assert "nodeb" in python[0]["remedy"]
    assert python[0]["details"]["by_host"] == {"nodea": [mine], "nodeb": ["3.11.2"]}
    text = " ".join(job.out.split())  # the table wraps long summaries
    assert "python version differs across ranks" in text and "'3.11.2' on rank 1 (nodeb)" in text
    # One torch build on this machine: torch itself agrees, and is not reported.
    assert not [f for f in env_findings(job) if f["details"].get("component") == "torch"]


def test_the_clock_90_s_ahead_is_a_warning_naming_nodeb_with_its_offset(job: Job) -> None:
    clock = [f for f in env_findings(job) if f["details"].get("kind") == "clock_offset"]
    assert len(clock) == 1 and clock[0]["status"] == "warn", job.why()
    assert clock[0]["summary"] == "nodeb: clock 90 s ahead of nodea (rank 0's host)"
    assert clock[0]["ranks"] == [1]
    details = clock[0]["details"]
    assert details["reference_host"] == "nodea" and set(details["offsets_s"]) == {"nodeb"}
    # The measured offset, within its bound (half the store round trip) and a generous margin for load.
    assert abs(details["offsets_s"]["nodeb"] - 90) <= details["error_s"]["nodeb"] + 2
    text = " ".join(job.out.split())
    assert "nodeb: clock 90 s ahead of nodea" in text and "run chrony or ntpd on nodeb" in text


def test_hosts_are_named_each_cause_once_and_the_report_fits_one_screen(job: Job) -> None:
    assert job.report["hosts"] == {"nodea": [0], "nodeb": [1]}, job.why()
    assert {r["host"] for r in job.report["ranks"]} == {"nodea", "nodeb"}
    problems = [f for f in job.report["findings"] if f["status"] in ("fail", "warn", "error")]
    # Two causes, two findings: the interpreter (FAIL) and the clock (WARN); nothing else is blamed.
    assert sorted((f["status"], f["summary"].split(":")[0]) for f in problems) == [
        ("fail", "python version differs across ranks"), ("warn", "nodeb")], job.why()
    assert job.report["status"] == "fail"
    # One screen: at most 30 rows of a 120-column terminal, long lines counted as they wrap.
    rows = sum(max(1, -(-len(line) // 120)) for line in job.out.strip().splitlines())
    assert rows <= 30, job.out


def test_the_barriers_wait_times_are_durations_not_clock_differences(job: Job) -> None:
    barrier = next(f for f in job.report["findings"] if f["check"] == "barrier")
    assert barrier["status"] == "pass", job.why()
    waited = barrier["details"]["waited_ms"]
    assert set(waited) == {"0", "1"}
    # Each rank times its own wait on its monotonic clock: the 90 s between the wall clocks is nowhere.
    assert all(float(ms) < 30_000 for ms in waited.values()), barrier
