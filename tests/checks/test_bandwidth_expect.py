"""`check`'s bandwidth figures against what the path should give, across two real "hosts" (network namespaces,
tests/netns.py) whose link is shaped with a tc tbf qdisc: one job, every assertion about what the user reads.

The GPU-only checks (pcie_bandwidth, memory_bandwidth) run in the same job and must say ``skip`` with the
reason on these CPU ranks, never ``pass``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.netns import NetnsHosts, torchrun_on_hosts

pytestmark = [pytest.mark.requires_netns, pytest.mark.slow]


def test_a_shaped_link_is_a_small_percentage_of_the_interface_speed_with_the_qdisc_named(tmp_path: Path) -> None:
    report = tmp_path / "check.json"
    port = 30000 + os.getpid() % 1000
    with NetnsHosts(2, subnet=f"10.{200 + os.getpid() % 50}") as hosts:
        hosts.rate_limit(1, "200mbit")
        outputs = torchrun_on_hosts(hosts, ("nodeA", "nodeB"), port,
                                    ["check", "--only", "bandwidth,pcie_bandwidth,memory_bandwidth", "--timeout", "60",
                                     "--json", str(report)])
    stdout = outputs[0][1]
    print(stdout)
    assert outputs[0][0] == 1, outputs
    data = json.loads(report.read_text())
    assert data["status"] == "fail"
    [below] = [f for f in data["findings"] if f["check"] == "bandwidth" and f["status"] == "fail"]
    # Measured as a few percent of the 10000 Mb/s (1.25 GB/s) both interfaces report, the qdisc named.
    verdict = below["details"]["verdict"]
    assert verdict["expected_busbw_gbps"] == 1.25 and verdict["pct"] < 10, verdict
    assert "% of the 1.25 GB/s expected on Ethernet dd0 at 10000 Mb/s (virtual: nominal) on nodeA, nodeB" \
        in below["summary"]
    assert "bottleneck: a tbf qdisc on dd0 of nodeB shapes the link to 200 Mbit/s (0.025 GB/s)" in below["summary"]
    assert verdict["bottlenecks"][0]["cause"] == "qdisc" and below["ranks"] == [0, 1]
    assert below["remedy"].startswith("remove or raise the shaping qdisc")
    # When the figure reaches most of the shaped rate the qdisc explains it: no second cause is blamed.
    if verdict["measured_busbw_gbps"] >= 0.7 * verdict["bottlenecks"][0]["limit_gbps"]:
        assert len(verdict["bottlenecks"]) == 1, verdict
    # The GPU-only checks: skip with the reason on CPU ranks, never pass.
    for check in ("pcie_bandwidth", "memory_bandwidth"):
        found = [f for f in data["findings"] if f["check"] == check]
        assert [f["status"] for f in found] == ["skip"], found
        assert "not a GPU" in found[0]["summary"] and found[0]["ranks"] == [0, 1]
