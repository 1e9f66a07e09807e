"""`ddpdoctor check` across two "hosts": network namespaces joined by a real link, srun-style ranks.

Skipped without root and iproute2. Each host has its own hostname (UTS namespace), so per-host grouping
and host names in the report are tested for real.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns import NetnsHosts
from tests.support import clean_env, communicate_all

pytestmark = [pytest.mark.requires_netns, pytest.mark.slow]

PORT = 29555


def rank_env(rank: int, world: int, master_addr: str, ifname: str) -> dict[str, str]:
    return clean_env({"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world), "SLURM_LOCALID": "0",
                      "SLURM_NODEID": str(rank), "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242",
                      "SLURM_JOB_NODELIST": "nodea,nodeb", "SLURM_TASKS_PER_NODE": f"1(x{world})",
                      "MASTER_ADDR": master_addr, "MASTER_PORT": str(PORT), "GLOO_SOCKET_IFNAME": ifname})


def run_two_hosts(tmp_path: Path, master_addr_b: str, timeout: str,
                  blocked_on_a: int | None = None) -> tuple[list[tuple[int, str, str]], dict]:  # type: ignore[type-arg]
    report = tmp_path / "r.json"
    with NetnsHosts(2) as hosts:
        if blocked_on_a is not None:
            hosts.block_port(0, blocked_on_a)  # a firewall rule on nodeA, as between real nodes
        procs = []
        for rank, (hostname, master) in enumerate((("nodea", hosts.ip(0)), ("nodeb", master_addr_b))):
            argv = [sys.executable, "-m", "ddpdoctor", "check", "--timeout", timeout, "--skip", "gpu"]
            if rank == 0:
                argv += ["--json", str(report)]
            procs.append(subprocess.Popen(
                hosts.command(rank, hostname, argv), env=rank_env(rank, 2, master, hosts.ifname(rank)),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path))
        results = communicate_all(procs)
    return results, json.loads(report.read_text()) if report.exists() else {}


def test_two_hosts_pass_and_are_named_per_host(tmp_path: Path) -> None:
    results, report = run_two_hosts(tmp_path, "10.77.0.1", "30")
    (code0, out0, err0), (code1, _, err1) = results
    assert code0 == 0, out0 + err0 + err1
    assert code1 == 0
    assert "2 ranks on 2 hosts (nodea, nodeb)" in out0
    assert "hosts: nodea: rank 0; nodeb: rank 1" in out0  # where each rank runs (issue 32)
    assert report["hosts"] == {"nodea": [0], "nodeb": [1]}
    assert report["status"] == "pass"
    assert {r["host"] for r in report["ranks"]} == {"nodea", "nodeb"}
    connectivity = next(f for f in report["findings"] if f["check"] == "connectivity")
    assert connectivity["status"] == "pass"
    assert connectivity["details"]["per_rank"]["0"]["hosts"] == ["nodea", "nodeb"]


def test_wrong_master_addr_on_the_second_host_is_named(tmp_path: Path) -> None:
    results, report = run_two_hosts(tmp_path, "10.77.0.9", "5")
    (code0, out0, _), (code1, _, err1) = results
    assert code0 == 1 and code1 == 1
    # The rank that could not reach the master says which rank it is, where, and what it tried to reach.
    assert "rank 1 on nodeb: cannot reach the control plane at MASTER_ADDR:MASTER_PORT 10.77.0.9:29555" in err1
    # Rank 0's report names rank 1 as never joining, and says where to look.
    missing = [f for f in report["findings"] if "did not report" in f["summary"]]
    assert [f["ranks"] for f in missing] == [[1]]
    assert "never joined" in missing[0]["summary"] and "MASTER_ADDR" in missing[0]["remedy"]
    assert "did not report" in out0


def test_the_store_port_blocked_on_the_master_host_is_named(tmp_path: Path) -> None:
    """Issue 32's lab: nodeA drops every packet of the store's port (a firewall between nodes). nodeB has the
    right MASTER_ADDR and still never joins; both sides say so, with the address and port it tried."""
    results, report = run_two_hosts(tmp_path, "10.77.0.1", "5", blocked_on_a=PORT)
    (code0, out0, _), (code1, _, err1) = results
    assert "did not report" in out0
    assert code0 == 1 and code1 == 1, err1
    assert "rank 1 on nodeb: cannot reach the control plane at MASTER_ADDR:MASTER_PORT 10.77.0.1:29555" in err1
    missing = [f for f in report["findings"] if "did not report" in f["summary"]]
    assert [f["ranks"] for f in missing] == [[1]]
    assert "never joined" in missing[0]["summary"] and "10.77.0.1:29555" in missing[0]["remedy"]
    assert "the port is open between the nodes" in err1  # what to look at: the path between nodes, not the code
