"""Every rank ddpdoctor starts on NCCL is bound to its GPU: PyTorch prints no device guess (issue 29, item 1).

`check`'s own run is asserted in ``test_gpu_check.py``; here `bench`, whose ranks also time barriers, on a
real GPU. Needs one NVIDIA GPU (``requires_cuda``); nothing here is faked.
"""

from __future__ import annotations

import json

import pytest

from ddpdoctor.runtime.device import device_guess_lines
from tests.support import clean_env, run_cli

pytestmark = pytest.mark.requires_cuda


def test_bench_ranks_make_pytorch_guess_no_device() -> None:
    res = run_cli(["bench", "--backend", "nccl", "--nproc", "1", "-b", "1M", "-e", "4M", "-f", "4", "-n", "5",
                   "-w", "2", "--json", "-"], env=clean_env({"CUDA_VISIBLE_DEVICES": "0"}), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["backend"] == "nccl"
    assert device_guess_lines(res.stdout + res.stderr) == [], res.stderr
