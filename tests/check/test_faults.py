"""`ddpdoctor check` under real torchrun launches with real injected faults.

Each test starts a real torchrun job (gloo on CPU) through tests/faults/rank_fault.py, which runs the
doctor on every rank but breaks one rank for real: it sleeps instead of starting, SIGKILLs itself inside
a check, or runs with a different environment variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.support import PG_NOT_DESTROYED, REPO, clean_env, free_port, torchrun_cmd

FAULT = str(REPO / "tests" / "faults" / "rank_fault.py")

pytestmark = pytest.mark.slow


def run_faulty_job(tmp_path: Path, fault: str, fault_rank: int, *check_args: str, nproc: int = 2,
                   timeout: float = 150) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    report = tmp_path / "report.json"
    cmd = [*torchrun_cmd(), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "--monitor-interval", "0.1",
           FAULT, fault, str(fault_rank), "--", "check", "--json", str(report), *check_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=tmp_path)
    assert report.exists(), f"no JSON report; stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return proc, json.loads(report.read_text())


def leftover_processes(marker: str) -> list[str]:
    """Processes still running whose command line mentions this test's unique path."""
    time.sleep(0.5)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if marker in cmdline and proc.pid != os.getpid():
            found.append(f"{proc.pid}: {cmdline}")
    return found


def unreported(report: dict) -> list[dict]:  # type: ignore[type-arg]
    return [f for f in report["findings"] if f["status"] == "fail" and "did not report" in f["summary"]]


def test_rank_that_never_starts_is_named_within_the_deadline(tmp_path: Path) -> None:
    start = time.monotonic()
    proc, report = run_faulty_job(tmp_path, "sleep", 1, "--timeout", "4")
    assert proc.returncode == 1
    assert report["status"] == "fail"
    missing = unreported(report)
    assert [f["ranks"] for f in missing] == [[1]]
    assert "never joined" in missing[0]["summary"]
    # The report is printed by rank 0, root cause first: the first row of the table is the missing rank.
    table_rows = proc.stdout.split("-----\n", 1)[1].splitlines()
    assert table_rows[0].startswith("barrier") and "did not report" in table_rows[0]
    # ...and only once: the barrier check does not wait for (and report) a rank that never joined. (The
    # skipped checks give the same cause as their reason: "process group is not usable (rank 1 never joined)".)
    assert sum("rank 1" in f["summary"] for f in report["findings"] if f["status"] != "skip") == 1
    assert all("(rank 1 never joined)" in f["summary"] for f in report["findings"]
               if f["status"] == "skip" and "rank 1" in f["summary"])
    # Checks that need all ranks were skipped with the reason, local checks still ran on rank 0.
    by_check = {f["check"]: f for f in report["findings"] if f["ranks"] == [0]}
    assert by_check["connectivity"]["status"] == "skip"
    assert "never joined" in by_check["connectivity"]["summary"]
    # Rendezvous, checks and collection each have the 4 s deadline; allow for a slow, loaded machine.
    assert time.monotonic() - start < 3 * 4 + 60
    assert PG_NOT_DESTROYED not in proc.stderr
    assert leftover_processes(str(tmp_path)) == []


def test_rank_killed_inside_a_check_is_named(tmp_path: Path) -> None:
    proc, report = run_faulty_job(tmp_path, "kill-in-check", 1, "--timeout", "8")
    assert proc.returncode == 1
    assert report["status"] == "fail"
    missing = unreported(report)
    assert missing, report["findings"]
    assert missing[0]["ranks"] == [1]
    assert "went silent" in missing[0]["summary"] and "connectivity" in missing[0]["summary"]
    host_pid = report["ranks"][1]
    assert host_pid["rank"] == 1 and host_pid["pid"] > 0
    assert str(host_pid["pid"]) in missing[0]["summary"]
    assert PG_NOT_DESTROYED not in proc.stderr  # rank 0 left with its group broken by the dead peer
    assert leftover_processes(str(tmp_path)) == []


def test_env_var_differing_on_one_rank_fails_env_naming_variable_and_rank(tmp_path: Path) -> None:
    proc, report = run_faulty_job(tmp_path, "env:NCCL_SOCKET_IFNAME=lo", 1, "--only", "env", nproc=3)
    assert proc.returncode == 1
    env_fails = [f for f in report["findings"] if f["check"] == "env" and f["status"] == "fail"]
    assert env_fails, report["findings"]
    differs = [f for f in env_fails if "NCCL_SOCKET_IFNAME differs" in f["summary"]]
    assert len(differs) == 1
    assert differs[0]["ranks"] == [1]
    assert "'lo' on rank 1" in differs[0]["summary"] and "(unset) on ranks 0,2" in differs[0]["summary"]
    assert "NCCL_SOCKET_IFNAME differs" in proc.stdout


def test_socket_ifname_naming_no_interface_fails_env(tmp_path: Path) -> None:
    proc, report = run_faulty_job(tmp_path, "env:GLOO_SOCKET_IFNAME=nosuch0", 0, "--only", "env")
    assert proc.returncode == 1
    summaries = [f["summary"] for f in report["findings"] if f["status"] == "fail"]
    assert any("GLOO_SOCKET_IFNAME=nosuch0 names nosuch0, which this host does not have" in s for s in summaries)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without a CUDA GPU")
def test_nccl_on_a_host_without_gpus_under_torchrun_names_the_cause(tmp_path: Path) -> None:
    """Under a launcher the ranks are already running: the reason is a FAIL row, not a firewall hint."""
    report = tmp_path / "report.json"
    cmd = [*torchrun_cmd(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
           str(free_port()), "-m", "ddpdoctor", "check", "--backend", "nccl", "--only", "env,connectivity",
           "--json", str(report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=clean_env(), cwd=REPO)
    assert proc.returncode != 0
    fails = [f for f in json.loads(report.read_text())["findings"] if f["status"] == "fail"]
    assert [f["check"] for f in fails] == ["connectivity"], fails
    assert "--backend nccl needs a CUDA GPU and none is visible" in fails[0]["summary"]
    assert "NCCL_SOCKET_IFNAME" not in fails[0]["remedy"]


SLOW_FACTORY = """\
import pathlib, time
import torch.distributed as dist
from torch import nn


def build():
    if dist.is_initialized():
        pathlib.Path(__file__).with_name(f"building_{dist.get_rank()}").touch()
    time.sleep(120)
    return nn.Linear(16, 4)
"""


def test_an_interrupted_self_launched_check_blames_no_rank(tmp_path: Path) -> None:
    """Ctrl-C or a scheduler's SIGTERM to `ddpdoctor check` while its ranks run a check: every rank is stopped by
    the same signal, and the report named rank 1 as "joined, then went silent" with the OOM killer to look for
    (an explorer's find). Now it says the run was interrupted, blames no rank, and exits 128 + the signal."""
    (tmp_path / "slow_model.py").write_text(SLOW_FACTORY)
    report = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "check", "--only", "unused_params", "--model", "slow_model:build",
                             "--input-shape", "4,16", "--json", str(report)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"building_{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (tmp_path / "building_1").exists(), "the ranks never reached the check"
        proc.terminate()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    doc = json.loads(report.read_text())
    summaries = [f["summary"] for f in doc["findings"]]
    assert any(s.startswith("the run was interrupted (SIGTERM to ddpdoctor)") for s in summaries), summaries
    assert not any("went silent" in s or "did not report" in s for s in summaries), summaries
    assert "went silent" not in out and "OOM killer" not in out
