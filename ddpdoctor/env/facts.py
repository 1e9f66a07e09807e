"""Facts about this process's environment that decide whether DDP works: variables, versions, NICs, shm.

Shared by the ``env`` check (compared across ranks on rank 0) and ``ddpdoctor env`` (one paste-ready
block). Torch is imported only when asked, so ``ddpdoctor env --no-torch`` starts fast.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from typing import Any

WATCHED_PREFIXES = ("NCCL_", "TORCH_", "GLOO_", "MASTER_")
WATCHED_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")

# Old name -> current name. PyTorch 2.2 renamed its NCCL process-group knobs to TORCH_NCCL_*; the old
# names still work for now but print a deprecation warning and will stop working.
DEPRECATED_VARS = {
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
    "NCCL_ENABLE_MONITORING": "TORCH_NCCL_ENABLE_MONITORING",
    "NCCL_HEARTBEAT_TIMEOUT_SEC": "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
    "NCCL_TRACE_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "NCCL_DUMP_ON_TIMEOUT": "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "NCCL_AVOID_RECORD_STREAMS": "TORCH_NCCL_AVOID_RECORD_STREAMS",
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
}

# NCCL uses /dev/shm for intra-node transfers; Docker's default 64 MB makes it fail with
# "unhandled system error" / "Error while creating shared memory segment" (NCCL troubleshooting docs).
MIN_SHM_BYTES = 1 << 30


def watched_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables whose differences across ranks break or slow a DDP job."""
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith(WATCHED_PREFIXES) or k in WATCHED_NAMES}


def interfaces() -> dict[str, list[str]]:
    """Network interface name -> its IPv4/IPv6 addresses."""
    import psutil

    result: dict[str, list[str]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        result[name] = [a.address for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
    return result


def usable_interfaces() -> list[str]:
    """This host's interfaces as every report lists them (``env``'s "have: ...", the gpu preflight's
    "interfaces: ..."): the ones a socket transport can use, see :func:`select_usable`."""
    import psutil

    return select_usable(interfaces(), {name: stats.isup for name, stats in psutil.net_if_stats().items()})


def select_usable(addresses: Mapping[str, list[str]], up: Mapping[str, bool]) -> list[str]:
    """The interfaces that are up and have an IPv4/IPv6 address, sorted; pure.

    Why these: NCCL's socket transport and bootstrap pick from ``getifaddrs`` entries with an AF_INET or
    AF_INET6 address only (``findInterfaces`` in NCCL's src/misc/socket.cc), and gloo binds to the
    interface's address, so an interface without one (``ifb0``/``ifb1``, the kernel's traffic-shaping
    devices, or a bond's enslaved NIC) is never a choice for NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME.
    NCCL does not look at the up flag, but a down interface carries nothing: offering it as a choice
    would send the user from one failure to the next.
    """
    return sorted(name for name, addrs in addresses.items() if addrs and up.get(name, False))


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of the shared-memory filesystem, or None where there is none (macOS)."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def nccl_ifname_problem(value: str, names: list[str]) -> str | None:
    """Why NCCL_SOCKET_IFNAME selects no interface here, or None when it selects one.

    NCCL's syntax: comma-separated prefixes (``eth`` matches ``eth0``), ``=name`` for an exact name, a
    leading ``^`` to exclude the listed prefixes instead.
    """
    spec = value.strip()
    if not spec:
        return "is empty"
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    patterns = [p.strip() for p in spec.split(",") if p.strip()]

    def matches(name: str, pattern: str) -> bool:
        return name == pattern if exact else name.startswith(pattern)

    if exclude:
        left = [n for n in names if not any(matches(n, p) for p in patterns)]
        return None if left else f"excludes every interface ({', '.join(sorted(names))})"
    if any(matches(n, p) for n in names for p in patterns):
        return None
    return f"matches no interface on this host (have: {', '.join(sorted(names))})"


def gloo_ifname_problem(value: str, names: list[str]) -> str | None:
    """GLOO_SOCKET_IFNAME takes exact names, comma-separated; each must exist."""
    wanted = [p.strip() for p in value.split(",") if p.strip()]
    if not wanted:
        return "is empty"
    missing = [w for w in wanted if w not in names]
    if missing:
        return f"names {', '.join(missing)}, which this host does not have (have: {', '.join(sorted(names))})"
    return None


def nccl_version(torch: Any) -> str | None:
    """NCCL version PyTorch was built with, "2.21.5"; None on builds without NCCL."""
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # CPU builds raise AttributeError/RuntimeError from torch._C
        return None
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version)
    # NCCL < 2.9 packed the version as an int: 2708 -> 2.7.8.
    return f"{version // 1000}.{(version % 1000) // 100}.{version % 100}"


def versions(with_torch: bool = True) -> dict[str, Any]:
    """Python, torch, CUDA and NCCL versions (torch/CUDA/NCCL only when torch is imported)."""
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
    }
    if not with_torch:
        return facts
    import torch

    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    facts["cuda_available"] = bool(torch.cuda.is_available())
    facts["nccl"] = nccl_version(torch) if torch.cuda.is_available() else None
    facts["gloo_available"] = bool(torch.distributed.is_gloo_available())
    facts["nccl_available"] = bool(torch.distributed.is_nccl_available())
    return facts
