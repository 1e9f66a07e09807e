"""On a real NVIDIA GPU: the gpu check's facts come from NVML and CUDA, and a shared GPU is named.

Every test here needs a GPU (``requires_cuda``: skipped with that reason elsewhere) and fakes nothing. They
assert what is true of any healthy host, not of a freshly booted one: an old application Xid in the kernel
log (an earlier job's device-side assert), another process on the GPU or a NUMA note may add a warning or a
note, never a failure.
"""

from __future__ import annotations

import pytest

from ddpdoctor.checks import gpu as gpu_check
from ddpdoctor.env import collect_host_gpu_facts
from ddpdoctor.findings import FAIL, PASS
from tests.checks.test_gpu import make_ctx

# Findings about how ranks map to GPUs: none may appear for one rank on its own GPU.
MAPPING = ("duplicate_gpu", "wrong_device", "more_ranks_than_gpus", "ranks_without_gpu")


@pytest.mark.requires_cuda
def test_real_gpu_rank_facts_match_nvml_and_pass() -> None:
    findings = gpu_check.CHECK.run(make_ctx(device="cuda:0", backend="nccl"))
    assert [f.status for f in findings] == [PASS]
    facts = findings[0].details["facts"]
    assert facts["uuid"].startswith(("GPU-", "MIG-"))
    assert facts["gpu"] is not None and facts["gpu"]["uuid"] == facts["uuid"]
    merged = gpu_check.analyze({0: facts})
    assert not [f for f in merged if f.status == FAIL], merged
    assert not [f for f in merged if f.kind in MAPPING], merged
    # Every Xid of an earlier application (what the suite's own device-side assert leaves) is a note.
    assert all(f.status == PASS for f in merged if f.kind == "xid_application"), merged


@pytest.mark.requires_cuda
def test_real_gpu_two_ranks_on_one_device_is_duplicate() -> None:
    facts = gpu_check.CHECK.run(make_ctx(device="cuda:0", backend="nccl"))[0].details["facts"]
    twin = dict(facts, local_rank=1, pid=facts["pid"] + 1)
    found = gpu_check.analyze({0: facts, 1: twin})
    assert any(f.status == FAIL and f.ranks == [0, 1] and "share one GPU" in f.summary for f in found)


@pytest.mark.requires_cuda
def test_real_nvml_sees_the_gpus() -> None:
    import torch

    facts = collect_host_gpu_facts()
    assert facts["available"] is True, facts["reason"]
    assert len(facts["gpus"]) >= torch.cuda.device_count()
    for gpu in facts["gpus"]:
        assert str(gpu["uuid"]).startswith(("GPU-", "MIG-"))
        assert gpu["memory_total_bytes"] > 0
        assert gpu["pci_bus_id"].count(":") == 2


@pytest.mark.requires_cuda
def test_real_nvml_health_fields_have_real_answers() -> None:
    """Every health field the gpu check judges is answered (a value) or honestly unsupported (None)."""
    gpu = collect_host_gpu_facts()["gpus"][0]
    for key in ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected", "retired_pages", "clocks_sm_mhz"):
        assert gpu[key] is None or isinstance(gpu[key], int), (key, gpu[key], gpu.get("query_errors"))
    assert gpu["pcie_link_gen_max"] >= 1 and gpu["pcie_link_width_max"] >= 1, gpu.get("query_errors")
    assert 1 <= gpu["pcie_link_width"] <= gpu["pcie_link_width_max"]
    assert isinstance(gpu["throttle_reasons"], list), gpu.get("query_errors")
    assert gpu["clocks_max_sm_mhz"] > 0
    if gpu["nvlink_total"] is not None:  # SXM parts: links counted; PCIe cards: None
        assert 0 <= gpu["nvlink_up"] <= gpu["nvlink_total"]
        assert gpu["nvlink_errors"] is None or all(v >= 0 for v in gpu["nvlink_errors"].values())


@pytest.mark.requires_cuda
def test_real_preflight_around_the_gpu() -> None:
    """Kernel log, NUMA node of the real GPU's PCI device, NICs: read on the GPU host."""
    import os

    facts = gpu_check.CHECK.run(make_ctx(device="cuda:0", backend="nccl"))[0].details["facts"]
    pre = facts["preflight"]
    assert pre["bus_id"] == facts["gpu"]["pci_bus_id"]
    assert pre["kernel_log_source"] or pre["kernel_log_reason"]
    assert pre["gpu_numa_node"] is None or pre["gpu_numa_node"] >= 0
    assert [d["name"] for d in pre["net"]] == sorted(os.listdir("/sys/class/net"))
    assert all(isinstance(e["xid"], int) for e in pre["xid_events"])
