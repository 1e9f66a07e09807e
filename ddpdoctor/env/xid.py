"""What an Xid means and whose fault it usually is, after NVIDIA's Xid catalog.

NVIDIA's catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Resolution Bucket
(Immediate Action)") and its older Xid listing (docs.nvidia.com/deploy/xid-errors/index.html, the
"User App Error" column) split Xids by cause:

* **application**: the program running on the GPU faulted; the GPU itself is normally fine and the
  catalog's action is RESTART_APP or IGNORE. 13 (graphics engine exception: an out-of-range access in a
  kernel, what a CUDA device-side assert leaves), 31 (MMU fault: an illegal address), 43 (GPU stopped
  processing: the driver reset the faulting channel), 45 (preemptive cleanup as a process is torn
  down), 8 and 109 (a channel or context-switch timeout of one application).
* **hardware** (memory, links, the bus) and **driver/firmware** (GSP, micro-controller): the GPU or the
  node needs attention: RESET_GPU, RESTART_BM (reboot), or CONTACT_SUPPORT (RMA) when it repeats.

This module holds the facts only (meaning, origin, NVIDIA's action); how recent an Xid must be to
matter, and what status it gets, is the ``gpu`` check's judgement (``ddpdoctor.checks.gpu``).
"""

from __future__ import annotations

from dataclasses import dataclass

APPLICATION = "application"
HARDWARE = "hardware"
DRIVER = "driver"
UNKNOWN = "unknown"

_RESET = "reset the GPU (nvidia-smi -r -i <index>, with no process on it) or reboot the node"
_DRAIN = "drain the node"
_RMA = "if it comes back after the reset, have the GPU replaced (RMA)"
_APP = "nothing to do for the GPU: the program that ran on it faulted (see its own log)"


@dataclass(frozen=True)
class XidInfo:
    """One catalog entry: what the Xid says, whose fault it usually is, and NVIDIA's action."""

    xid: int
    meaning: str
    origin: str  # APPLICATION, HARDWARE, DRIVER or UNKNOWN
    action: str

    @property
    def application(self) -> bool:
        return self.origin == APPLICATION


_ENTRIES = (
    XidInfo(8, "GPU stopped processing: a channel timed out", APPLICATION,
            "restart the application; if it repeats with healthy code, " + _RESET),
    XidInfo(13, "graphics engine exception: an out-of-range access in a kernel, e.g. a device-side assert",
            APPLICATION, _APP + "; CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer finds the kernel"),
    XidInfo(31, "GPU memory page fault: a kernel used an illegal address", APPLICATION,
            _APP + "; CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer finds the kernel"),
    XidInfo(43, "GPU stopped processing: the driver reset a channel after an application fault", APPLICATION,
            _APP),
    XidInfo(45, "preemptive cleanup: a process's channels removed as it was killed or after an earlier Xid",
            APPLICATION, _APP + "; if the line names an earlier Xid, that one is the cause"),
    XidInfo(109, "context switch timeout", APPLICATION, "restart the application; if it repeats, " + _RESET),
    XidInfo(48, "double-bit ECC error: uncorrectable memory error", HARDWARE, f"{_DRAIN}, {_RESET}; {_RMA}"),
    XidInfo(61, "internal micro-controller breakpoint/warning", DRIVER, f"{_DRAIN}, {_RESET}; {_RMA}"),
    XidInfo(62, "internal micro-controller halt", DRIVER, f"{_DRAIN}, {_RESET}; {_RMA}"),
    XidInfo(63, "ECC page retirement or row remapping recorded, in effect after the next GPU reset", HARDWARE,
            f"{_RESET} when it is idle, so the remap takes effect; {_RMA.replace('after the reset', 'often')}"),
    XidInfo(64, "ECC page retirement or row remapping failed", HARDWARE, f"{_DRAIN}, {_RESET}; {_RMA}"),
    XidInfo(74, "NVLink error", HARDWARE, f"{_DRAIN}, check nvidia-smi nvlink -e, {_RESET}; {_RMA}"),
    XidInfo(79, "GPU has fallen off the bus", HARDWARE,
            f"{_DRAIN} and reboot it (the GPU answers nothing until then); {_RMA}"),
    XidInfo(92, "high single-bit ECC error rate", HARDWARE, f"watch the GPU's ECC counters (nvidia-smi -q -d ECC); "
            f"{_RMA.replace('after the reset', 'again')}"),
    XidInfo(94, "contained ECC error: the affected application was stopped", HARDWARE,
            f"restart the application; {_RESET} when convenient; {_RMA}"),
    XidInfo(95, "uncontained ECC error", HARDWARE, f"{_DRAIN}, {_RESET}; {_RMA}"),
    XidInfo(119, "GSP firmware RPC timeout", DRIVER, f"{_DRAIN}, {_RESET}; {_RMA}"),
    XidInfo(120, "GSP firmware error", DRIVER, f"{_DRAIN}, {_RESET}; {_RMA}"),
    XidInfo(140, "unrecovered ECC error", HARDWARE, f"{_DRAIN}, {_RESET}; {_RMA}"),
    XidInfo(144, "NVLink SAW error", HARDWARE, f"{_DRAIN}, check nvidia-smi nvlink -e, {_RESET}; {_RMA}"),
    XidInfo(145, "NVLink RLW error", HARDWARE, f"{_DRAIN}, check nvidia-smi nvlink -e, {_RESET}; {_RMA}"),
    XidInfo(149, "NVLink NETIR error", HARDWARE, f"{_DRAIN}, check nvidia-smi nvlink -e, {_RESET}; {_RMA}"),
    XidInfo(154, "GPU recovery action changed: the driver asks for a reset or a reboot", DRIVER,
            f"{_DRAIN} and do what nvidia-smi -q reports under 'GPU Recovery Action' (reset or reboot)"),
)
CATALOG: dict[int, XidInfo] = {entry.xid: entry for entry in _ENTRIES}


def xid_info(xid: int) -> XidInfo:
    """The catalog entry for ``xid``; an Xid not listed here is of unknown origin."""
    return CATALOG.get(xid) or XidInfo(xid, "see NVIDIA's Xid catalog", UNKNOWN,
                                       "look the Xid up in NVIDIA's Xid catalog "
                                       "(docs.nvidia.com/deploy/xid-errors)")
