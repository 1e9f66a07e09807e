"""ddpdoctor.env.nvml: the real no-driver path on this machine, and every query against a TEST DOUBLE of NVML.

This machine has no NVIDIA GPU and no driver, so the only way to exercise the per-GPU queries is
:class:`FakeNvml` below: a TEST DOUBLE standing in for GPU hardware that cannot exist here. It has the
same function names and signatures as ``pynvml`` (nvidia-ml-py) and raises pynvml's real exception
classes (``NVMLError_NotSupported`` ...), so the code under test cannot tell it from the real module.
Real-hardware tests live in ``tests/gpu/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pynvml
import pytest

from ddpdoctor.env.nvml import collect_host_gpu_facts, decode_throttle_reasons

NOT_SUPPORTED = pynvml.NVMLError_NotSupported


@dataclass
class _Pci:
    busId: bytes  # pynvml's field name


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int | None  # pynvml's field name


def healthy_gpu(index: int, **overrides: Any) -> dict[str, Any]:
    """What an idle, healthy 8-NVLink datacenter GPU answers (TEST DOUBLE data, not a real device)."""
    spec: dict[str, Any] = {
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": f"GPU-00000000-0000-0000-0000-{index:012d}",
        "bus_id": f"00000000:{0x10 + index:02X}:00.0".encode(),
        "memory": (85899345920, 524288000),
        "ecc": {0: 0, 1: 0},  # counter type (volatile, aggregate) -> uncorrected count
        "retired_pages": {0: [], 1: []},
        "remapped_rows": (0, 0, 0, 0),
        "pcie": (4, 4, 16, 16),  # gen, gen max, width, width max
        "nvlinks": [1] * 12,
        "nvlink_errors": {},  # (link, counter) -> count; counters: 0 replay, 1 recovery, 2 CRC flit, 3 CRC data
        "clocks": (1410, 1410),
        "reasons": 0x1,  # gpu_idle
        "procs": [],
    }
    spec.update(overrides)
    return spec


class FakeNvml:
    """TEST DOUBLE of the ``pynvml`` module for GPUs that cannot exist on this machine.

    A spec value that is an exception instance is raised instead of returned, like NVML does for a query a
    GPU does not support.
    """

    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED

    def __init__(self, gpus: list[dict[str, Any]], *, init_error: BaseException | None = None,
                 driver: str = "550.54.15", cuda: int = 12040) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.inits = 0
        self.shutdowns = 0

    # -- library -------------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self._answer(self.gpus[index], "handle", self.gpus[index])

    # -- per device ----------------------------------------------------------------------------------
    @staticmethod
    def _answer(gpu: Mapping[str, Any], key: str, default: Any = None) -> Any:
        value = gpu.get(key, default)
        if isinstance(value, BaseException):
            raise value
        return value

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> str:
        return str(self._answer(h, "name"))

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> str:
        return str(self._answer(h, "uuid"))

    def nvmlDeviceGetPciInfo(self, h: dict[str, Any]) -> _Pci:
        return _Pci(self._answer(h, "bus_id"))

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> _Memory:
        total, used = self._answer(h, "memory")
        return _Memory(total, total - used, used)

    def nvmlDeviceGetTotalEccErrors(self, h: dict[str, Any], error_type: int, counter: int) -> int:
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return int(self._answer(h, "ecc")[counter])

    def nvmlDeviceGetRetiredPages(self, h: dict[str, Any], cause: int) -> list[int]:
        return list(self._answer(h, "retired_pages")[cause])

    def nvmlDeviceGetRemappedRows(self, h: dict[str, Any]) -> tuple[int, int, int, int]:
        return tuple(self._answer(h, "remapped_rows"))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: dict[str, Any]) -> int:
        return int(self._answer(h, "pcie")[0])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: dict[str, Any]) -> int:
        return int(self._answer(h, "pcie")[1])

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: dict[str, Any]) -> int:
        return int(self._answer(h, "pcie")[2])

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: dict[str, Any]) -> int:
        return int(self._answer(h, "pcie")[3])

    def nvmlDeviceGetNvLinkState(self, h: dict[str, Any], link: int) -> int:
        links = self._answer(h, "nvlinks")
        if link >= len(links):
            # What NVML answers for a link index the GPU does not have.
            raise pynvml.NVMLError_InvalidArgument()
        return int(links[link])

    def nvmlDeviceGetNvLinkErrorCounter(self, h: dict[str, Any], link: int, counter: int) -> int:
        return int(self._answer(h, "nvlink_errors").get((link, counter), 0))

    def nvmlDeviceGetClockInfo(self, h: dict[str, Any], clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return int(self._answer(h, "clocks")[0])

    def nvmlDeviceGetMaxClockInfo(self, h: dict[str, Any], clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return int(self._answer(h, "clocks")[1])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: dict[str, Any]) -> int:
        return int(self._answer(h, "reasons"))

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[_Proc]:
        return [_Proc(pid, mem) for pid, mem in self._answer(h, "procs")]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: dict[str, Any]) -> list[_Proc]:
        return []


# -- the real thing, on this machine ---------------------------------------------------------------

def test_no_driver_here_reports_unavailable_with_reason_not_exception() -> None:
    """On this GPU-less machine the real pynvml cannot load libnvidia-ml: a reason, never a traceback."""
    facts = collect_host_gpu_facts()
    assert facts["available"] is False
    assert facts["reason_code"] == "library_not_found"
    assert "libnvidia-ml.so.1 not found" in facts["reason"]
    assert facts["gpus"] == [] and facts["driver_version"] is None


# -- TEST DOUBLE of NVML (no GPU here) --------------------------------------------------------------

def test_double_healthy_gpus_every_field_filled_and_init_shutdown_paired() -> None:
    nvml = FakeNvml([healthy_gpu(0), healthy_gpu(1, procs=[(4242, 2 * 2**30)])])
    facts = collect_host_gpu_facts(nvml)
    assert facts["available"] is True and facts["reason"] == ""
    assert facts["driver_version"] == "550.54.15"
    assert facts["cuda_driver_version"] == "12.4"
    assert nvml.inits == 1 and nvml.shutdowns == 1
    gpu0, gpu1 = facts["gpus"]
    assert gpu0["index"] == 0 and gpu0["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu0["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert gpu0["pci_bus_id"] == "00000000:10:00.0"  # bytes from ctypes decoded like nvidia-smi prints
    assert gpu0["memory_total_bytes"] == 85899345920 and gpu0["memory_used_bytes"] == 524288000
    assert gpu0["ecc_volatile_uncorrected"] == 0 and gpu0["ecc_aggregate_uncorrected"] == 0
    assert gpu0["retired_pages"] == 0
    assert (gpu0["pcie_link_gen"], gpu0["pcie_link_gen_max"]) == (4, 4)
    assert (gpu0["pcie_link_width"], gpu0["pcie_link_width_max"]) == (16, 16)
    assert (gpu0["nvlink_up"], gpu0["nvlink_total"]) == (12, 12)
    assert (gpu0["clocks_sm_mhz"], gpu0["clocks_max_sm_mhz"]) == (1410, 1410)
    assert gpu0["throttle_reasons"] == ["gpu_idle"]
    assert gpu0["processes"] == []
    assert "query_errors" not in gpu0
    assert gpu1["processes"] == [{"pid": 4242, "used_memory_bytes": 2 * 2**30}]


def test_double_consumer_pcie_card_unsupported_queries_become_none() -> None:
    """A GeForce-style card: no ECC, no NVLink, no page retirement -> None, the rest still answered."""
    card = healthy_gpu(0, name="NVIDIA GeForce RTX 4090", ecc=NOT_SUPPORTED(), nvlinks=NOT_SUPPORTED(),
                       retired_pages=NOT_SUPPORTED(), remapped_rows=NOT_SUPPORTED())
    facts = collect_host_gpu_facts(FakeNvml([card]))
    gpu = facts["gpus"][0]
    assert gpu["name"] == "NVIDIA GeForce RTX 4090"
    assert gpu["ecc_volatile_uncorrected"] is None and gpu["ecc_aggregate_uncorrected"] is None
    assert gpu["retired_pages"] is None and gpu["row_remap_pending"] is None
    assert gpu["nvlink_up"] is None and gpu["nvlink_total"] is None
    assert gpu["pcie_link_width"] == 16 and gpu["memory_total_bytes"] == 85899345920
    assert gpu["query_errors"]["ecc_volatile_uncorrected"] == "Not Supported"


def test_double_degraded_gpu_facts_are_reported() -> None:
    sick = healthy_gpu(0, ecc={0: 3, 1: 7}, retired_pages={0: [0x1000], 1: [0x2000, 0x3000]},
                       remapped_rows=(0, 2, 1, 0), pcie=(3, 4, 8, 16), nvlinks=[1] * 10 + [0, 0],
                       clocks=(900, 1410), reasons=0x8 | 0x40)
    gpu = collect_host_gpu_facts(FakeNvml([sick]))["gpus"][0]
    assert gpu["ecc_volatile_uncorrected"] == 3 and gpu["ecc_aggregate_uncorrected"] == 7
    assert gpu["retired_pages"] == 3
    assert gpu["row_remap_pending"] is True and gpu["row_remap_failure"] is False
    assert (gpu["pcie_link_gen"], gpu["pcie_link_width"]) == (3, 8)
    assert (gpu["nvlink_up"], gpu["nvlink_total"]) == (10, 12)
    assert gpu["throttle_reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]


def test_double_lost_gpu_keeps_the_others() -> None:
    """'GPU is lost' (Xid 79) on one handle: that entry carries the error, the other GPU is intact."""
    nvml = FakeNvml([healthy_gpu(0, handle=pynvml.NVMLError_GpuIsLost()), healthy_gpu(1)])
    facts = collect_host_gpu_facts(nvml)
    assert facts["gpus"][0] == {"index": 0, "error": "GPU is lost"}
    assert facts["gpus"][1]["uuid"].endswith("01")
    assert nvml.shutdowns == 1


@pytest.mark.parametrize(("error", "code", "text"), [
    (pynvml.NVMLError_DriverNotLoaded(), "driver_not_loaded", "kernel driver is not loaded"),
    (pynvml.NVMLError_LibRmVersionMismatch(), "version_mismatch", "Driver/library version mismatch"),
    (pynvml.NVMLError_LibraryNotFound(), "library_not_found", "libnvidia-ml.so.1 not found"),
    (pynvml.NVMLError_Unknown(), "error", "nvmlInit failed: Unknown Error"),
])
def test_double_init_failures_give_the_reason(error: BaseException, code: str, text: str) -> None:
    nvml = FakeNvml([healthy_gpu(0)], init_error=error)
    facts = collect_host_gpu_facts(nvml)
    assert facts["available"] is False and facts["reason_code"] == code
    assert text in facts["reason"]
    assert nvml.shutdowns == 0  # no shutdown without a successful init


def test_double_driver_without_gpus() -> None:
    nvml = FakeNvml([])
    facts = collect_host_gpu_facts(nvml)
    assert facts["available"] is False and facts["reason_code"] == "no_gpu"
    assert "sees no GPU" in facts["reason"] and facts["driver_version"] == "550.54.15"
    assert nvml.inits == nvml.shutdowns == 1


def test_double_old_driver_without_clocks_event_reasons_uses_throttle_reasons() -> None:
    """Drivers before the 'ClocksEvent' rename only have the deprecated ClocksThrottleReasons call."""

    class OldDriver(FakeNvml):  # TEST DOUBLE variant
        def nvmlDeviceGetCurrentClocksEventReasons(self, h: dict[str, Any]) -> int:
            raise pynvml.NVMLError_FunctionNotFound()

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: dict[str, Any]) -> int:
            return 0x20

    gpu = collect_host_gpu_facts(OldDriver([healthy_gpu(0)]))["gpus"][0]
    assert gpu["throttle_reasons"] == ["sw_thermal_slowdown"]


def test_decode_throttle_reasons_names_unknown_bits() -> None:
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x4 | 0x1000) == ["sw_power_cap", "0x1000"]


def test_nvlink_error_counters_are_summed_over_links() -> None:
    spec = healthy_gpu(0, nvlink_errors={(0, 1): 2, (5, 1): 1, (3, 0): 40})
    gpu = collect_host_gpu_facts(FakeNvml([spec]))["gpus"][0]
    assert gpu["nvlink_errors"] == {"replay": 40, "recovery": 3, "crc_flit": 0, "crc_data": 0}
