"""What a measured bandwidth should be: the path it takes, the figure that path gives, and what holds it back.

Pure functions of the facts each rank gathered (:func:`ddpdoctor.env.links.rank_link_facts`); no torch, no
I/O. Every constant carries its source next to it. The figures are NCCL's own topology model, the one NCCL
uses to plan its rings and trees, so "expected" means what NCCL itself assumes the path carries:

- a network device: ``speed / 8000`` GB/s for ``speed`` in Mb/s (NCCL v2.30.7-1 src/graph/topo.cc:417-418,
  which also assumes 10000 Mb/s where the NIC reports none, "Some NICs define speed = -1"); the default
  ``NET_BW 12.0 // 100Gbit`` (src/graph/topo.h:35). 100/200/400 Gb/s -> 12.5/25/50 GB/s.
- PCIe: ``width * speed / 80`` GB/s with ``speed`` per lane in 100 Mb/s: 15, 30, 60, 120, 240, 480 for Gen1-6
  (src/graph/topo.cc:545-556 ``kvDictPciGen``, :656-657), so Gen3/4/5 x16 = 12/24/48 GB/s (``PCI_BW 12.0 //
  PCI Gen3 x16``, topo.h:25).
- NVLink: per link and direction, by compute capability: 18 (sm60), 20 (sm70, sm80), 12 (sm86), 20.6
  (sm90), 40.1 (sm100) GB/s (src/graph/topo.h:19-24, ``ncclTopoNVLinkBw`` topo.h:274-281), times the links
  (topo.cc:830-840). An H100's 18 links: 370.8 GB/s, the ~370 GB/s ring all_reduce busbw of 8 H100/H200; NVLS
  (NVLink SHARP) reaches 460-480 GB/s, beyond the ring model, and is reported above 100 %.
- busbw is nccl-tests' (doc/PERFORMANCE.md): for a ring it is the slowest link's bandwidth, whatever the
  number of ranks, so a collective's expectation is its slowest path's.

Where no model applies the expectation is None and the reason says why (gloo between processes of one
host goes through the kernel's loopback TCP: memory copies on the CPUs, no link with a rated speed; an
interface that reports no speed). A virtual interface's speed (a veth's 10000 Mb/s is a constant in
drivers/net/veth.c, not a trained rate) gives a *nominal* figure: the percentage is shown, but it is
judged only when a fact (a shaping qdisc) says what limits the link.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.ranks import format_rank_list

NCCL_TAG = "NCCL v2.30.7-1"
SRC_NET = f"{NCCL_TAG} src/graph/topo.cc:417-418 (net bw = speed Mb/s / 8000)"
SRC_PCI = f"{NCCL_TAG} src/graph/topo.cc:545-556,656-657 (PCIe bw = width x per-lane rate / 80)"
SRC_NVLINK = f"{NCCL_TAG} src/graph/topo.h:19-24,274-281 and topo.cc:830-840 (per-link NVLink bw x links)"
SRC_BUSBW = "nccl-tests doc/PERFORMANCE.md (busbw: the slowest link's bandwidth for ring algorithms)"

# Per-lane PCIe rate in units of 100 Mb/s, by generation (topo.cc kvDictPciGen).
PCIE_LANE_100MBPS: dict[int, int] = {1: 15, 2: 30, 3: 60, 4: 120, 5: 240, 6: 480}
# NVLink GB/s per link, as ncclTopoNVLinkBw picks it (topo.h:274-281): sm100+, sm90+, sm86, sm80+, sm70+, sm60+.
def nvlink_link_gbps(cc: int) -> float:
    """NCCL's per-link NVLink figure for compute capability ``cc`` (90 for 9.0)."""
    return (40.1 if cc >= 100 else 20.6 if cc >= 90 else 12.0 if cc == 86 else 20.0 if cc >= 70
            else 18.0 if cc >= 60 else 20.0)


def nic_gbps(speed_mbps: float) -> float:
    """NCCL's model of a NIC: speed / 8000 GB/s."""
    return speed_mbps / 8000.0


def pcie_gbps(gen: int, width: int) -> float | None:
    """NCCL's model of a PCIe link: width x per-lane rate / 80 GB/s (Gen4 x16 = 24)."""
    lane = PCIE_LANE_100MBPS.get(gen)
    return width * lane / 80.0 if lane and width else None


def nvlink_gbps(compute_capability: Sequence[int] | None, links: int) -> float:
    """NCCL's model of NVLink: the per-link figure of the GPU's architecture times its links up."""
    cc = 10 * int(compute_capability[0]) + int(compute_capability[1]) if compute_capability and \
        len(compute_capability) >= 2 else 80
    return nvlink_link_gbps(cc) * links


# NVLink busbw peaks only with messages of 1-8 GB (issue 34's published figures; nccl-tests' H100/H200 runs).
NVLINK_PEAK_BYTES = 1 << 30


# -- thresholds ---------------------------------------------------------------------------------------

# Below this percentage of the expectation a figure FAILs, below WARN_PCT it WARNs (both adjustable:
# --min-busbw-pct, --warn-busbw-pct). Fleets judge the same way: Azure's node health checks fail below an
# expected busbw and warn near it; Meta's GCM check-nccl has critical and warning levels.
FAIL_PCT = 50.0
WARN_PCT = 80.0


@dataclass(frozen=True)
class Thresholds:
    fail_pct: float = FAIL_PCT
    warn_pct: float = WARN_PCT

    def to_json(self) -> dict[str, float]:
        return {"fail_pct": self.fail_pct, "warn_pct": self.warn_pct}


# -- paths ---------------------------------------------------------------------------------------------


@dataclass
class LinkPath:
    """The path a transfer takes and the busbw it should give (None: no model applies, ``why`` says why)."""

    kind: str  # nvlink, pcie, shm, infiniband, roce, ethernet, same_gpu, loopback, unknown
    description: str
    expected_gbps: float | None = None
    source: str = ""
    why: str = ""  # why there is no expectation (expected_gbps None)
    nominal: bool = False  # a virtual device's constant, not a trained rate
    hosts: tuple[str, ...] = ()
    interfaces: tuple[tuple[str, str], ...] = ()  # (host, interface) the path leaves through

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "description": self.description, "expected_busbw_gbps": self.expected_gbps,
                "source": self.source, "no_model": self.why or None, "nominal": self.nominal,
                "interfaces": [{"host": h, "interface": i} for h, i in self.interfaces]}


def _rank_net_path(f: Mapping[str, Any], host: str) -> LinkPath:
    """The network path one rank's inter-host traffic takes (IB/RoCE for NCCL when usable, else its socket NIC)."""
    env = f.get("env") or {}
    nccl = f.get("nccl") or {}
    backend = f.get("backend", "gloo")
    if backend == "nccl" and not _ib_off(env, nccl):
        active = [p for p in f.get("ib_ports") or [] if p.get("state") == "ACTIVE" and p.get("rate_gbps")]
        if active:
            best = max(active, key=lambda p: float(p["rate_gbps"]))
            roce = str(best.get("link_layer") or "").lower() == "ethernet"
            return LinkPath("roce" if roce else "infiniband",
                            f"{'RoCE' if roce else 'InfiniBand'} {best['hca']}:{best['port']} at "
                            f"{best['rate_text'] or str(best['rate_gbps']) + ' Gb/sec'} on {host}",
                            nic_gbps(float(best["rate_gbps"]) * 1000), SRC_NET, hosts=(host,),
                            interfaces=((host, f"{best['hca']}:{best['port']}"),))
    iface = f.get("interface")
    if not iface or not iface.get("name"):
        return LinkPath("unknown", f"no interface found on {host} ({f.get('interface_from', '')})",
                        why=f"which interface carries the traffic on {host} is unknown", hosts=(host,))
    name = iface["name"]
    if iface.get("kind") == "loopback" or name == "lo":
        return LinkPath("loopback", f"loopback on {host}", why="loopback has no rated speed", hosts=(host,))
    kind = iface.get("kind")
    label = f"{name} ({kind})" if kind else name
    speed = iface.get("speed_mbps")
    if not speed:
        return LinkPath("ethernet", f"{'socket over ' if backend == 'nccl' else ''}Ethernet {label} on {host}",
                        why=f"{name} on {host} reports no speed (/sys/class/net/{name}/speed is -1 or unreadable, as "
                            "on virtio and most cloud NICs); NCCL itself then assumes 10000 Mb/s "
                            f"({NCCL_TAG} src/graph/topo.cc:417), which is no measurement",
                        hosts=(host,), interfaces=((host, name),))
    virtual = bool(iface.get("virtual"))
    # The kind stays out of the description so that hosts on the same kind of link group together; a
    # virtual device's speed is its driver's constant (a veth's 10000), shown as nominal.
    return LinkPath("ethernet", f"{'socket over ' if backend == 'nccl' else ''}Ethernet {name} at {speed} Mb/s"
                    f"{' (virtual: nominal)' if virtual else ''} on {host}", nic_gbps(float(speed)), SRC_NET,
                    nominal=virtual, hosts=(host,), interfaces=((host, f"{name} ({kind})" if kind else name),))


def _ib_off(env: Mapping[str, str], nccl: Mapping[str, Any]) -> bool:
    return (str(env.get("NCCL_IB_DISABLE", "0")).strip() not in ("", "0")
            or str(env.get("NCCL_NET", "")).strip().lower() == "socket"
            or nccl.get("net") == "Socket")


def _gpu_path(a: Mapping[str, Any], b: Mapping[str, Any], host: str) -> LinkPath:
    """Two GPU ranks of one host under NCCL: NVLink when both have links up and P2P is allowed, else PCIe."""
    ga, gb = a.get("gpu") or {}, b.get("gpu") or {}
    if ga.get("uuid") and ga.get("uuid") == gb.get("uuid"):
        return LinkPath("same_gpu", f"one GPU shared by two ranks on {host}",
                        why="two ranks on one GPU copy within its memory (NCCL refuses it: 'Duplicate GPU "
                            "detected'); no link to model", hosts=(host,))
    p2p_off = any(str((x.get("env") or {}).get("NCCL_P2P_DISABLE", "0")).strip() not in ("", "0") for x in (a, b))
    links = min(int(ga.get("nvlink_up") or 0), int(gb.get("nvlink_up") or 0))
    if links and not p2p_off:
        cc = ga.get("compute_capability") or gb.get("compute_capability")
        return LinkPath("nvlink", f"NVLink, {links} links up per GPU ({ga.get('name') or 'GPU'}) on {host}",
                        nvlink_gbps(cc, links), SRC_NVLINK, hosts=(host,))
    # The generation and width GPU and slot support (NVML's max), not the current ones: an idle GPU lowers its
    # link generation to save power, and a link trained below its maximum is a bottleneck to name, not the
    # expectation.
    def built(g: Mapping[str, Any]) -> tuple[int, int]:
        return (int(g.get("pcie_link_gen_max") or g.get("pcie_link_gen") or 0),
                int(g.get("pcie_link_width_max") or g.get("pcie_link_width") or 0))

    bws = [(pcie_gbps(*built(g)), built(g)) for g in (ga, gb)]
    known = [(bw, gw) for bw, gw in bws if bw]
    if not known:
        return LinkPath("pcie", f"PCIe on {host}", why="NVML reports no PCIe generation/width for these GPUs",
                        hosts=(host,))
    bw, (gen, width) = min(known, key=lambda x: x[0] or 0.0)
    via = "SHM through host memory (P2P disabled)" if p2p_off else "PCIe"
    return LinkPath("shm" if p2p_off else "pcie", f"{via}, Gen{gen} x{width} on {host}", bw, SRC_PCI, hosts=(host,))


def pair_path(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, host_a: str, host_b: str) -> LinkPath:
    """The path between two ranks and what it should carry."""
    if not a or not b:
        return LinkPath("unknown", "facts missing", why="a rank did not report its link facts")
    if host_a == host_b:
        if a.get("backend") == "nccl" and a.get("gpu") and b.get("gpu"):
            return _gpu_path(a, b, host_a)
        return LinkPath("loopback", f"processes on one host ({host_a}), {a.get('backend', 'gloo')} over loopback TCP",
                        why="gloo between processes on one host goes through the kernel's loopback TCP: memory "
                            "copies on the CPUs, no link with a rated speed to compare with", hosts=(host_a,))
    pa, pb = _rank_net_path(a, host_a), _rank_net_path(b, host_b)
    return slowest([pa, pb])


def slowest(paths: Sequence[LinkPath]) -> LinkPath:
    """The path that bounds a ring through all of ``paths``: the lowest expectation; no model if any lacks one."""
    missing = [p for p in paths if p.expected_gbps is None]
    hosts = tuple(dict.fromkeys(h for p in paths for h in p.hosts))
    interfaces = tuple(dict.fromkeys(i for p in paths for i in p.interfaces))
    if missing:
        first = missing[0]
        return LinkPath(first.kind, first.description, None, why=first.why, hosts=hosts, interfaces=interfaces)
    low = min(paths, key=lambda p: p.expected_gbps or 0.0)
    # Every path at the lowest figure, each description once with its hosts: "Ethernet dd0 (veth) at 10000
    # Mb/s on nodeB, nodeC; Ethernet dd0 (bridge) at 10000 Mb/s on nodeA".
    groups: dict[str, list[str]] = {}
    for p in paths:
        if p.expected_gbps == low.expected_gbps:
            what, _, where = p.description.rpartition(" on ")
            groups.setdefault(what or p.description, []).extend([where] if what else [])
    description = "; ".join(f"{what} on {', '.join(dict.fromkeys(where))}" if where else what
                            for what, where in groups.items())
    return LinkPath(low.kind, description, low.expected_gbps, low.source, nominal=any(p.nominal for p in paths),
                    hosts=hosts, interfaces=interfaces)


def collective_path(facts: Mapping[int, Mapping[str, Any]], hosts: Mapping[int, str]) -> LinkPath:
    """What bounds a collective over every rank: one host -> its slowest rank-to-rank path; several hosts ->
    the slowest host's network path (a ring crosses each host's network once each way; nccl-tests busbw)."""
    by_host: dict[str, list[int]] = {}
    for rank in sorted(hosts):
        by_host.setdefault(hosts[rank], []).append(rank)
    if len(by_host) == 1:
        ranks = sorted(hosts)
        if len(ranks) < 2:
            return LinkPath("none", "one rank", why="nothing crosses a link with one rank")
        # Neighbours in rank order: the ring NCCL builds on one host follows its own order, but every GPU
        # pair of an NVSwitch or a PCIe switch host has the same path, so adjacent pairs stand for all.
        return slowest([pair_path(facts.get(r), facts.get(s), hosts[r], hosts[s])
                        for r, s in zip(ranks, ranks[1:] + ranks[:1], strict=True) if r != s])
    per_host = [slowest([_rank_net_path(facts[r], h) if r in facts else
                         LinkPath("unknown", "facts missing", why=f"rank {r} did not report its link facts")
                         for r in ranks]) for h, ranks in by_host.items()]
    return slowest(per_host)


# -- what holds a figure back -------------------------------------------------------------------------


@dataclass
class Evidence:
    """One cause, with the fact that shows it. ``limit_gbps``: the rate it caps the path at, where known."""

    cause: str
    text: str
    limit_gbps: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "evidence": self.text, "limit_gbps": self.limit_gbps}


def fmt_gbps(gbps: float) -> str:
    """Two decimals from 1 GB/s, else three significant digits (a 200 Mbit/s link is 0.025 GB/s, not 0.03)."""
    return f"{gbps:.2f}" if gbps >= 1 else f"{gbps:.3g}"


def fmt_pct(pct: float | None) -> str:
    """'2.4' below 10 %, else whole percents ('87')."""
    if pct is None:
        return "-"
    return f"{pct:.1f}" if pct < 10 else f"{pct:.0f}"


def _rate_text(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("Kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits:g} bit/s"


def bottlenecks(path: LinkPath, facts: Mapping[int, Mapping[str, Any]], hosts: Mapping[int, str],
                ranks: Iterable[int], *, rows_busbw: Sequence[tuple[int, float]] = (),
                crowded: Sequence[Mapping[str, Any]] = ()) -> list[Evidence]:
    """The causes the facts show for the ranks on ``path`` (a pair's two, or every rank), strongest first.

    ``rows_busbw``: (size, busbw) of the sweep, to tell a sweep that stopped while busbw was still rising;
    ``crowded``: hosts whose cores or GPUs are shared (:func:`crowding`).
    """
    ranks = sorted(ranks)
    found: list[Evidence] = []
    network = path.kind in ("ethernet", "infiniband", "roce", "unknown") and len({hosts.get(r) for r in ranks}) > 1
    seen: set[tuple[str, str]] = set()
    for r in ranks:
        f = facts.get(r) or {}
        host = hosts.get(r, f"rank{r}")
        iface = f.get("interface") or {}
        env = f.get("env") or {}
        if network and iface.get("name") and (host, iface["name"]) not in seen:
            seen.add((host, iface["name"]))
            for q in iface.get("qdiscs") or []:
                if q.get("rate_bytes_per_s"):
                    rate = float(q["rate_bytes_per_s"])
                    article = "an" if q["kind"] in ("htb", "hfsc", "fq", "fq_codel") else "a"
                    where = "class" if q["kind"] in ("htb", "hfsc") else "qdisc"
                    found.append(Evidence("qdisc", f"{article} {q['kind']} qdisc on {iface['name']} of {host} shapes "
                                          f"the link to {_rate_text(rate)} ({fmt_gbps(rate / 1e9)} GB/s) "
                                          f"(tc {where} show dev {iface['name']})", rate / 1e9))
            speed, top = iface.get("speed_mbps"), iface.get("speed_max_mbps")
            if speed and top and speed < top:
                found.append(Evidence("nic_speed", f"{iface['name']} on {host} negotiated {speed} Mb/s and supports "
                                      f"{top} Mb/s (ethtool {iface['name']}: Supported link modes)",
                                      nic_gbps(float(speed))))
            elif speed and not iface.get("virtual"):
                peers = [int((facts.get(o) or {}).get("interface", {}).get("speed_mbps") or 0) for o in facts
                         if hosts.get(o) != host and not ((facts.get(o) or {}).get("interface") or {}).get("virtual")]
                if peers and speed < max(peers):
                    found.append(Evidence("nic_speed", f"{iface['name']} on {host} runs at {speed} Mb/s, the other "
                                          f"hosts' at up to {max(peers)} Mb/s (/sys/class/net/*/speed): a NIC "
                                          "negotiated below its rated speed, or a slower NIC", nic_gbps(float(speed))))
            if iface.get("operstate") not in (None, "up", "unknown"):
                found.append(Evidence("link_down", f"{iface['name']} on {host} is {iface['operstate']} "
                                      f"(/sys/class/net/{iface['name']}/operstate)"))
        if network:
            for p in f.get("ib_ports") or []:
                if p.get("state") and p["state"] != "ACTIVE" and path.kind in ("infiniband", "roce"):
                    found.append(Evidence("ib_port", f"{p['hca']} port {p['port']} on {host} is {p['state']}, not "
                                          "ACTIVE (/sys/class/infiniband/.../state)"))
            active_ib = [p for p in f.get("ib_ports") or [] if p.get("state") == "ACTIVE"]
            if active_ib and path.kind == "ethernet" and (host, "sockets") not in seen:
                seen.add((host, "sockets"))
                names = ", ".join(f"{p['hca']}:{p['port']}" for p in active_ib)
                if f.get("backend") == "gloo":
                    why = "gloo has only TCP sockets (use the nccl backend on GPUs to reach InfiniBand/RoCE)"
                elif str(env.get("NCCL_IB_DISABLE", "0")).strip() not in ("", "0"):
                    why = f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']} is set"
                elif str(env.get("NCCL_NET", "")).lower() == "socket":
                    why = f"NCCL_NET={env['NCCL_NET']} is set"
                elif (f.get("nccl") or {}).get("plugin_missing"):
                    why = "NCCL found no network plugin (NET/Plugin in the NCCL_DEBUG=INFO log)"
                else:
                    why = "NCCL chose NET/Socket (check NCCL_DEBUG=INFO for why IB was not initialised)"
                found.append(Evidence("sockets", f"TCP sockets on {host} although {names} "
                                      f"{'is' if len(active_ib) == 1 else 'are'} ACTIVE: {why}"))
        gpu = f.get("gpu") or {}
        if gpu and path.kind in ("pcie", "shm", "nvlink"):
            gen, gen_max = gpu.get("pcie_link_gen"), gpu.get("pcie_link_gen_max")
            width, width_max = gpu.get("pcie_link_width"), gpu.get("pcie_link_width_max")
            if (gen and gen_max and gen < gen_max) or (width and width_max and width < width_max):
                found.append(Evidence("pcie_downtrained", f"GPU {gpu.get('pci_bus_id')} on {host} trained at PCIe "
                                      f"Gen{gen} x{width}, built for Gen{gen_max} x{width_max} (NVML; an idle GPU "
                                      "may drop its link generation to save power)",
                                      pcie_gbps(int(gen or 0), int(width or 0))))
            if str(env.get("NCCL_P2P_DISABLE", "0")).strip() not in ("", "0"):
                found.append(Evidence("p2p_disabled", f"NCCL_P2P_DISABLE={env['NCCL_P2P_DISABLE']} on {host}: "
                                      "GPU-to-GPU traffic goes through host memory"))
            elif gpu.get("nvlink_total") and not gpu.get("nvlink_up"):
                found.append(Evidence("p2p_disabled", f"GPU {gpu.get('pci_bus_id')} on {host} has "
                                      f"{gpu['nvlink_total']} NVLinks and none up (NVML)"))
            if gpu.get("other_pids"):
                found.append(Evidence("crowded", f"other processes use GPU {gpu.get('pci_bus_id')} on {host}: pid "
                                      f"{', '.join(str(p) for p in gpu['other_pids'])} (NVML)"))
            node = gpu.get("numa_node")
            cpu_nodes = f.get("cpu_numa_nodes") or []
            if node is not None and cpu_nodes and node not in cpu_nodes:
                found.append(Evidence("numa", f"rank {r} on {host} runs on NUMA node(s) "
                                      f"{format_rank_list(cpu_nodes)} and its GPU is on node {node} (sysfs numa_node): "
                                      "bind it with numactl --cpunodebind / srun --cpu-bind"))
    for entry in crowded:
        on = sorted(set(entry.get("ranks") or []) & set(ranks))
        if not on:
            continue
        others = int(entry.get("others") or 0)
        if entry.get("cores") and len(entry["ranks"]) + others > int(entry["cores"]):
            n = len(entry["ranks"])
            found.append(Evidence("crowded", f"{n} rank{'s' if n != 1 else ''}"
                                  + (f" and {others} runnable thread{'s' if others != 1 else ''} of other processes"
                                     if others else "")
                                  + f" share {entry['cores']} CPU core{'s' if entry['cores'] != 1 else ''} on "
                                  f"{entry['host']}"))
        for device, users in (entry.get("shared_gpus") or {}).items():
            found.append(Evidence("crowded", f"ranks {format_rank_list(users)} share {device} on {entry['host']}"))
    largest = max((size for size, _ in rows_busbw), default=0)
    if path.kind == "nvlink" and largest and largest < NVLINK_PEAK_BYTES:
        found.append(Evidence("short_sweep", f"the sweep stopped at {largest} bytes; NVLink reaches its peak only "
                              "with 1-8 GB messages: give -e 8G (or at least 1G)"))
    elif len(rows_busbw) >= 2:
        ordered = sorted(rows_busbw)
        (_, before), (size, last) = ordered[-2], ordered[-1]
        if before > 0 and last > 1.1 * before:
            found.append(Evidence("short_sweep", f"busbw was still rising at the largest size ({fmt_gbps(before)} -> "
                                  f"{fmt_gbps(last)} GB/s at {size} bytes): the sweep stopped before the peak; give a "
                                  "larger -e (NVLink peaks at 1-8 GB messages)"))
    # The cause that caps the path lowest comes first; then the others in the order found.
    found.sort(key=lambda e: (e.limit_gbps is None, e.limit_gbps or 0.0))
    return found


# -- the verdict -----------------------------------------------------------------------------------


@dataclass
class Verdict:
    """A measured figure against its path's expectation."""

    measured_gbps: float
    path: LinkPath
    status: str  # pass, warn, fail, none (no model), note (nominal figure, nothing shown to limit it)
    pct: float | None = None
    evidence: list[Evidence] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"measured_busbw_gbps": self.measured_gbps, "expected_busbw_gbps": self.path.expected_gbps,
                "pct": None if self.pct is None else round(self.pct, 1), "status": self.status,
                "path": self.path.to_json(), "bottlenecks": [e.to_json() for e in self.causes()],
                "other_facts": [e.to_json() for e in self.evidence[len(self.causes()):]]}

    def line(self) -> str:
        """'0.02 of 1.25 GB/s expected (2 %) on Ethernet dd0 ...: FAIL', or 'no model applies: ...'."""
        if self.path.expected_gbps is None:
            return f"{fmt_gbps(self.measured_gbps)} GB/s; no expected figure: no model applies ({self.path.why})"
        return (f"{fmt_gbps(self.measured_gbps)} of {fmt_gbps(self.path.expected_gbps)} GB/s expected "
                f"({fmt_pct(self.pct)} %) on {self.path.description}")

    @property
    def explained(self) -> bool:
        """The strongest cause caps the path at a rate the measurement reaches (>= 70 % of it): it is the
        bottleneck, and the other facts are not shown as causes."""
        first = self.evidence[0] if self.evidence else None
        return bool(first and first.limit_gbps and self.measured_gbps >= 0.7 * first.limit_gbps)

    def causes(self) -> list[Evidence]:
        """The causes to name: the one that explains the figure alone, else all found."""
        return self.evidence[:1] if self.explained else list(self.evidence)

    def cause(self) -> str:
        """The bottleneck, with its evidence, for a figure below its expectation ('' when none is shown)."""
        if not self.evidence:
            return ""
        first = self.evidence[0]
        text = first.text
        if first.limit_gbps:
            text += f"; measured {fmt_pct(self.measured_gbps / first.limit_gbps * 100)} % of that"
        more = [e.text for e in self.causes()[1:]]
        return text + ("; also: " + "; ".join(more) if more else "")


def judge(measured_gbps: float, path: LinkPath, evidence: Sequence[Evidence], thresholds: Thresholds) -> Verdict:
    """pass / warn / fail against the thresholds; ``none`` without a model; a nominal figure (a virtual NIC's
    constant) is judged only when a fact shows what limits it (a shaping qdisc), else ``note``."""
    if path.expected_gbps is None or path.expected_gbps <= 0:
        return Verdict(measured_gbps, path, "none")
    pct = measured_gbps / path.expected_gbps * 100
    status = "pass" if pct >= thresholds.warn_pct else "warn" if pct >= thresholds.fail_pct else "fail"
    shown = list(evidence) if status != "pass" else []
    if status != "pass" and path.nominal and not any(e.cause == "qdisc" for e in evidence):
        status = "note"
    return Verdict(measured_gbps, path, status, pct, shown)


def peak_busbw(rows: Sequence[Any]) -> tuple[float, list[tuple[int, float]]]:
    """The best busbw of a sweep (any layout) and each size's best: what is compared with the expectation.

    The peak, not the average: small sizes measure latency, and nccl-tests users read the largest sizes.
    """
    by_size: dict[int, float] = {}
    for r in rows:
        bws = [t.busbw_gbps for t in r.timings()] or [r.busbw_gbps]
        by_size[r.bytes] = max(by_size.get(r.bytes, 0.0), *bws)
    return (max(by_size.values()) if by_size else 0.0), sorted(by_size.items())


def host_groups(hosts: Mapping[int, str]) -> dict[str, list[int]]:
    """Host -> its ranks, hosts in order of their lowest rank (the spelling check, stacks and fr use:
    :func:`ddpdoctor.runtime.hosts.ranks_by_host`)."""
    from ddpdoctor.runtime.hosts import ranks_by_host

    return ranks_by_host(hosts.items())


def host_groups_text(hosts: Mapping[int, str]) -> str:
    """'nodeA: rank 0; nodeB: ranks 1-2' (issue 32's "the host in every answer"; long lists shortened)."""
    from ddpdoctor.runtime.hosts import hosts_text

    return hosts_text(host_groups(hosts))


# -- crowding (shared with the bandwidth check) --------------------------------------------------------


def crowding(placements: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Hosts where ranks outnumber the cores they may run on, or share a GPU: one entry per such host.

    The cores counted are the union of the ranks' affinity masks (``taskset``, cgroup cpusets, ``srun
    --cpu-bind``), not the machine's: sixteen ranks allowed on two cores take turns however many the
    machine has.
    """
    by_host: dict[str, list[int]] = {}
    for rank in sorted(placements):
        by_host.setdefault(str(placements[rank]["host"]), []).append(rank)
    found = []
    for host, ranks in sorted(by_host.items()):
        cpus = sorted({int(c) for r in ranks for c in placements[r].get("cpus", [])})
        devices: dict[str, list[int]] = {}
        for r in ranks:
            device = str(placements[r].get("device", "cpu"))
            if device.startswith("cuda"):
                devices.setdefault(device, []).append(r)
        shared = {d: rs for d, rs in devices.items() if len(rs) > 1}
        # Every rank of a host sees the same other processes; the busiest look counts.
        others = round(max(float(placements[r].get("others") or 0.0) for r in ranks))
        if (cpus and len(ranks) + others > len(cpus)) or shared:
            found.append({"host": host, "ranks": ranks, "cores": len(cpus), "affinity": format_rank_list(cpus),
                          "shared_gpus": shared, "others": others})
    return found


# -- a whole run ------------------------------------------------------------------------------------


@dataclass
class Assessment:
    """Every measured figure of a run against its expectation: per op (the collective) and per rank pair."""

    hosts: dict[int, str]
    thresholds: Thresholds
    per_op: dict[str, Verdict] = field(default_factory=dict)
    pairs: dict[tuple[int, int], Verdict] = field(default_factory=dict)
    # What NCCL said it chose on each rank (NCCL_DEBUG=INFO, when bench could listen): net, transports.
    nccl: dict[int, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"thresholds": self.thresholds.to_json(),
                "per_op": {op: v.to_json() for op, v in self.per_op.items()},
                "pairs": [{"a": a, "b": b, **v.to_json()} for (a, b), v in sorted(self.pairs.items())],
                "nccl": {str(r): info for r, info in sorted(self.nccl.items())}}

    def failures(self) -> list[str]:
        """One line per figure below the FAIL threshold: what, how far below, on which path, and why."""
        out = []
        for op, v in self.per_op.items():
            if v.status == "fail":
                out.append(f"{op}: {failure_text(v, self.thresholds)}")
        for (a, b), v in sorted(self.pairs.items()):
            if v.status == "fail":
                out.append(f"rank {a} <-> rank {b}: {failure_text(v, self.thresholds)}")
        return out


def failure_text(v: Verdict, thresholds: Thresholds) -> str:
    """'peak busbw 0.02 of 1.25 GB/s expected (2 %, below --min-busbw-pct 50) on ...; bottleneck: ...'."""
    cause = v.cause()
    return (f"busbw {fmt_gbps(v.measured_gbps)} GB/s is {fmt_pct(v.pct)} % of the {fmt_gbps(v.path.expected_gbps or 0)} GB/s "
            f"expected on {v.path.description} (below --min-busbw-pct {thresholds.fail_pct:g})"
            + (f"; bottleneck: {cause}" if cause else "; no bottleneck found in the facts"))


def assess(rows_by_op: Mapping[str, Sequence[Any]], pairs: Sequence[Any], facts: Mapping[int, Mapping[str, Any]],
           hosts: Mapping[int, str], thresholds: Thresholds,
           crowded: Sequence[Mapping[str, Any]] = ()) -> Assessment:
    """Each op's peak busbw against the collective's path; each pair's busbw against its own path."""
    result = Assessment(dict(hosts), thresholds,
                        nccl={r: dict(f["nccl"]) for r, f in facts.items() if isinstance(f.get("nccl"), Mapping)})
    whole = collective_path(facts, hosts)
    for op, rows in rows_by_op.items():
        if not rows:
            continue
        peak, by_size = peak_busbw(rows)
        evidence = bottlenecks(whole, facts, hosts, hosts.keys(), rows_busbw=by_size, crowded=crowded)
        result.per_op[op] = judge(peak, whole, evidence, thresholds)
    for p in pairs:
        path = pair_path(facts.get(p.a), facts.get(p.b), p.host_a, p.host_b)
        evidence = bottlenecks(path, facts, hosts, (p.a, p.b), crowded=crowded)
        result.pairs[(p.a, p.b)] = judge(p.busbw_gbps, path, evidence, thresholds)
    return result


def thresholds_from_options(fail_pct: float | None, warn_pct: float | None) -> Thresholds:
    """``--min-busbw-pct`` / ``--warn-busbw-pct`` -> Thresholds; DoctorError (exit 2, one line) when malformed.

    A WARN threshold below the FAIL one would never warn, so it is raised to it when only the FAIL one is given.
    """
    import math

    from ddpdoctor.errors import DoctorError

    for flag, value in (("--min-busbw-pct", fail_pct), ("--warn-busbw-pct", warn_pct)):
        if value is not None and not (math.isfinite(value) and 0 <= value <= 1000):
            raise DoctorError(f"{flag} takes a percentage of the expected busbw, 0-1000, got: {value:g}")
    fail = FAIL_PCT if fail_pct is None else fail_pct
    warn = max(WARN_PCT, fail) if warn_pct is None else warn_pct
    if warn < fail:
        raise DoctorError(f"--warn-busbw-pct {warn:g} is below --min-busbw-pct {fail:g}: a figure between them "
                          "would fail without a warning first; give a --warn-busbw-pct >= --min-busbw-pct")
    return Thresholds(fail, warn)


# What to do about each cause (the first, strongest cause's remedy leads).
REMEDIES: dict[str, str] = {
    "qdisc": "remove or raise the shaping qdisc (tc qdisc show dev IF; tc qdisc del dev IF root) or ask who set it",
    "link_down": "bring the interface up and check its cable and switch port (ip link; ethtool IF)",
    "nic_speed": "check the NIC's cable, transceiver and switch port and its negotiated speed (ethtool IF); "
                 "renegotiate (ethtool -s IF autoneg on) or replace the cable",
    "ib_port": "bring the InfiniBand/RoCE port to ACTIVE (ibstat: cable, switch port, subnet manager)",
    "sockets": "let NCCL use InfiniBand/RoCE: unset NCCL_IB_DISABLE and NCCL_NET=Socket, install the network plugin "
               "the fabric needs, and read NCCL_DEBUG=INFO's NET/ lines",
    "pcie_downtrained": "check the GPU's PCIe link under load (nvidia-smi -q -d PCIE): reseat the card or riser, "
                        "check the BIOS PCIe generation setting",
    "p2p_disabled": "unset NCCL_P2P_DISABLE and check the NVLinks (nvidia-smi nvlink -s, nvidia-smi topo -m)",
    "numa": "bind each rank to its GPU's NUMA node (numactl --cpunodebind, srun --cpu-bind, torchrun "
            "--numa-binding)",
    "crowded": "give each rank its own cores and GPU (fewer ranks, taskset/numactl/srun --cpu-bind) and rerun when "
               "nothing else runs there",
    "short_sweep": "measure up to the peak size: ddpdoctor bench -e 1G (or more on NVLink)",
    "clocks": "find what caps the clocks (nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE): power limit, cooling, "
              "application clocks left set (nvidia-smi -rac)",
}
NO_CAUSE_REMEDY = ("find the slow part with `ddpdoctor bench --pairs`; with NCCL, run with NCCL_DEBUG=INFO and check "
                   "that NET/IB (not NET/Socket) and P2P/NVLink are used")


def remedy(evidence: Sequence[Evidence]) -> str:
    """The remedy of the strongest cause, then the others' (each once)."""
    causes = list(dict.fromkeys(e.cause for e in evidence))
    return "; ".join(REMEDIES[c] for c in causes if c in REMEDIES) or NO_CAUSE_REMEDY


# -- one GPU's own figures -------------------------------------------------------------------------------

# Device memory bandwidth by GPU name (NVML's), GB/s, from NVIDIA's datasheets. Matched in order, whole words
# (GH200 is not an H200). A name not listed has no expectation ("no model").
MEMORY_SPECS: tuple[tuple[str, float, str], ...] = (
    (r"\bH200\b", 4800.0, "NVIDIA H200 Tensor Core GPU datasheet: 4.8 TB/s (H200 SXM and NVL)"),
    (r"\bH100 NVL\b", 3900.0, "NVIDIA H100 Tensor Core GPU datasheet: H100 NVL 3.9 TB/s"),
    (r"\bH100 PCIe\b", 2000.0, "NVIDIA H100 Tensor Core GPU datasheet: H100 PCIe 2 TB/s"),
    (r"\bH100\b.*\bHBM3\b|\bH100 SXM", 3350.0, "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM 3.35 TB/s"),
    (r"\bA100\b.*80GB.*PCIe|\bA100-PCIE-80GB\b", 1935.0, "NVIDIA A100 datasheet: A100 80GB PCIe 1,935 GB/s"),
    (r"\bA100\b.*80GB|\bA100-SXM4-80GB\b", 2039.0, "NVIDIA A100 datasheet: A100 80GB SXM 2,039 GB/s"),
    (r"\bA100\b", 1555.0, "NVIDIA A100 datasheet: A100 40GB 1,555 GB/s"),
    (r"\bL40S\b", 864.0, "NVIDIA L40S datasheet: 864 GB/s"),
    (r"\bL4\b", 300.0, "NVIDIA L4 datasheet: 300 GB/s"),
    (r"\bV100\b", 900.0, "NVIDIA V100 datasheet: 900 GB/s (SXM2 and PCIe)"),
)


def memory_spec(name: str | None) -> tuple[float, str] | None:
    """(GB/s, source) of a GPU's device memory by its NVML name, or None when it is not in the table."""
    import re

    if not name:
        return None
    for pattern, gbps, source in MEMORY_SPECS:
        if re.search(pattern, name):
            return gbps, source
    return None


def host_device_path(gpu: Mapping[str, Any]) -> LinkPath:
    """The PCIe link a host-device copy crosses, expected at the generation and width the GPU and slot support
    (NVML's max: ``nvmlDeviceGetMaxPcieLinkGeneration`` is the device-and-system maximum). A link trained
    below it is the bottleneck named, not a lower expectation. Gen5 x16 -> 48 GB/s, Gen4 x16 -> 24 GB/s.
    """
    gen = int(gpu.get("pcie_link_gen_max") or gpu.get("pcie_link_gen") or 0)
    width = int(gpu.get("pcie_link_width_max") or gpu.get("pcie_link_width") or 0)
    expected = pcie_gbps(gen, width)
    name = gpu.get("name") or "GPU"
    if expected is None:
        return LinkPath("pcie", f"PCIe of {name}", why="NVML reports no PCIe generation/width for this GPU "
                        "(a GPU on a C2C/NVLink-C2C host link, or NVML unavailable)")
    return LinkPath("pcie", f"PCIe Gen{gen} x{width} of {name}", expected, SRC_PCI)


def host_device_evidence(gpu: Mapping[str, Any], cpu_nodes: Sequence[int] = (),
                         others: Sequence[int] = ()) -> list[Evidence]:
    """What holds a host-device copy back: the link trained below its maximum, the rank's CPUs on another NUMA
    node than the GPU, other processes on the GPU (NVML)."""
    out: list[Evidence] = []
    gen, gen_max = gpu.get("pcie_link_gen"), gpu.get("pcie_link_gen_max")
    width, width_max = gpu.get("pcie_link_width"), gpu.get("pcie_link_width_max")
    if (gen and gen_max and gen < gen_max) or (width and width_max and width < width_max):
        out.append(Evidence("pcie_downtrained", f"the link trained at Gen{gen} x{width} during the copies; GPU and "
                            f"slot support Gen{gen_max} x{width_max} (NVML)", pcie_gbps(int(gen or 0), int(width or 0))))
    node = gpu.get("numa_node")
    if node is not None and cpu_nodes and node not in cpu_nodes:
        out.append(Evidence("numa", f"this rank runs on NUMA node(s) {format_rank_list(list(cpu_nodes))} and its GPU "
                            f"is on node {node} (sysfs numa_node): the copies cross the inter-socket link"))
    if others:
        out.append(Evidence("crowded", f"other processes use this GPU: pid {', '.join(str(p) for p in others)} (NVML)"))
    return out
