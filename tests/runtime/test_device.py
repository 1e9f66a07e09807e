"""Every NCCL rank is bound to its GPU, so PyTorch never guesses a device (and never warns that it did).

The warnings come from a RECORDED REAL OUTPUT (``tests/data/pytorch_output/nccl_device_guess.log``, source
in its SOURCES.md): no GPU here can print them. The binding arguments are built against the installed
torch's real ``init_process_group`` and ``barrier``; torch before 2.3, whose ``init_process_group`` has no
``device_id``, is stood in for by a function with its signature (labelled below). ``tests/gpu`` checks the
same on a real NCCL run.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

from ddpdoctor.runtime.device import (
    barrier_kwargs,
    device_guess_lines,
    init_device_kwargs,
    takes_device_id,
)
from tests.runtime.conftest import HealthyRun
from tests.support import REPO

RECORDED = REPO / "tests" / "data" / "pytorch_output" / "nccl_device_guess.log"


def test_the_guess_warnings_of_a_real_unbound_nccl_run_are_recognised() -> None:
    lines = device_guess_lines(RECORDED.read_text())
    assert len(lines) == 2
    assert "barrier(): using the device under current context" in lines[0]
    assert "ProcessGroupNCCL.cpp:5188] Guessing device ID based on global rank" in lines[1]
    assert device_guess_lines("NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\nrank 0 ok\n") == []


def test_nccl_ranks_pass_their_device_to_the_installed_init_process_group() -> None:
    assert takes_device_id(dist.init_process_group)  # torch 2.13 here: asked of the signature
    assert init_device_kwargs("nccl", "cuda:3") == {"device_id": torch.device("cuda", 3)}
    assert barrier_kwargs("nccl", "cuda:3") == {"device_ids": [3]}
    assert "device_ids" in inspect.signature(dist.barrier).parameters  # what barrier_kwargs passes exists


def test_an_init_process_group_without_device_id_gets_none() -> None:
    # STAND-IN for torch < 2.3: init_process_group's signature before device_id was added.
    def old_init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,  # type: ignore[no-untyped-def]
                               store=None, group_name="", pg_options=None):
        raise AssertionError("never called")

    assert not takes_device_id(old_init_process_group)
    assert init_device_kwargs("nccl", "cuda:0", init_fn=old_init_process_group) == {}


def test_gloo_and_cpu_ranks_bind_nothing() -> None:
    for backend, device in (("gloo", "cpu"), ("gloo", "cuda:0"), ("nccl", "cpu")):
        assert init_device_kwargs(backend, device) == {} and barrier_kwargs(backend, device) == {}


def test_a_real_check_run_prints_no_pytorch_warning(healthy_check: HealthyRun) -> None:
    assert healthy_check.returncode == 0, healthy_check.stdout + healthy_check.stderr
    assert healthy_check.stdout.rstrip().splitlines()[-1].startswith("Result: PASS")
    assert device_guess_lines(healthy_check.stdout + healthy_check.stderr) == []
    assert "Warning" not in healthy_check.stderr, healthy_check.stderr
