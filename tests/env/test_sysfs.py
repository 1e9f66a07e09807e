"""NUMA, network and InfiniBand facts read from sysfs, and NCCL's device-list syntax.

The fake trees below are labelled stand-ins for a 2-socket GPU server's ``/sys`` (no such machine here),
laid out as the kernel does (Documentation/ABI/testing/sysfs-class-net, sysfs-class-infiniband,
sysfs-bus-pci, sysfs-devices-system-node); one test reads this machine's real ``/sys/class/net``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddpdoctor.env import sysfs


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.fixture
def two_socket_sys(tmp_path: Path) -> Path:
    """Stand-in /sys: eth0 and mlx5_0 on node 0, mlx5_1 (port down) on node 1, a GPU on node 1."""
    root = tmp_path / "sys"
    _write(root / "class/net/eth0/device/numa_node", "0")
    _write(root / "class/net/eth0/operstate", "up")
    _write(root / "class/net/lo/operstate", "unknown")  # virtual: no device/ link
    _write(root / "class/net/ib0/device/numa_node", "-1")
    for name, node, state in (("mlx5_0", "0", "4: ACTIVE"), ("mlx5_1", "1", "1: DOWN")):
        _write(root / f"class/infiniband/{name}/device/numa_node", node)
        _write(root / f"class/infiniband/{name}/ports/1/state", state)
    _write(root / "bus/pci/devices/0000:3b:00.0/numa_node", "1")
    _write(root / "devices/system/node/node0/cpulist", "0-3,8-11")
    _write(root / "devices/system/node/node1/cpulist", "4-7,12-15")
    return root


def test_fake_two_socket_tree(two_socket_sys: Path) -> None:
    nets = {d["name"]: d for d in sysfs.net_devices(two_socket_sys)}
    assert nets["eth0"]["numa_node"] == 0 and nets["eth0"]["operstate"] == "up"
    assert nets["lo"]["virtual"] is True and nets["lo"]["numa_node"] is None
    assert nets["ib0"]["numa_node"] is None  # -1: the platform does not say
    ib = {d["name"]: d for d in sysfs.ib_devices(two_socket_sys)}
    assert ib["mlx5_0"] == {"name": "mlx5_0", "numa_node": 0, "ports": {1: "ACTIVE"}}
    assert ib["mlx5_1"]["ports"] == {1: "DOWN"}
    assert sysfs.pci_numa_node("00000000:3B:00.0", two_socket_sys) == 1
    assert sysfs.numa_cpus(two_socket_sys) == {0: {0, 1, 2, 3, 8, 9, 10, 11}, 1: {4, 5, 6, 7, 12, 13, 14, 15}}


def test_missing_tree_reads_as_nothing(tmp_path: Path) -> None:
    assert sysfs.net_devices(tmp_path) == [] and sysfs.ib_devices(tmp_path) == []
    assert sysfs.pci_numa_node("00000000:3B:00.0", tmp_path) is None and sysfs.numa_cpus(tmp_path) == {}


def test_this_machines_network_interfaces() -> None:
    if not os.path.isdir("/sys/class/net"):
        pytest.skip("no /sys/class/net (not Linux)")
    names = sorted(os.listdir("/sys/class/net"))
    devices = sysfs.net_devices()
    assert [d["name"] for d in devices] == names
    assert next(d for d in devices if d["name"] == "lo")["virtual"] is True


def test_cpulist_and_ib_state_text() -> None:
    assert sysfs.parse_cpulist("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    assert sysfs.parse_cpulist("") == set()
    assert sysfs.parse_ib_state("4: ACTIVE") == "ACTIVE" and sysfs.parse_ib_state("1: DOWN") == "DOWN"
    assert sysfs.parse_numa_node("-1") is None and sysfs.parse_numa_node("1") == 1


def test_nccl_device_lists() -> None:
    # NCCL env docs: prefixes by default, "=" exact, "^" excludes, "name:port" for IB.
    assert sysfs.nccl_device_filter("^=mlx5_3:1,mlx5_4") == (True, True, [("mlx5_3", 1), ("mlx5_4", None)])
    assert sysfs.unmatched_names("eth", ["eth0", "lo"]) == []
    assert sysfs.unmatched_names("=eth", ["eth0", "lo"]) == ["eth"]
    assert sysfs.unmatched_names("ib0,enp", ["eth0", "lo"]) == ["ib0", "enp"]
    assert sysfs.unmatched_names("^docker", ["eth0"]) == []
