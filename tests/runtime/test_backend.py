"""Each rank's device comes from the launcher's local rank (srun and mpirun do not set LOCAL_RANK).

There is no GPU on the machines these tests run on, so torch.cuda is replaced by a test double that
reports 8 GPUs and records set_device; it stands in for hardware that cannot exist here.
"""

from __future__ import annotations

import pytest
import torch

from ddpdoctor.runtime.backend import resolve_backend
from ddpdoctor.runtime.launcher import detect


class FakeCuda:
    """Test double for torch.cuda on an 8-GPU node."""

    def __init__(self) -> None:
        self.current = 0

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 8

    def set_device(self, index: int) -> None:
        self.current = index

    def current_device(self) -> int:
        return self.current


@pytest.fixture
def eight_gpus(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    for name in ("is_available", "device_count", "set_device", "current_device"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return fake


@pytest.mark.parametrize("env", [
    {"SLURM_PROCID": "11", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3", "SLURM_NODEID": "1", "SLURM_STEP_ID": "0",
     "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "8(x2)"},
    {"OMPI_COMM_WORLD_RANK": "11", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
     "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "MASTER_ADDR": "n1"},
])
def test_srun_and_mpirun_ranks_get_their_own_gpu(eight_gpus: FakeCuda, env: dict[str, str]) -> None:
    info = detect(env)
    assert resolve_backend("auto", info.local_rank) == ("nccl", "cuda:3")


def test_gloo_stays_on_cpu_even_with_gpus(eight_gpus: FakeCuda) -> None:
    assert resolve_backend("gloo", 5) == ("gloo", "cpu")


def test_without_gpus_auto_is_gloo_on_cpu() -> None:
    # The real torch of this machine: a CPU build.
    assert resolve_backend("auto", 0) == ("gloo", "cpu")
