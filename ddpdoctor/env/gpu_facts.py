"""One rank's GPU facts as a plain dict: which device it really uses (PyTorch), that GPU's health (NVML) and
the host around it (kernel-log Xids, NUMA placement, NICs, InfiniBand ports).

The thin part of the ``gpu`` check: everything here asks the machine and judges nothing. The verdict is
``ddpdoctor.checks.gpu.analyze``, a pure function of every rank's dict, run on rank 0 (the dicts travel
through the control plane as JSON). Torch is imported only by :func:`gather_rank_facts`.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from ddpdoctor.env import sysfs
from ddpdoctor.env.facts import nccl_version, usable_interfaces
from ddpdoctor.env.kernel_log import bus_key, parse_xid_events, read_kernel_log
from ddpdoctor.env.nvml import collect_host_gpu_facts
from ddpdoctor.errors import short_error

MAX_XID_EVENTS = 50  # per GPU, the latest: a flapping link logs thousands


def gather_rank_facts(*, host: str, local_rank: int, local_world_size: int, pid: int, device: str, backend: str,
                      deadline_s: float = 2.0, job_started_epoch: float | None = None,
                      nvml_module: Any = None) -> dict[str, Any]:
    """This rank's GPU facts as a JSON-able dict (what ``checks.gpu.analyze`` reads).

    ``job_started_epoch`` is when the user's command started (wall clock): Xids after it happened during
    this run. ``deadline_s`` bounds the only slow part, the kernel-log read.
    """
    host_gpus = collect_host_gpu_facts(nvml_module)
    facts: dict[str, Any] = {
        "host": host, "local_rank": local_rank, "local_world_size": local_world_size,
        "pid": pid, "device": device, "backend": backend,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nvml_available": host_gpus["available"], "nvml_reason": host_gpus["reason"],
        "driver_version": host_gpus["driver_version"],
        "cuda_driver_version": host_gpus["cuda_driver_version"],
        "cuda_available": False, "skip_reason": "", "gpu": None, "p2p": None,
    }
    import torch

    facts["torch_cuda_version"] = torch.version.cuda
    facts["nccl_version"] = nccl_version(torch)
    with warnings.catch_warnings(record=True) as caught:
        # A CUDA build on a bad driver says why only as a UserWarning ("CUDA initialization: The NVIDIA
        # driver on your system is too old ..."), so keep the warning text for the skip reason.
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
    if not available:
        facts["skip_reason"] = no_cuda_reason(torch.__version__, torch.version.cuda,
                                              facts["cuda_visible_devices"], host_gpus["reason"],
                                              [str(w.message) for w in caught])
        return facts
    facts["cuda_available"] = True
    if not device.startswith("cuda"):
        facts["skip_reason"] = (f"this run uses device {device!r} (backend {backend}), not a GPU; "
                                "run with the nccl backend to check the GPUs")
        return facts
    count = torch.cuda.device_count()
    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    facts["device_count"] = count
    facts["device_index"] = index
    facts["current_device"] = torch.cuda.current_device()
    visible = [torch_device_ids(torch, i) for i in range(count)]
    mine = visible[index] if 0 <= index < count else {"name": None, "uuid": None, "pci_bus_id": None}
    facts.update(device_name=mine["name"], uuid=mine["uuid"], pci_bus_id=mine["pci_bus_id"])
    facts["gpu"] = match_nvml_gpu(host_gpus["gpus"], mine["uuid"], mine["pci_bus_id"])
    bus = (facts["gpu"] or {}).get("pci_bus_id") or mine["pci_bus_id"]
    facts["preflight"] = gather_preflight(bus, dict(os.environ), deadline_s=deadline_s,
                                          job_started_epoch=job_started_epoch)
    if local_rank == 0:
        # One rank per host is enough: peer access is a property of the host's GPUs, not of the rank.
        try:
            matrix = [[None if i == j else bool(torch.cuda.can_device_access_peer(i, j))
                       for j in range(count)] for i in range(count)]
            facts["p2p"] = {"devices": visible, "matrix": matrix}
        except RuntimeError as exc:  # a CUDA error here must not cost the rest of the facts
            facts["p2p"] = {"devices": visible, "error": short_error(exc)}
    return facts


def clock_now() -> tuple[float, float]:
    """(seconds since boot, wall-clock seconds) now. Kernel-log stamps count from boot like
    ``time.monotonic()`` (CLOCK_MONOTONIC on Linux); their difference is an Xid's age."""
    return time.monotonic(), time.time()


def gather_preflight(bus_id: str | None, environ: Mapping[str, str], root: str = "/sys",
                     deadline_s: float = 2.0, job_started_epoch: float | None = None,
                     log_text: str | None = None) -> dict[str, Any]:
    """Host facts around this rank's GPU: its Xid events since boot (each with its time since boot),
    NUMA placement of GPU, CPUs and NICs, InfiniBand port states, and the NIC names NCCL is told to use.

    ``log_text`` replaces the kernel-log read (recorded logs in tests); the read is bounded by
    ``deadline_s`` otherwise.
    """
    if log_text is None:
        log = read_kernel_log(deadline_s=deadline_s)
        text, source, reason = log.text, log.source, log.reason
    else:
        text, source, reason = log_text, "recorded", ""
    uptime_s, now_epoch = clock_now()
    boot_epoch = now_epoch - uptime_s
    events = parse_xid_events(text)
    mine = bus_key(bus_id) if bus_id else None
    node_cpus = sysfs.numa_cpus(root)
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = []
    return {
        "bus_id": bus_id,
        "kernel_log_source": source, "kernel_log_reason": reason,
        "uptime_s": round(uptime_s, 3), "boot_epoch": round(boot_epoch, 3),
        "job_started_s": round(job_started_epoch - boot_epoch, 3) if job_started_epoch else None,
        "xid_events": [{"xid": e.xid, "bus": e.bus, "pid": e.pid, "process": e.process, "message": e.message,
                        "when": e.when, "at_s": e.since_boot_s(boot_epoch, now_epoch)}
                       for e in events if e.bus == mine][-MAX_XID_EVENTS:],
        "xid_events_other_gpus": sum(1 for e in events if e.bus != mine),
        "gpu_numa_node": sysfs.pci_numa_node(bus_id, root) if bus_id else None,
        "cpu_affinity": affinity,
        "numa_cpus": {str(n): sorted(c) for n, c in sorted(node_cpus.items())},
        # The interface names reports show: one list for the env check and this preflight (issue 35).
        "interfaces": usable_interfaces(),
        "net": sysfs.net_devices(root), "ib": [dict(d, ports={str(k): v for k, v in d["ports"].items()})
                                             for d in sysfs.ib_devices(root)],
        "nccl_socket_ifname": environ.get("NCCL_SOCKET_IFNAME"), "nccl_ib_hca": environ.get("NCCL_IB_HCA"),
        "nccl_ib_disable": environ.get("NCCL_IB_DISABLE"),
    }


def torch_device_ids(torch: Any, index: int) -> dict[str, Any]:
    """Name, NVML-style UUID and PCI bus id of CUDA device ``index`` (as this process numbers it)."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)  # PyTorch >= 2.0
    bus = getattr(props, "pci_bus_id", None)  # newer PyTorch only; the UUID is the primary key
    pci = None
    if bus is not None:
        pci = f"{int(getattr(props, 'pci_domain_id', 0)):08X}:{int(bus):02X}:" \
              f"{int(getattr(props, 'pci_device_id', 0)):02X}.0"
    return {"index": index, "name": str(props.name),
            "uuid": normalize_uuid(str(uuid)) if uuid is not None else None, "pci_bus_id": pci}


def normalize_uuid(uuid: str) -> str:
    """NVML's spelling ("GPU-58111ddc-..."); PyTorch prints the same UUID without the prefix."""
    text = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return prefix.upper() + text[len(prefix):]
    return "GPU-" + text


def match_nvml_gpu(gpus: Iterable[Mapping[str, Any]], uuid: str | None,
                   pci_bus_id: str | None) -> dict[str, Any] | None:
    """The NVML entry for a CUDA device, by UUID, else by PCI bus id.

    NVML numbers GPUs by PCI order and ignores CUDA_VISIBLE_DEVICES, so the index cannot be used.
    """
    for gpu in gpus:
        if uuid and gpu.get("uuid") and normalize_uuid(str(gpu["uuid"])) == normalize_uuid(uuid):
            return dict(gpu)
    for gpu in gpus:
        if pci_bus_id and gpu.get("pci_bus_id") and _same_bus(str(gpu["pci_bus_id"]), pci_bus_id):
            return dict(gpu)
    return None


def _same_bus(a: str, b: str) -> bool:
    """Bus ids compare without the domain's zero padding (NVML: 8 digits, sysfs and CUDA: 4)."""
    def key(s: str) -> tuple[int, ...]:
        parts = s.replace(".", ":").split(":")  # [domain:]bus:device.function
        if len(parts) == 3:
            parts = ["0", *parts]
        return tuple(int(x, 16) for x in parts)
    try:
        return key(a) == key(b)
    except ValueError:
        return a.upper() == b.upper()


def no_cuda_reason(torch_version: str, torch_cuda: str | None, cuda_visible_devices: str | None,
                   nvml_reason: str, cuda_warnings: list[str]) -> str:
    """Why this rank cannot use a GPU, most specific cause first."""
    parts: list[str] = []
    if torch_cuda is None:
        parts.append(f"PyTorch {torch_version} is a CPU-only build (torch.version.cuda is None)")
    elif cuda_visible_devices is not None and cuda_visible_devices.strip() in ("", "-1", "none"):
        parts.append(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} hides every GPU")
    else:
        parts.append("torch.cuda.is_available() is False")
    parts.extend(w.splitlines()[0] for w in cuda_warnings if w.strip())
    if nvml_reason:
        parts.append(nvml_reason)
    return "; ".join(parts)
