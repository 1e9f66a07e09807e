"""On a real NVIDIA GPU: the gpu check's facts come from NVML and CUDA, and a shared GPU is named.

Every test here needs a GPU (``requires_cuda``: skipped with that reason elsewhere) and fakes nothing.
"""

from __future__ import annotations

import pytest

from ddpdoctor.checks import gpu as gpu_check
from ddpdoctor.env import collect_host_gpu_facts
from ddpdoctor.findings import FAIL, PASS
from tests.checks.test_gpu import make_ctx


@pytest.mark.requires_cuda
def test_real_gpu_rank_facts_match_nvml_and_pass() -> None:
    findings = gpu_check.CHECK.run(make_ctx(device="cuda:0", backend="nccl"))
    assert [f.status for f in findings] == [PASS]
    facts = findings[0].details["facts"]
    assert facts["uuid"].startswith(("GPU-", "MIG-"))
    assert facts["gpu"] is not None and facts["gpu"]["uuid"] == facts["uuid"]
    merged = gpu_check.analyze({0: facts})
    assert merged[0].status == PASS, merged


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
