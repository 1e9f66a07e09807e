"""`ddpdoctor check` on NCCL on a real GPU: one rank passes with the GPU's real facts, two ranks on one GPU
are named before NCCL's "Duplicate GPU detected" takes the job down.

Needs one NVIDIA GPU (``requires_cuda``); nothing here is faked.
"""

from __future__ import annotations

import json

import pytest

from tests.support import clean_env, run_cli

pytestmark = pytest.mark.requires_cuda


def _gpu_findings(doc: dict) -> list[dict]:  # type: ignore[type-arg]
    return [f for f in doc["findings"] if f["check"] == "gpu"]


def test_check_nccl_one_rank_passes_with_real_gpu_facts() -> None:
    import torch

    res = run_cli(["check", "--backend", "nccl", "--nproc", "1", "--timeout", "60", "--json", "-"],
                  env=clean_env({"CUDA_VISIBLE_DEVICES": "0"}), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["backend"] == "nccl" and doc["world_size"] == 1
    gpu = _gpu_findings(doc)
    assert gpu and gpu[0]["status"] == "pass", gpu
    assert torch.cuda.get_device_name(0) in gpu[0]["summary"]
    assert "driver None" not in gpu[0]["summary"]  # NVML answered: the driver version is real
    assert all(f["status"] in ("pass", "warn", "skip") for f in doc["findings"]), doc["findings"]


def test_two_ranks_on_one_gpu_are_named_as_duplicates() -> None:
    res = run_cli(["check", "--backend", "nccl", "--nproc", "2", "--timeout", "60", "--json", "-"],
                  env=clean_env({"CUDA_VISIBLE_DEVICES": "0"}), timeout=400)
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    dup = [f for f in _gpu_findings(doc) if f["status"] == "fail" and "share one GPU" in f["summary"]]
    assert dup, _gpu_findings(doc)
    assert dup[0]["ranks"] == [0, 1]
    assert "Duplicate GPU detected" in dup[0]["summary"] and "set_device" in dup[0]["remedy"]
