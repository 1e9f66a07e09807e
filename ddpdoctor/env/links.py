"""The facts of the links a rank's traffic takes: NIC speed and kind, qdiscs, IB ports, PCIe training, NUMA.

These are the inputs of the bandwidth expectation model (:mod:`ddpdoctor.bench.expect`). Each reader takes
what it reads from as a parameter (the sysfs root, the text a tool printed), so the parsers are tested on the
real formats and the readers on this machine's real ``/sys``:

- ``/sys/class/net/<if>/speed``: the negotiated speed in Mb/s (``-1`` or ``EINVAL`` when the driver does not
  say: loopback, ifb, many virtio NICs). A veth always says 10000: drivers/net/veth.c
  ``veth_get_link_ksettings`` sets ``SPEED_10000``, a constant, not a trained rate; a bridge says 10000 with a
  veth port and -1 with none (read on this project's machines, kernel 6.18).
- the interface's kind (veth, bridge, vlan, ...) from ``ip -j -d link show dev IF`` (``linkinfo.info_kind``);
  a physical NIC has a ``device`` link in sysfs and no kind.
- ``tc -j qdisc show dev IF``: the queueing disciplines; a ``tbf`` (its ``rate`` in bytes/s in the JSON),
  ``cake`` (``bandwidth``) or ``netem``/``fq`` with a rate shapes the link below the NIC's speed.
- ``/sys/class/infiniband/<hca>/ports/<n>/{rate,state,link_layer}``: ``rate`` reads like
  ``200 Gb/sec (4X HDR)``, ``state`` like ``4: ACTIVE``, ``link_layer`` ``InfiniBand`` or ``Ethernet`` (RoCE).
- ``/sys/bus/pci/devices/<bdf>/{current,max}_link_{speed,width}``: ``16.0 GT/s PCIe`` and ``16``; the
  generation is the transfer rate's (2.5, 5, 8, 16, 32, 64 GT/s = Gen1-6), as NCCL maps it (src/graph/topo.cc
  ``kvDictPciGen``, v2.30.7-1 lines 545-556).
- ``NCCL_DEBUG=INFO`` lines: which network NCCL chose (``NET/IB : Using [0]mlx5_0:1/IB``, ``NET/Socket :
  Using [0]eth0:...``), the channel transports (``via P2P/IPC``, ``via SHM``, ``via NET/IB/0``), NVLS, and a
  missing network plugin.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddpdoctor.env.sysfs import _read, numa_cpus, parse_ib_state, parse_numa_node

# Seconds a helper tool (ip, tc) may take before its fact is left unknown.
TOOL_TIMEOUT_S = 3.0

# PCIe transfer rate (GT/s) -> generation (PCI-SIG; NCCL's kvDictPciGen uses the same strings).
PCIE_GENERATIONS: dict[float, int] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def _tool(argv: Sequence[str]) -> str | None:
    """A tool's stdout, or None when it is missing, fails or overruns (the fact is then unknown)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


# -- network interfaces ------------------------------------------------------------------------------


def parse_speed_mbps(text: str | None) -> int | None:
    """``/sys/class/net/IF/speed``: ``"10000"`` -> 10000; ``"-1"``, ``"0"``, empty or absent -> None."""
    if text is None or not re.fullmatch(r"-?\d+", text.strip()):
        return None
    value = int(text)
    return value if value > 0 else None


def _first_ip_record(ip_json: str | None) -> dict[str, Any] | None:
    """The first object of iproute2's ``-j`` output (a JSON list), None for anything else."""
    if not ip_json:
        return None
    try:
        data = json.loads(ip_json)
    except ValueError:
        return None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    return data[0]


def parse_link_kind(ip_json: str | None) -> str | None:
    """``ip -j -d link show dev IF`` -> its ``info_kind`` (``veth``, ``bridge``, ``vlan``, ``bond``...), or None."""
    record = _first_ip_record(ip_json)
    if record is None:
        return None
    info = record.get("linkinfo")
    kind = info.get("info_kind") if isinstance(info, dict) else None
    if kind is None and record.get("link_type") == "loopback":
        return "loopback"
    return str(kind) if kind else None


# Qdisc options that cap the rate, in bytes per second in tc's JSON (tc/q_tbf.c, q_cake.c, q_netem.c, q_fq.c
# print_u64 "rate"/"bandwidth"/"maxrate").
_RATE_KEYS = ("rate", "bandwidth", "maxrate", "flow_max_rate")


def parse_qdiscs(tc_json: str | None) -> list[dict[str, Any]]:
    """``tc -j qdisc show dev IF`` -> [{kind, handle, root, rate_bytes_per_s}] (rate None when it sets none)."""
    if not tc_json:
        return []
    try:
        data = json.loads(tc_json)
    except ValueError:
        return []
    out: list[dict[str, Any]] = []
    for q in data if isinstance(data, list) else []:
        if not isinstance(q, dict) or "kind" not in q:
            continue
        raw = q.get("options")
        options: dict[str, Any] = raw if isinstance(raw, dict) else {}
        rate = next((options[k] for k in _RATE_KEYS
                     if isinstance(options.get(k), (int, float)) and options[k] > 0), None)
        out.append({"kind": str(q["kind"]), "handle": str(q.get("handle", "")), "root": bool(q.get("root")),
                    "rate_bytes_per_s": float(rate) if rate is not None else None})
    return out


def parse_ethtool_max_mbps(text: str | None) -> int | None:
    """``ethtool IF``'s "Supported link modes" -> the fastest in Mb/s (``100000baseSR4/Full`` -> 100000).

    What the NIC and its cable can do; ``/sys/class/net/IF/speed`` is what it negotiated. None when ethtool is
    missing or lists no modes (virtual devices).
    """
    if not text:
        return None
    block = re.search(r"Supported link modes:(.*?)(?:\n\s*[A-Z][\w ]*:|\Z)", text, re.S)
    speeds = [int(m) for m in re.findall(r"(\d+)base", block.group(1))] if block else []
    return max(speeds) if speeds else None


_TC_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bps": 8, "kbps": 8e3,
                  "mbps": 8e6, "gbps": 8e9}


def parse_class_ceiling(tc_text: str | None) -> float | None:
    """``tc class show dev IF`` (text: iproute2 prints htb classes without JSON) -> the highest ``ceil`` (else
    ``rate``) of any class, in bytes/s: no traffic through a classful htb/hfsc root goes faster than that.

    Lines look like ``class htb 1:10 root prio 0 rate 100Mbit ceil 150Mbit burst 1600b cburst 1575b``.
    """
    best: float | None = None
    for line in (tc_text or "").splitlines():
        found = dict(re.findall(r"\b(rate|ceil)\s+(\d+(?:\.\d+)?[A-Za-z]*)", line))
        text = found.get("ceil") or found.get("rate")
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", text or "")
        if not m or m.group(2).lower() not in _TC_RATE_UNITS:
            continue
        value = float(m.group(1)) * _TC_RATE_UNITS[m.group(2).lower()] / 8
        best = value if best is None else max(best, value)
    return best


def net_link(name: str, root: str | os.PathLike[str] = "/sys", with_tools: bool = True) -> dict[str, Any]:
    """One interface's facts: speed (Mb/s or None), operstate, kind, virtual, NUMA node, PCI address, qdiscs."""
    base = Path(root) / "class" / "net" / name
    device = base / "device"
    pci = None
    try:
        target = os.path.realpath(device) if device.exists() else ""
        m = re.search(r"([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])(?!.*[0-9a-f]{4}:[0-9a-f]{2}:)", target)
        pci = m.group(1) if m else None
    except OSError:
        pci = None
    kind = parse_link_kind(_tool(["ip", "-j", "-d", "link", "show", "dev", name])) if with_tools else None
    if kind is None and name == "lo":
        kind = "loopback"
    qdiscs = parse_qdiscs(_tool(["tc", "-j", "qdisc", "show", "dev", name])) if with_tools else []
    for q in qdiscs:
        if q["kind"] in ("htb", "hfsc") and q["root"] and q["rate_bytes_per_s"] is None:
            q["rate_bytes_per_s"] = parse_class_ceiling(_tool(["tc", "class", "show", "dev", name]))
    virtual = not device.exists()
    supported = parse_ethtool_max_mbps(_tool(["ethtool", name])) if with_tools and not virtual else None
    return {"name": name, "exists": base.exists(), "speed_mbps": parse_speed_mbps(_read(base / "speed")),
            "speed_max_mbps": supported,
            "operstate": _read(base / "operstate"), "kind": kind, "virtual": not device.exists(),
            "numa_node": parse_numa_node(_read(device / "numa_node")), "pci": pci,
            "qdiscs": qdiscs}


def parse_route_dev(ip_json: str | None) -> str | None:
    """``ip -j route get ADDR`` -> the interface it leaves through (None for a local address: ``lo``)."""
    record = _first_ip_record(ip_json)
    if record is None:
        return None
    dev = record.get("dev")
    return str(dev) if dev and dev != "lo" and record.get("type") != "local" else None


def _first_listed(spec: str, existing: Iterable[str]) -> str | None:
    """The first existing interface an ``*_SOCKET_IFNAME`` value picks (prefix match unless ``=``; ``^`` excludes)."""
    from ddpdoctor.env.sysfs import nccl_device_filter

    names = sorted(existing)
    exclude, exact, items = nccl_device_filter(spec)
    if exclude:
        bad = [n for n, _ in items]
        return next((d for d in names if d != "lo" and not any(d == b if exact else d.startswith(b) for b in bad)),
                    None)
    for item, _ in items:
        for dev in names:
            if (dev == item) if exact else dev.startswith(item):
                return dev
    return None


def data_interface(backend: str, environ: Mapping[str, str], root: str | os.PathLike[str] = "/sys") -> tuple[str | None, str]:
    """The interface this rank's socket traffic leaves through, and how that was decided.

    gloo: ``GLOO_SOCKET_IFNAME`` (its first name; torch's ProcessGroupGloo makes one device per listed name);
    NCCL's socket transport and bootstrap: ``NCCL_SOCKET_IFNAME`` (NCCL's prefix syntax). Otherwise the
    route towards ``MASTER_ADDR`` (the address the job meets at), else the default route's interface.
    """
    existing = [p.name for p in (Path(root) / "class" / "net").iterdir()] if (Path(root) / "class" / "net").exists() \
        else []
    var = "GLOO_SOCKET_IFNAME" if backend == "gloo" else "NCCL_SOCKET_IFNAME"
    spec = environ.get(var, "").strip()
    if spec:
        first = spec.split(",")[0].strip() if backend == "gloo" else _first_listed(spec, existing)
        if first:
            return first, f"{var}={spec}"
    addr = environ.get("MASTER_ADDR", "").strip()
    if addr:
        dev = parse_route_dev(_tool(["ip", "-j", "route", "get", addr]))
        if dev:
            return dev, f"the route to MASTER_ADDR {addr}"
    out = _tool(["ip", "-j", "route", "show", "default"])
    dev = None
    if out:
        try:
            routes = json.loads(out)
            dev = next((str(r["dev"]) for r in routes if isinstance(r, dict) and r.get("dev")), None)
        except ValueError:
            dev = None
    if dev:
        return dev, "the default route"
    return None, "no route found"


# -- InfiniBand / RoCE ------------------------------------------------------------------------------


def parse_ib_rate_gbps(text: str | None) -> float | None:
    """``/sys/class/infiniband/HCA/ports/N/rate``: ``"200 Gb/sec (4X HDR)"`` -> 200.0; None if unreadable."""
    if not text:
        return None
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", text)
    return float(m.group(1)) if m else None


def ib_ports(root: str | os.PathLike[str] = "/sys") -> list[dict[str, Any]]:
    """Every InfiniBand/RoCE port: hca, port, state, rate (Gb/s and the kernel's text), link layer, NUMA node."""
    base = Path(root) / "class" / "infiniband"
    out: list[dict[str, Any]] = []
    try:
        hcas = sorted(p.name for p in base.iterdir())
    except OSError:
        return out
    for hca in hcas:
        numa = parse_numa_node(_read(base / hca / "device" / "numa_node"))
        try:
            ports = sorted((p for p in (base / hca / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        except OSError:
            ports = []
        for port in ports:
            rate_text = _read(port / "rate")
            out.append({"hca": hca, "port": int(port.name), "state": parse_ib_state(_read(port / "state")),
                        "rate_text": rate_text, "rate_gbps": parse_ib_rate_gbps(rate_text),
                        "link_layer": _read(port / "link_layer"), "numa_node": numa})
    return out


# -- PCIe --------------------------------------------------------------------------------------------


def parse_pcie_speed(text: str | None) -> tuple[float | None, int | None]:
    """``"16.0 GT/s PCIe"`` (or the pre-5.6 kernels' ``"16 GT/s"``) -> (16.0, 4); unknown -> (None, None)."""
    if not text:
        return None, None
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*GT/s", text)
    if not m:
        return None, None
    rate = float(m.group(1))
    return rate, PCIE_GENERATIONS.get(rate)


def parse_int(text: str | None) -> int | None:
    return int(text) if text is not None and re.fullmatch(r"\d+", text.strip()) else None


def pci_name(bus_id: str) -> str | None:
    """NVML's ``00000000:3B:00.0`` -> sysfs's ``0000:3b:00.0``."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2] if '.' in parts[2] else parts[2] + '.0'}"
    except ValueError:
        return None


def pcie_link(bus_id: str, root: str | os.PathLike[str] = "/sys") -> dict[str, Any]:
    """A PCI device's link as trained (current) and as built (max): GT/s, generation, width; Nones if unknown."""
    name = pci_name(bus_id)
    base = Path(root) / "bus" / "pci" / "devices" / (name or "none")
    cur_rate, cur_gen = parse_pcie_speed(_read(base / "current_link_speed"))
    max_rate, max_gen = parse_pcie_speed(_read(base / "max_link_speed"))
    return {"pci": name, "gen": cur_gen, "gen_max": max_gen, "gts": cur_rate, "gts_max": max_rate,
            "width": parse_int(_read(base / "current_link_width")),
            "width_max": parse_int(_read(base / "max_link_width")),
            "numa_node": parse_numa_node(_read(base / "numa_node"))}


def pci_links(root: str | os.PathLike[str] = "/sys") -> list[dict[str, Any]]:
    """Every PCI device that reports a link (virtual machines' legacy buses report none)."""
    base = Path(root) / "bus" / "pci" / "devices"
    try:
        names = sorted(p.name for p in base.iterdir())
    except OSError:
        return []
    return [link for link in (pcie_link(n, root) for n in names) if link["gen"] is not None or link["width"]]


# -- NCCL_DEBUG=INFO ---------------------------------------------------------------------------------


def parse_nccl_info(text: str) -> dict[str, Any]:
    """What NCCL said it chose, from ``NCCL_DEBUG=INFO`` output.

    Lines (NCCL src/transport/net_ib.cc, net_socket.cc, src/init.cc, src/transport.cc):
    ``NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>``,
    ``NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>``, ``NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``,
    ``... via SHM/direct/direct``, ``... [send] via NET/IB/0``, ``NCCL INFO NVLS multicast support is available``,
    ``NCCL INFO NET/Plugin: Could not find: libnccl-net.so`` / ``No plugin found``.
    """
    net: str | None = None
    devices: list[str] = []
    transports: list[str] = []
    plugin_missing = False
    nvls = False
    for line in text.splitlines():
        if "NCCL INFO" not in line:
            continue
        m = re.search(r"NET/(IB|Socket|OFI|AWS Libfabric|[A-Za-z_]+) : Using (.*)", line)
        if m:
            net = "IB" if m.group(1) == "IB" else m.group(1)
            devices = re.findall(r"\[\d+\]([^\s\[;]+)", m.group(2))
        m = re.search(r" via ((?:P2P|SHM|NET|CollNet|NVLS)[^\s]*)", line)
        if m:
            kind = m.group(1).split("/")[0] if not m.group(1).startswith("NET/") else "/".join(m.group(1).split("/")[:2])
            if kind not in transports:
                transports.append(kind)
        if re.search(r"NET/Plugin.*(No plugin found|Could not find|Failed to open)", line):
            plugin_missing = True
        if "NVLS multicast support is available" in line or re.search(r"\bNVLS\b.*(enabled|comm)", line):
            nvls = True
    return {"net": net, "net_devices": devices, "transports": transports, "plugin_missing": plugin_missing,
            "nvls": nvls}


# -- one rank's placement and facts ------------------------------------------------------------------

# The variables that steer NCCL's and gloo's choice of path (NCCL env docs, "Environment Variables").
PATH_VARIABLES = ("NCCL_IB_DISABLE", "NCCL_NET", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_SOCKET_IFNAME",
                  "NCCL_IB_HCA", "NCCL_NET_PLUGIN", "NCCL_NVLS_ENABLE", "NCCL_P2P_LEVEL", "GLOO_SOCKET_IFNAME",
                  "NCCL_ALGO", "NCCL_PROTO")


def cpu_numa_nodes(cpus: Iterable[int], root: str | os.PathLike[str] = "/sys") -> list[int]:
    """The NUMA nodes a set of CPUs (a rank's affinity) spans."""
    wanted = set(cpus)
    return sorted(node for node, members in numa_cpus(root).items() if members & wanted)


def rank_link_facts(backend: str, environ: Mapping[str, str], cpus: Sequence[int], gpu: Mapping[str, Any] | None,
                    root: str | os.PathLike[str] = "/sys", our_pids: Iterable[int] = ()) -> dict[str, Any]:
    """Everything the expectation model needs about one rank's paths, as plain JSON-able data.

    ``gpu``: this rank's GPU as NVML describes it (:func:`ddpdoctor.env.nvml.collect_host_gpu_facts`, plus
    ``compute_capability``), or None on a CPU rank. ``our_pids``: this job's processes on this host, so that
    the other processes NVML lists on the GPU (``gpu.other_pids``) can be told apart.
    """
    ifname, how = data_interface(backend, environ, root)
    facts: dict[str, Any] = {
        "backend": backend,
        "interface": net_link(ifname, root) if ifname else None,
        "interface_from": how,
        "ib_ports": ib_ports(root),
        "env": {k: environ[k] for k in PATH_VARIABLES if k in environ},
        "cpu_numa_nodes": cpu_numa_nodes(cpus, root),
        "gpu": None,
    }
    if gpu:
        link = pcie_link(str(gpu.get("pci_bus_id") or ""), root)
        facts["gpu"] = {**{k: gpu.get(k) for k in ("name", "uuid", "pci_bus_id", "pcie_link_gen", "pcie_link_gen_max",
                                                   "pcie_link_width", "pcie_link_width_max", "nvlink_up",
                                                   "nvlink_total", "compute_capability", "processes",
                                                   "memory_total_bytes")},
                        "numa_node": link["numa_node"], "sysfs_pcie": link,
                        "other_pids": sorted(int(p["pid"]) for p in gpu.get("processes") or []
                                             if int(p.get("pid", -1)) not in set(our_pids) | {os.getpid()})}
    return facts


def placement(host: str, device: str, our_pids: Iterable[int]) -> dict[str, Any]:
    """Where this rank may run: its host, the CPUs in its affinity mask, its device, and how many runnable
    threads of other processes (not this job's: ``our_pids``) want those CPUs now."""
    from ddpdoctor.env.load import other_runnable

    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: every CPU
        cpus = list(range(os.cpu_count() or 1))
    others = other_runnable(cpus, set(our_pids))
    return {"host": host, "cpus": cpus, "device": device, "others": round(others, 1)}


def gpu_of(device: str) -> dict[str, Any] | None:
    """This rank's GPU as NVML describes it, with its compute capability; None on a CPU rank or without NVML.

    Matched by UUID (NVML numbers GPUs in PCI order, ignoring CUDA_VISIBLE_DEVICES).
    """
    if not device.startswith("cuda"):
        return None
    import torch

    from ddpdoctor.env.gpu_facts import match_nvml_gpu, torch_device_ids
    from ddpdoctor.env.nvml import collect_host_gpu_facts

    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    ids = torch_device_ids(torch, index)
    props = torch.cuda.get_device_properties(index)
    host = collect_host_gpu_facts()
    gpu = match_nvml_gpu(host.get("gpus") or [], ids.get("uuid"), ids.get("pci_bus_id")) or {}
    return {**gpu, "name": gpu.get("name") or ids.get("name"), "uuid": gpu.get("uuid") or ids.get("uuid"),
            "pci_bus_id": gpu.get("pci_bus_id") or ids.get("pci_bus_id"),
            "compute_capability": [int(props.major), int(props.minor)],
            "memory_total_bytes": gpu.get("memory_total_bytes") or int(props.total_memory)}
