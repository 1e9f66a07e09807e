"""Expected bandwidth per path (bench.expect) and the facts behind it (env.links).

The readers run on this machine's real sysfs, ``ip`` and ``tc`` and on a small tree shaped like the real one
for what this machine lacks (InfiniBand ports, PCIe link attributes). GPU and NCCL facts cannot exist here:
where a test needs them, the dicts are MOCKS of what NVML and NCCL_DEBUG=INFO report, and say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.bench.expect import (
    Thresholds,
    assess,
    bottlenecks,
    collective_path,
    host_groups_text,
    judge,
    nic_gbps,
    nvlink_gbps,
    pair_path,
    pcie_gbps,
    thresholds_from_options,
)
from ddpdoctor.bench.render import render_expectation
from ddpdoctor.env import links
from ddpdoctor.errors import DoctorError
from tests.support import run_cli


def _eth(host: str, speed: int | None, *, kind: str | None = None, virtual: bool = False,
         qdisc_rate: float | None = None, backend: str = "gloo", env: dict[str, str] | None = None,
         ib: list[dict[str, Any]] | None = None, gpu: dict[str, Any] | None = None,
         cpu_nodes: list[int] | None = None) -> dict[str, Any]:
    qdiscs = [{"kind": "tbf", "handle": "8001:", "root": True, "rate_bytes_per_s": qdisc_rate}] if qdisc_rate else []
    return {"backend": backend, "interface": {"name": "eth0", "exists": True, "speed_mbps": speed, "operstate": "up",
                                              "kind": kind, "virtual": virtual, "numa_node": None, "pci": None,
                                              "qdiscs": qdiscs},
            "interface_from": "GLOO_SOCKET_IFNAME=eth0", "ib_ports": ib or [], "env": env or {},
            "cpu_numa_nodes": cpu_nodes or [0], "gpu": gpu}


# -- NCCL's model, as NCCL writes it (src/graph/topo.h, topo.cc at v2.30.7-1) --------------------------


def test_the_model_gives_nccls_published_figures() -> None:
    # PCIe Gen3/4/5 x16 = 12/24/48 GB/s (the figures; NCCL's PCI_BW 12.0 "PCI Gen3 x16").
    assert [pcie_gbps(g, 16) for g in (3, 4, 5)] == [12.0, 24.0, 48.0]
    assert pcie_gbps(4, 8) == 12.0 and pcie_gbps(0, 16) is None
    # 100/200/400 Gb/s NICs: speed / 8000.
    assert [nic_gbps(s) for s in (100_000, 200_000, 400_000)] == [12.5, 25.0, 50.0]
    # H100 (sm90) with 18 NVLinks: the ~370 GB/s ring all_reduce busbw; A100 (sm80) with 12: ~230-240.
    assert nvlink_gbps([9, 0], 18) == pytest.approx(370.8)
    assert nvlink_gbps([8, 0], 12) == pytest.approx(240.0)
    assert nvlink_gbps([8, 6], 4) == pytest.approx(48.0)


# -- two ranks on one host ----------------------------------------------------------------------------


def test_two_gloo_ranks_on_one_host_have_no_model_and_no_verdict() -> None:
    facts = {0: _eth("vm", None), 1: _eth("vm", None)}
    hosts = {0: "vm", 1: "vm"}
    path = collective_path(facts, hosts)
    assert path.expected_gbps is None and "loopback TCP" in path.why
    verdict = judge(0.3, path, [], Thresholds())
    assert verdict.status == "none" and verdict.pct is None
    text = render_expectation(verdict, Thresholds())
    assert "no model applies" in text and "below" not in text


# -- shaped and virtual links ------------------------------------------------------------------------


def test_a_shaped_veth_fails_with_its_qdisc_named_and_an_unshaped_one_is_not_judged() -> None:
    hosts = {0: "nodeA", 1: "nodeB"}
    shaped = {0: _eth("nodeA", 10000, kind="veth", virtual=True),
              1: _eth("nodeB", 10000, kind="veth", virtual=True, qdisc_rate=25e6)}
    result = assess({}, [], shaped, hosts, Thresholds())
    path = collective_path(shaped, hosts)
    assert path.expected_gbps == 1.25 and path.nominal
    assert path.description == "Ethernet eth0 at 10000 Mb/s (virtual: nominal) on nodeA, nodeB"
    evidence = bottlenecks(path, shaped, hosts, [0, 1])
    verdict = judge(0.024, path, evidence, Thresholds())
    assert verdict.status == "fail" and verdict.pct == pytest.approx(1.92)
    assert verdict.explained and "tbf qdisc on eth0 of nodeB shapes the link to 200 Mbit/s" in verdict.cause()
    assert "measured 96 % of that" in verdict.cause()
    assert result.per_op == {}
    # The same link without the qdisc: the veth's 10000 Mb/s is a constant, nothing shows a limit: a note.
    plain = {0: shaped[0], 1: _eth("nodeB", 10000, kind="veth", virtual=True)}
    assert judge(0.3, collective_path(plain, hosts), [], Thresholds()).status == "note"


def test_a_nic_that_reports_no_speed_has_no_model() -> None:
    facts = {0: _eth("a", None), 1: _eth("b", 25000)}
    path = pair_path(facts[0], facts[1], "a", "b")
    assert path.expected_gbps is None and "reports no speed" in path.why and "assumes 10000" in path.why


def test_a_physical_nic_below_the_margin_warns_then_fails() -> None:
    facts = {0: _eth("a", 25000), 1: _eth("b", 25000)}
    path = pair_path(facts[0], facts[1], "a", "b")
    assert path.expected_gbps == pytest.approx(3.125) and not path.nominal
    limits = Thresholds(fail_pct=50, warn_pct=90)
    assert judge(3.0, path, [], limits).status == "pass"
    assert judge(2.0, path, [], limits).status == "warn"
    assert judge(1.0, path, [], limits).status == "fail"


# -- NCCL facts (MOCK: NCCL and IB cannot exist on this machine) ----------------------------------------

_IB_ACTIVE = [{"hca": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_text": "200 Gb/sec (4X HDR)", "rate_gbps": 200.0,
               "link_layer": "InfiniBand", "numa_node": 0}]


def test_mock_nccl_on_sockets_where_ib_is_active_names_nccl_ib_disable() -> None:
    hosts = {0: "a", 1: "b"}
    facts = {r: _eth(h, 100000, backend="nccl", env={"NCCL_IB_DISABLE": "1"}, ib=_IB_ACTIVE) for r, h in hosts.items()}
    path = collective_path(facts, hosts)
    assert path.kind == "ethernet" and path.expected_gbps == 12.5
    causes = bottlenecks(path, facts, hosts, [0, 1])
    assert causes[0].cause == "sockets" and "NCCL_IB_DISABLE=1 is set" in causes[0].text
    assert "mlx5_0:1" in causes[0].text
    # Without the variable NCCL takes the IB port: 200 Gb/s -> 25 GB/s.
    ib = {r: _eth(h, 100000, backend="nccl", ib=_IB_ACTIVE) for r, h in hosts.items()}
    assert collective_path(ib, hosts).kind == "infiniband" and collective_path(ib, hosts).expected_gbps == 25.0


def _gpu(**over: Any) -> dict[str, Any]:
    """MOCK of what NVML reports for an H100 SXM (plus the CUDA compute capability)."""
    gpu = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1", "pci_bus_id": "00000000:19:00.0", "pcie_link_gen": 5,
           "pcie_link_gen_max": 5, "pcie_link_width": 16, "pcie_link_width_max": 16, "nvlink_up": 18,
           "nvlink_total": 18, "compute_capability": [9, 0], "numa_node": 0}
    return {**gpu, **over}


def test_mock_gpus_on_one_host_use_nvlink_or_name_what_holds_pcie_back() -> None:
    hosts = {0: "g", 1: "g"}
    nvl = {0: _eth("g", None, backend="nccl", gpu=_gpu()), 1: _eth("g", None, backend="nccl", gpu=_gpu(uuid="GPU-2"))}
    path = collective_path(nvl, hosts)
    assert path.kind == "nvlink" and path.expected_gbps == pytest.approx(370.8)
    # NVLS exceeds the ring model: shown above 100 %, a pass.
    assert judge(470.0, path, [], Thresholds()).status == "pass"
    # No NVLink, one GPU trained at Gen3 x16 below its Gen5 maximum, its rank on the wrong NUMA node.
    slow = {0: _eth("g", None, backend="nccl", gpu=_gpu(nvlink_up=0, nvlink_total=0)),
            1: _eth("g", None, backend="nccl", gpu=_gpu(uuid="GPU-2", nvlink_up=0, nvlink_total=0, pcie_link_gen=3,
                                                        numa_node=1), cpu_nodes=[0])}
    path = collective_path(slow, hosts)
    # Expected at what GPU and slot support (Gen5 x16: 48 GB/s); the link trained at Gen3 (12 GB/s) is named.
    assert path.kind == "pcie" and path.expected_gbps == 48.0 and path.description == "PCIe, Gen5 x16 on g"
    causes = bottlenecks(path, slow, hosts, [0, 1])
    kinds = [c.cause for c in causes]
    assert kinds[0] == "pcie_downtrained" and "Gen3 x16, built for Gen5 x16" in causes[0].text
    assert causes[0].limit_gbps == 12.0
    assert "numa" in kinds
    # NCCL_P2P_DISABLE: through host memory, and said.
    off = {r: {**f, "env": {"NCCL_P2P_DISABLE": "1"}} for r, f in nvl.items()}
    path = collective_path(off, hosts)
    assert path.kind == "shm"
    assert any(c.cause == "p2p_disabled" for c in bottlenecks(path, off, hosts, [0, 1]))


def test_parse_nccl_info_lines() -> None:
    """MOCK log: lines in the format NCCL prints them (net_ib.cc, net_socket.cc, transport.cc)."""
    log = "\n".join([
        "node1:123:123 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
        "node1:123:123 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:10.0.1.1<0>",
        "node1:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0",
        "node1:123:456 [0] NCCL INFO Channel 01/0 : 0[0] -> 2[2] via P2P/IPC",
    ])
    info = links.parse_nccl_info(log)
    assert info["net"] == "Socket" and info["net_devices"] == ["eth0:10.0.0.1<0>", "eth1:10.0.1.1<0>"]
    assert info["transports"] == ["NET/Socket", "P2P"] and info["plugin_missing"]
    ib = links.parse_nccl_info("x NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>")
    assert ib["net"] == "IB" and ib["net_devices"] == ["mlx5_0:1/IB", "mlx5_1:1/RoCE"]


# -- the readers on this machine's real sysfs and tools ------------------------------------------------


def test_readers_on_this_machines_real_sysfs() -> None:
    lo = links.net_link("lo")
    assert lo["exists"] and lo["speed_mbps"] is None and lo["kind"] == "loopback" and lo["virtual"]
    for name in os.listdir("/sys/class/net"):
        fact = links.net_link(name)
        raw = Path(f"/sys/class/net/{name}/speed")
        try:
            text = raw.read_text().strip()
        except OSError:
            text = ""
        # What sysfs says, as it says it: a positive speed, else unknown (-1 / EINVAL).
        assert fact["speed_mbps"] == (int(text) if text.lstrip("-").isdigit() and int(text) > 0 else None)
    # This VM has no InfiniBand and no PCIe link attributes: the readers say "none", not an error.
    assert links.ib_ports() == [] if not Path("/sys/class/infiniband").exists() else isinstance(links.ib_ports(), list)
    for link in links.pci_links():
        assert link["gen"] in (1, 2, 3, 4, 5, 6, None)
    ifname, how = links.data_interface("gloo", {"GLOO_SOCKET_IFNAME": "lo"})
    assert (ifname, how) == ("lo", "GLOO_SOCKET_IFNAME=lo")


def test_readers_on_a_tree_shaped_like_sysfs(tmp_path: Path) -> None:
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    dev = tmp_path / "bus" / "pci" / "devices" / "0000:19:00.0"
    dev.mkdir(parents=True)
    for name, text in (("current_link_speed", "8.0 GT/s PCIe"), ("max_link_speed", "32.0 GT/s PCIe"),
                       ("current_link_width", "16"), ("max_link_width", "16"), ("numa_node", "1")):
        (dev / name).write_text(text + "\n")
    assert links.ib_ports(tmp_path) == [{"hca": "mlx5_0", "port": 1, "state": "ACTIVE",
                                         "rate_text": "200 Gb/sec (4X HDR)", "rate_gbps": 200.0,
                                         "link_layer": "InfiniBand", "numa_node": None}]
    link = links.pcie_link("00000000:19:00.0", tmp_path)
    assert (link["gen"], link["gen_max"], link["width"], link["width_max"], link["numa_node"]) == (3, 5, 16, 16, 1)


@pytest.mark.requires_netns
def test_qdisc_and_veth_facts_read_from_a_real_namespace() -> None:
    """A real veth in a namespace of ours, shaped with tc: the reader sees 10000 Mb/s, veth, and the tbf rate."""
    ns = f"ddx{os.getpid() % 100000}"
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, timeout=20)  # noqa: E731
    try:
        run("ip", "netns", "add", ns)
        run("ip", "-n", ns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
        run("ip", "-n", ns, "link", "set", "va", "up")
        run("ip", "-n", ns, "link", "set", "vb", "up")
        run("tc", "-n", ns, "qdisc", "add", "dev", "va", "root", "tbf", "rate", "200mbit", "burst", "64kb",
            "latency", "50ms")
        code = ("import json; from ddpdoctor.env.links import net_link; print(json.dumps(net_link('va')))")
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, check=True, cwd=str(Path(__file__).resolve().parents[2]))
        fact = json.loads(out.stdout)
        assert fact["speed_mbps"] == 10000 and fact["kind"] == "veth" and fact["virtual"]
        assert [(q["kind"], q["rate_bytes_per_s"]) for q in fact["qdiscs"]] == [("tbf", 25e6)]
        # A classful htb root: its classes' highest ceil is the limit (tc prints classes only as text).
        run("tc", "-n", ns, "qdisc", "replace", "dev", "va", "root", "handle", "1:", "htb", "default", "10")
        run("tc", "-n", ns, "class", "add", "dev", "va", "parent", "1:", "classid", "1:10", "htb", "rate", "100mbit",
            "ceil", "150mbit")
        again = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60, check=True, cwd=str(Path(__file__).resolve().parents[2]))
        assert [(q["kind"], q["rate_bytes_per_s"]) for q in json.loads(again.stdout)["qdiscs"]] == [("htb", 18.75e6)]
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


# -- options and rendering ---------------------------------------------------------------------------


def test_thresholds_options() -> None:
    assert thresholds_from_options(None, None) == Thresholds(50.0, 80.0)
    assert thresholds_from_options(90, None) == Thresholds(90.0, 90.0)
    with pytest.raises(DoctorError, match="--warn-busbw-pct 40 is below --min-busbw-pct 60"):
        thresholds_from_options(60, 40)
    with pytest.raises(DoctorError, match="--min-busbw-pct takes a percentage"):
        thresholds_from_options(float("nan"), None)


def test_bad_pct_flag_is_one_line_exit_2() -> None:
    proc = run_cli(["bench", "--nproc", "2", "--min-busbw-pct", "-5"], timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "ddpdoctor: error: --min-busbw-pct takes a percentage" in proc.stderr


def test_hosts_are_grouped_as_people_think_of_a_cluster() -> None:
    assert host_groups_text({0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB", 4: "nodeC"}) == \
        "nodeA: ranks 0-1; nodeB: ranks 2-3; nodeC: rank 4"


def test_a_nic_negotiated_below_its_rating_or_its_peers_is_named() -> None:
    # ethtool's own layout (net/ethtool: "Supported link modes:" then one mode per continuation line).
    text = ("Settings for eth0:\n\tSupported ports: [ FIBRE ]\n\tSupported link modes:   25000baseCR/Full\n"
            "\t                        100000baseSR4/Full\n\tSupported pause frame use: Symmetric\n"
            "\tAdvertised link modes:  200000baseCR4/Full\n\tSpeed: 25000Mb/s\n")
    assert links.parse_ethtool_max_mbps(text) == 100000
    assert links.parse_ethtool_max_mbps("Settings for lo:\n\tLink detected: yes\n") is None
    hosts = {0: "a", 1: "b", 2: "c"}
    facts = {0: _eth("a", 100000), 1: _eth("b", 100000), 2: _eth("c", 25000)}
    path = collective_path(facts, hosts)
    assert path.expected_gbps == 3.125
    [cause] = bottlenecks(path, facts, hosts, [0, 1, 2])
    assert cause.cause == "nic_speed" and "eth0 on c runs at 25000 Mb/s, the other hosts' at up to 100000" in cause.text
    rated = {**facts, 2: {**facts[2], "interface": {**facts[2]["interface"], "speed_max_mbps": 100000}}}
    first = bottlenecks(path, rated, hosts, [0, 1, 2])[0]
    assert first.cause == "nic_speed" and "negotiated 25000 Mb/s and supports 100000 Mb/s" in first.text


def test_mock_nvlink_sweep_that_stopped_short_and_other_processes_on_the_gpu_are_named() -> None:
    hosts = {0: "g", 1: "g"}
    facts = {0: _eth("g", None, backend="nccl", gpu=_gpu(other_pids=[777])),
             1: _eth("g", None, backend="nccl", gpu=_gpu(uuid="GPU-2"))}
    path = collective_path(facts, hosts)
    causes = bottlenecks(path, facts, hosts, [0, 1], rows_busbw=[(64 << 20, 150.0), (256 << 20, 152.0)])
    assert {c.cause for c in causes} == {"crowded", "short_sweep"}
    assert any("other processes use GPU 00000000:19:00.0 on g: pid 777" in c.text for c in causes)
    assert any("stopped at 268435456 bytes; NVLink reaches its peak only with 1-8 GB" in c.text for c in causes)
    # A network sweep is short only when busbw was still rising (>10 %) at its largest size.
    net = {0: _eth("a", 25000), 1: _eth("b", 25000)}
    net_hosts = {0: "a", 1: "b"}
    rising = bottlenecks(collective_path(net, net_hosts), net, net_hosts, [0, 1],
                         rows_busbw=[(1 << 20, 1.0), (4 << 20, 1.5)])
    assert [c.cause for c in rising] == ["short_sweep"]
    flat = bottlenecks(collective_path(net, net_hosts), net, net_hosts, [0, 1],
                       rows_busbw=[(1 << 20, 1.45), (4 << 20, 1.5)])
    assert flat == []
