"""What sysfs says about NUMA placement, network devices and InfiniBand ports (Linux only).

NCCL picks its NIC by PCI distance to the GPU; a rank whose CPUs, GPU and NIC sit on different NUMA nodes
crosses the inter-socket link on every transfer (NCCL_DEBUG=INFO shows it as "via NET/IB/... PXN" or
a PHB/SYS path). These readers take the sysfs root as a parameter, so tests run them on a fake tree that
mirrors the real layout as well as on this machine's real ``/sys``:

- ``/sys/class/net/<if>/device/numa_node``, ``/sys/class/net/<if>/operstate``
- ``/sys/class/infiniband/<hca>/ports/<n>/state`` (text like ``4: ACTIVE``), ``.../device/numa_node``
- ``/sys/bus/pci/devices/<0000:3b:00.0>/numa_node`` (a GPU), ``/sys/devices/system/node/node<N>/cpulist``

``numa_node`` is ``-1`` where the platform does not say (single-socket machines, most VMs): read as None.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any


def _read(path: Path, limit: int = 4096) -> str | None:
    """A small sysfs attribute, stripped; None when absent or unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace").strip()
    except OSError:
        return None


def parse_numa_node(text: str | None) -> int | None:
    """``"1"`` -> 1; ``"-1"`` (unknown), empty or garbage -> None."""
    if text is None or not re.fullmatch(r"-?\d+", text.strip()):
        return None
    node = int(text)
    return node if node >= 0 else None


def parse_cpulist(text: str) -> set[int]:
    """A kernel cpulist (``0-3,8-11``, ``5``, empty) as a set of CPU numbers; ValueError if malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return cpus


def parse_ib_state(text: str | None) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"`` (the kernel's ib port state file); None when absent."""
    if not text:
        return None
    return text.split(":", 1)[-1].strip() or None


def _entries(folder: Path) -> list[str]:
    """The names in a sysfs class folder, sorted; none when it is absent or unreadable (a container)."""
    try:
        return sorted(p.name for p in folder.iterdir())
    except OSError:
        return []


def net_devices(root: str | os.PathLike[str] = "/sys") -> list[dict[str, Any]]:
    """Network interfaces: name, NUMA node of the backing device (None for virtual ones), operstate."""
    base = Path(root) / "class" / "net"
    out = []
    names = _entries(base)
    for name in names:
        dev = base / name / "device"
        out.append({"name": name, "numa_node": parse_numa_node(_read(dev / "numa_node")),
                    "virtual": not dev.exists(), "operstate": _read(base / name / "operstate")})
    return out


def ib_devices(root: str | os.PathLike[str] = "/sys") -> list[dict[str, Any]]:
    """InfiniBand/RoCE HCAs: name, NUMA node, port number -> state (ACTIVE, DOWN, INIT, ...)."""
    base = Path(root) / "class" / "infiniband"
    out = []
    names = _entries(base)
    for name in names:
        ports: dict[int, str | None] = {}
        try:
            port_dirs = sorted((base / name / "ports").iterdir(), key=lambda p: p.name)
        except OSError:
            port_dirs = []
        for port in port_dirs:
            if port.name.isdigit():
                ports[int(port.name)] = parse_ib_state(_read(port / "state"))
        out.append({"name": name, "numa_node": parse_numa_node(_read(base / name / "device" / "numa_node")),
                    "ports": ports})
    return out


def pci_numa_node(bus_id: str, root: str | os.PathLike[str] = "/sys") -> int | None:
    """The NUMA node of a PCI device given as NVML prints it (``00000000:3B:00.0``)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    try:
        name = f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2] if '.' in parts[2] else parts[2] + '.0'}"
    except ValueError:
        return None
    return parse_numa_node(_read(Path(root) / "bus" / "pci" / "devices" / name / "numa_node"))


def numa_cpus(root: str | os.PathLike[str] = "/sys") -> dict[int, set[int]]:
    """NUMA node -> its CPUs, from ``/sys/devices/system/node/node*/cpulist``."""
    base = Path(root) / "devices" / "system" / "node"
    out: dict[int, set[int]] = {}
    try:
        entries = list(base.iterdir())
    except OSError:
        return out
    for entry in entries:
        m = re.fullmatch(r"node(\d+)", entry.name)
        text = _read(entry / "cpulist") if m else None
        if m and text is not None:
            try:
                out[int(m.group(1))] = parse_cpulist(text)
            except ValueError:
                continue
    return out


def nccl_device_filter(spec: str) -> tuple[bool, bool, list[tuple[str, int | None]]]:
    """``NCCL_SOCKET_IFNAME``/``NCCL_IB_HCA`` syntax (NCCL env docs): comma-separated names, each a prefix
    unless the list starts with ``=`` (exact); ``^`` first excludes them; ``name:port`` picks an IB port.
    Returns (exclude, exact, [(name, port)])."""
    text = spec.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    items: list[tuple[str, int | None]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, port = part.partition(":")
        items.append((name, int(port) if port.isdigit() else None))
    return exclude, exact, items


def unmatched_names(spec: str, existing: list[str]) -> list[str]:
    """The names an include-list NCCL variable asks for that match no existing device (empty for an
    exclude list: excluding a device that is not there is harmless)."""
    exclude, exact, items = nccl_device_filter(spec)
    if exclude:
        return []
    return [name for name, _ in items
            if not any((dev == name) if exact else dev.startswith(name) for dev in existing)]
