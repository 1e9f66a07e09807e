"""The one place ddpdoctor talks to NVML: a plain-dict snapshot of this host's NVIDIA GPUs.

NVML (``libnvidia-ml.so.1``, shipped with the driver) sees every GPU on the host whatever
``CUDA_VISIBLE_DEVICES`` says, and answers questions CUDA cannot: ECC counters, retired pages, PCIe link
generation/width, NVLink states, throttle reasons and the processes holding each GPU. We reach it through
``import pynvml`` from the maintained ``nvidia-ml-py`` package (not the deprecated ``pynvml`` package,
which makes ``import torch`` warn).

Every per-GPU query is guarded on its own: a consumer card answers "Not Supported" for ECC, a PCIe card
for NVLink, an Ampere card for retired pages (it remaps rows instead) -- one missing answer must not cost
the others. The NVML module is a parameter so tests on machines without a GPU can pass a test double.
This module never imports torch (``ddpdoctor env --no-torch`` uses it).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

# Bits of nvmlClocksEventReasons (nvml.h, "ClocksEventReasons"; formerly ClocksThrottleReasons, same
# values). The values are ABI, so a table here works with any nvidia-ml-py version.
THROTTLE_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

# nvml.h constants used below (stable ABI values; read from the module when it has them).
_NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_NVML_VOLATILE_ECC = 0
_NVML_AGGREGATE_ECC = 1
_NVML_CLOCK_SM = 1
_NVML_NVLINK_MAX_LINKS = 18
_NVML_FEATURE_ENABLED = 1
_PAGE_RETIREMENT_CAUSES = (0, 1)  # multiple single-bit ECC errors, double-bit ECC error

# Why NVML could not start, by the NVMLError subclass nvmlInit raised: what nvidia-smi prints for the
# same failure ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
# "Failed to initialize NVML: Driver/library version mismatch") and what to do.
_INIT_REASONS: dict[str, tuple[str, str]] = {
    "NVMLError_LibraryNotFound": (
        "library_not_found",
        "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver is installed on this host "
        "(or it is not mounted into the container)",
    ),
    "NVMLError_DriverNotLoaded": (
        "driver_not_loaded",
        "the NVIDIA kernel driver is not loaded (nvidia-smi: \"couldn't communicate with the NVIDIA "
        "driver\"); load it (modprobe nvidia) or reboot",
    ),
    "NVMLError_LibRmVersionMismatch": (
        "version_mismatch",
        "NVML: Driver/library version mismatch -- the driver was upgraded but the old kernel module is "
        "still loaded; reboot the host (or reload the nvidia kernel modules)",
    ),
    "NVMLError_NoPermission": (
        "no_permission",
        "no permission to open the NVIDIA device files (/dev/nvidia*)",
    ),
}


def collect_host_gpu_facts(nvml: Any = None) -> dict[str, Any]:
    """A snapshot of this host's GPUs through NVML; never raises for a missing driver or GPU.

    ``nvml`` is the ``pynvml`` module (default) or a test double with the same function names.
    """
    facts: dict[str, Any] = {
        "available": False,
        "reason": "",
        "reason_code": "",
        "driver_version": None,
        "cuda_driver_version": None,
        "gpus": [],
    }
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            facts["reason"] = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            facts["reason_code"] = "not_installed"
            return facts
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        code, reason = _INIT_REASONS.get(type(exc).__name__, ("error", f"nvmlInit failed: {exc}"))
        facts["reason"], facts["reason_code"] = reason, code
        return facts
    try:
        _fill(nvml, facts)
    finally:
        # nvmlInit/nvmlShutdown are reference counted; an unpaired init leaks the library handle.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return facts


def _fill(nvml: Any, facts: dict[str, Any]) -> None:
    """Driver facts and one dict per GPU (NVML index order, which ignores CUDA_VISIBLE_DEVICES)."""
    errors: dict[str, str] = {}
    facts["driver_version"] = _guard(nvml, errors, "driver_version",
                                     lambda: _text(nvml.nvmlSystemGetDriverVersion()))
    cuda = _guard(nvml, errors, "cuda_driver_version", nvml.nvmlSystemGetCudaDriverVersion)
    # NVML gives the CUDA driver API version as an int, 12040 -> "12.4" (same encoding as cudaDriverGetVersion).
    facts["cuda_driver_version"] = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else None
    count = _guard(nvml, errors, "device_count", nvml.nvmlDeviceGetCount)
    if errors:
        facts["query_errors"] = errors
    if count is None:
        facts["reason"] = f"NVML could not count GPUs: {errors.get('device_count')}"
        facts["reason_code"] = "error"
        return
    if count == 0:
        facts["reason"] = "the NVIDIA driver is loaded but NVML sees no GPU"
        facts["reason_code"] = "no_gpu"
        return
    facts["available"] = True
    facts["gpus"] = [_gpu_facts(nvml, index) for index in range(int(count))]


def _gpu_facts(nvml: Any, index: int) -> dict[str, Any]:
    """Every field of one GPU; a query the GPU does not support leaves its field None."""
    errors: dict[str, str] = {}
    gpu: dict[str, Any] = {"index": index}
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        # "GPU is lost" here is the NVML side of Xid 79 ("GPU has fallen off the bus").
        gpu["error"] = str(exc)
        return gpu

    def q(name: str, fn: Callable[[], Any]) -> Any:
        return _guard(nvml, errors, name, fn)

    gpu["name"] = q("name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
    gpu["uuid"] = q("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
    gpu["pci_bus_id"] = q("pci_bus_id", lambda: _bus_id(nvml.nvmlDeviceGetPciInfo(handle)))
    memory = q("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    gpu["memory_total_bytes"] = int(memory.total) if memory is not None else None
    gpu["memory_used_bytes"] = int(memory.used) if memory is not None else None
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", _NVML_MEMORY_ERROR_TYPE_UNCORRECTED)

    def ecc(counter: int) -> Callable[[], int]:
        return lambda: int(nvml.nvmlDeviceGetTotalEccErrors(handle, uncorrected, counter))

    gpu["ecc_volatile_uncorrected"] = q("ecc_volatile_uncorrected",
                                        ecc(getattr(nvml, "NVML_VOLATILE_ECC", _NVML_VOLATILE_ECC)))
    gpu["ecc_aggregate_uncorrected"] = q("ecc_aggregate_uncorrected",
                                         ecc(getattr(nvml, "NVML_AGGREGATE_ECC", _NVML_AGGREGATE_ECC)))
    gpu["retired_pages"] = q("retired_pages", lambda: sum(
        len(nvml.nvmlDeviceGetRetiredPages(handle, cause)) for cause in _PAGE_RETIREMENT_CAUSES))
    # Ampere and later remap rows instead of retiring pages; a pending remap needs a GPU reset and a
    # failed one means the GPU should be replaced (NVIDIA "Memory error management" docs).
    remap = q("remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    gpu["row_remap_pending"] = bool(remap[2]) if remap is not None else None
    gpu["row_remap_failure"] = bool(remap[3]) if remap is not None else None
    gpu["pcie_link_gen"] = q("pcie_link_gen", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)))
    gpu["pcie_link_gen_max"] = q("pcie_link_gen_max",
                                 lambda: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)))
    gpu["pcie_link_width"] = q("pcie_link_width", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))
    gpu["pcie_link_width_max"] = q("pcie_link_width_max",
                                   lambda: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)))
    gpu["nvlink_up"], gpu["nvlink_total"], gpu["nvlink_errors"] = _nvlinks(nvml, handle)
    sm = getattr(nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)
    gpu["clocks_sm_mhz"] = q("clocks_sm_mhz", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, sm)))
    gpu["clocks_max_sm_mhz"] = q("clocks_max_sm_mhz", lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, sm)))
    reasons = q("throttle_reasons", lambda: _throttle_mask(nvml, handle))
    gpu["throttle_reasons"] = decode_throttle_reasons(reasons) if reasons is not None else None
    gpu["processes"] = _processes(nvml, handle, errors)
    if errors:
        gpu["query_errors"] = errors
    return gpu


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the bits set in an nvmlClocksEventReasons mask; unknown bits as hex."""
    names = [name for bit, name in THROTTLE_REASON_BITS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASON_BITS:
        known |= bit
    if mask & ~known:
        names.append(hex(mask & ~known))
    return names


def _throttle_mask(nvml: Any, handle: Any) -> int:
    """The current clocks-event mask; the 'Throttle' name is the deprecated spelling older drivers have."""
    if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
        try:
            return int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except nvml.NVMLError as exc:
            if type(exc).__name__ != "NVMLError_FunctionNotFound":
                raise
    return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


# nvmlNvLinkErrorCounter_t (nvml.h): data-link replays, recoveries (the link retrained), CRC errors.
_NVLINK_ERROR_COUNTERS: tuple[tuple[int, str], ...] = ((0, "replay"), (1, "recovery"), (2, "crc_flit"),
                                                      (3, "crc_data"))


def _nvlinks(nvml: Any, handle: Any) -> tuple[int | None, int | None, dict[str, int] | None]:
    """(links up, links that exist, error counters summed over the links); Nones on a GPU without NVLink.

    Counters a GPU cannot report (Hopper moved some to field values) are left out, not zero.
    """
    up = total = 0
    errors: dict[str, int] = {}
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", _NVML_FEATURE_ENABLED)
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _NVML_NVLINK_MAX_LINKS))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            # NOT_SUPPORTED: no NVLink on this GPU; INVALID_ARGUMENT: this link index does not exist.
            continue
        total += 1
        up += int(state == enabled)
        for counter, name in _NVLINK_ERROR_COUNTERS:
            try:
                value = int(nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))
            except (nvml.NVMLError, AttributeError):
                continue
            errors[name] = errors.get(name, 0) + value
    return (up, total, errors or None) if total else (None, None, None)


def _processes(nvml: Any, handle: Any, errors: dict[str, str]) -> list[dict[str, Any]] | None:
    """Compute and graphics processes holding this GPU (pid and memory), each pid once."""
    seen: dict[int, dict[str, Any]] = {}
    answered = False
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        procs = _guard(nvml, errors, "processes", functools.partial(_call, nvml, name, handle))
        if procs is None:
            continue
        answered = True
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)  # None under Windows WDDM (pynvml docs)
            pid = int(proc.pid)
            if pid not in seen:
                seen[pid] = {"pid": pid, "used_memory_bytes": int(used) if used is not None else None}
    return list(seen.values()) if answered else None


def _call(nvml: Any, name: str, *args: Any) -> Any:
    """nvml.<name>(*args), looked up late so a pynvml without that function counts as unsupported."""
    return getattr(nvml, name)(*args)


def _guard(nvml: Any, errors: dict[str, str], name: str, fn: Callable[[], Any]) -> Any:
    """fn(), or None when NVML cannot answer (Not Supported, No Permission, GPU lost, old driver)."""
    mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
    caught: tuple[type[BaseException], ...] = (nvml.NVMLError, AttributeError)
    if isinstance(mismatch, type) and issubclass(mismatch, BaseException):
        # Raised instead of NVMLError when pynvml is newer than the driver's libnvidia-ml.
        caught = (*caught, mismatch)
    try:
        return fn()
    except caught as exc:
        errors.setdefault(name, str(exc) or type(exc).__name__)
        return None


def _text(value: Any) -> str:
    """pynvml returns str on Python 3, but older releases returned bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(pci: Any) -> str:
    """The PCI bus id as nvidia-smi prints it: 00000000:3B:00.0."""
    return _text(pci.busId).upper()
