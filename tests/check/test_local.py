"""`ddpdoctor check` run as a user would: self-launched local ranks, srun-style ranks, a busy port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import clean_env, communicate_all, free_port, run_cli

pytestmark = pytest.mark.slow


def test_self_launch_on_a_cpu_machine_passes_and_writes_the_json_contract(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = run_cli(["check", "--nproc", "3", "--json", str(out)], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    # One report, printed once (by rank 0), with every design check that can run here.
    assert proc.stdout.count("ddpdoctor check:") == 1
    assert "3 ranks on 1 host" in proc.stdout and "backend gloo" in proc.stdout
    data = json.loads(out.read_text())
    # 3 ranks on a 2-core machine are crowded: the bandwidth check may warn about that. A rank starved by
    # another process on those cores (a second job on a shared CI machine) may also be named as slow, which
    # is then true; nothing else may warn.
    warned = [f["summary"] for f in data["findings"] if f["status"] != "pass" and f["status"] != "skip"]
    assert data["tool"] == "ddpdoctor" and data["status"] in ("pass", "warn")
    crowding = [s for s in warned if "CPU core" in s]
    assert all(s in crowding or (crowding and s.startswith("rank ") and " is slow" in s) for s in warned), warned
    assert data["world_size"] == 3 and data["backend"] == "gloo"
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2]
    assert all(r["pid"] > 0 and r["host"] == socket.gethostname() for r in data["ranks"])
    statuses = {f["check"]: f["status"] for f in data["findings"]}
    assert statuses["connectivity"] == "pass" and statuses["barrier"] == "pass" and statuses["env"] == "pass"
    assert statuses["port"] == "pass"
    # Without a GPU the GPU check says skip, never pass.
    assert statuses["gpu"] == "skip"
    connectivity = next(f for f in data["findings"] if f["check"] == "connectivity")
    assert connectivity["ranks"] == [0, 1, 2]


def test_busy_master_port_names_the_holder_and_exits_1_without_traceback() -> None:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        proc = run_cli(["check", "--nproc", "2", "--master-port", str(port)], timeout=120)
    finally:
        holder.close()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"MASTER_PORT {port} is already in use" in lines[0]
    assert f"pid {os.getpid()}" in lines[0]  # this test process holds it
    assert "--master-port" in lines[0]


def test_master_port_from_environment_is_checked_the_same_way() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = run_cli(["check", "--nproc", "2"], env=clean_env({"MASTER_PORT": str(port)}), timeout=120)
    assert proc.returncode == 1
    assert f"MASTER_PORT {port} is already in use" in proc.stderr


def start_srun_style_ranks(world: int, port: int, tmp_path: Path, extra_env: dict[int, dict[str, str]] | None = None,
                           args: tuple[str, ...] = (), only: list[int] | None = None) -> list[subprocess.Popen[str]]:
    """Start the ranks of a `world` the way srun does (same command, SLURM_* variables; rank 0 hosts the
    store): all of them, or the ranks listed in `only`."""
    procs = []
    for rank in range(world) if only is None else only:
        env = clean_env({"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world), "SLURM_LOCALID": str(rank),
                         "SLURM_NODEID": "0", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "777",
                         "SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": str(world),
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **(extra_env or {}).get(rank, {})})
        procs.append(subprocess.Popen([sys.executable, "-m", "ddpdoctor", "check", *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path))
    return procs


def test_srun_style_launch_with_rank0_hosting_the_store(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    procs = start_srun_style_ranks(2, free_port(), tmp_path, args=("--json", str(out), "--timeout", "20"))
    (code0, stdout0, err0), (code1, stdout1, _) = communicate_all(procs)
    assert code0 == 0, stdout0 + err0
    assert code1 == 0
    assert "launcher slurm" in stdout0 and stdout1 == ""  # only rank 0 prints
    data = json.loads(out.read_text())
    assert data["status"] == "pass" and data["world_size"] == 2


def test_srun_style_rank_with_wrong_master_port_says_what_it_could_not_reach(tmp_path: Path) -> None:
    # Rank 1 is pointed at a port where nothing listens: it cannot reach the control plane.
    port = free_port()
    wrong = free_port()
    procs = start_srun_style_ranks(2, port, tmp_path, extra_env={1: {"MASTER_PORT": str(wrong)}},
                                   args=("--timeout", "4"))
    (code0, stdout0, _), (code1, _, err1) = communicate_all(procs)
    assert code0 == 1 and code1 == 1
    assert f"rank 1 on {socket.gethostname()}: cannot reach the control plane at MASTER_ADDR:MASTER_PORT " \
           f"127.0.0.1:{wrong}" in err1
    assert "did not report" in stdout0 and "never joined" in stdout0


def test_two_processes_claiming_one_rank_are_named(tmp_path: Path) -> None:
    # A broken task layout: two processes both claim rank 1 of a world of 2. They start first and wait
    # for rank 0's store (as they would for a slow head node), so both are in before rank 0 looks.
    out = tmp_path / "r.json"
    port = free_port()
    claimants = start_srun_style_ranks(2, port, tmp_path, args=("--timeout", "30", "--only", "env"), only=[1, 1])
    time.sleep(10)  # both claimants have imported torch and poll for the store (generous: CI may be loaded)
    [rank0] = start_srun_style_ranks(2, port, tmp_path, args=("--json", str(out), "--timeout", "30", "--only", "env"),
                                     only=[0])
    results = communicate_all([rank0, *claimants])
    assert results[0][0] == 1 and out.exists(), results[0][1] + results[0][2]
    data = json.loads(out.read_text())
    claimed = [f for f in data["findings"] if "claimed by 2 processes" in f["summary"]]
    assert len(claimed) == 1 and claimed[0]["ranks"] == [1] and claimed[0]["status"] == "fail"
    pids = {c["pid"] for c in claimed[0]["details"]["claimants"]}
    assert pids == {p.pid for p in claimants}
