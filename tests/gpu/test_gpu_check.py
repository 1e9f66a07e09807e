"""`ddpdoctor check` on a real GPU, as a user runs it: the README's command, two ranks on one GPU, a wrong
NCCL_SOCKET_IFNAME. Each asserts what is true of any healthy host (an old application Xid in the kernel
log, another process on the GPU or a NUMA note may add a warning; nothing may fail that the test did not
break), and that ddpdoctor itself makes PyTorch print no warning.

Needs one NVIDIA GPU (``requires_cuda``); nothing here is faked.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from ddpdoctor.runtime.device import device_guess_lines
from tests.support import PG_NOT_DESTROYED, clean_env, run_cli

pytestmark = pytest.mark.requires_cuda

ONE_GPU = {"CUDA_VISIBLE_DEVICES": "0"}
# A PyTorch/c10 warning line: "[rank0]:[W515 13:17:30.58 ProcessGroupNCCL.cpp:5188] ...", "[W515 ...",
# or a Python warning ("UserWarning: ...", "FutureWarning: ...").
WARNING_LINE = re.compile(r"^(\[rank\d+\]:)?\[W\d{3,4} |Warning: ")


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if WARNING_LINE.search(line)] + device_guess_lines(text)


def _roots(doc: dict[str, Any], status: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["status"] == status and f["caused_by"] is None]


def _one_root(doc: dict[str, Any], status: str) -> dict[str, Any]:
    """The one unfolded finding of ``status``; else the assertion names every one (check and summary)."""
    roots = _roots(doc, status)
    assert len(roots) == 1, [(f["check"], f["summary"]) for f in roots]
    return roots[0]


def test_check_with_no_arguments_passes_and_makes_pytorch_warn_about_nothing() -> None:
    res = run_cli(["check"], env=clean_env(ONE_GPU), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "backend nccl" in res.stdout.splitlines()[0], res.stdout
    result = res.stdout.rstrip().splitlines()[-1]
    assert result.startswith(("Result: PASS", "Result: WARN")), res.stdout
    assert _warnings(res.stdout + res.stderr) == [], res.stderr
    assert "nothing crosses a link with one rank" in " ".join(res.stdout.split())


def test_check_one_rank_json_names_the_real_gpu_and_fails_nothing() -> None:
    import torch

    res = run_cli(["check", "--backend", "nccl", "--nproc", "1", "--timeout", "60", "--json", "-"],
                  env=clean_env(ONE_GPU), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["backend"] == "nccl" and doc["world_size"] == 1 and doc["status"] in ("pass", "warn")
    assert not _roots(doc, "fail") and not _roots(doc, "error"), doc["findings"]
    gpu = [f for f in doc["findings"] if f["check"] == "gpu"]
    named = [f for f in gpu if torch.cuda.get_device_name(0) in f["summary"]]
    # The all-good line when nothing warns; else every warning is about the host, not the rank's GPU mapping.
    assert named or all(f["details"].get("kind") not in ("duplicate_gpu", "wrong_device") for f in gpu), gpu
    assert all("driver None" not in f["summary"] for f in gpu)  # NVML answered: the driver version is real
    assert [f["status"] for f in doc["findings"] if f["check"] == "bandwidth"] == ["skip"]
    assert doc["wall_s"] >= doc["elapsed_s"] > 0


def test_two_ranks_on_one_gpu_are_one_fail_with_nccls_refusal_folded_under_it() -> None:
    res = run_cli(["check", "--backend", "nccl", "--nproc", "2", "--timeout", "60", "--json", "-"],
                  env=clean_env(ONE_GPU), timeout=400)
    assert res.returncode == 1, res.stdout + res.stderr
    # NCCL's eager connect failed inside init_process_group: the half-made group is aborted, not left to
    # its destructor's "destroy_process_group() was not called" (issue 35).
    assert PG_NOT_DESTROYED not in res.stderr, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    dup = _one_root(doc, "fail")
    assert dup["check"] == "gpu" and dup["details"]["kind"] == "duplicate_gpu" and dup["ranks"] == [0, 1]
    assert "Duplicate GPU detected" in dup["summary"] and "set_device" in dup["remedy"]
    folded = [f for f in doc["findings"] if f["caused_by"] is not None]
    assert any(f["check"] == "connectivity" and f["status"] == "fail" for f in folded), doc["findings"]
    # Everything else is under the duplicate GPU; only a copy measured while another job's process was on the
    # GPU too (the suite runs its functional steps side by side) may sit under that process's warning.
    assert all(f["caused_by"]["check"] == "gpu" and (f["caused_by"]["rule"] == "duplicate_gpu" or (
        f["caused_by"]["rule"] == "other_processes" and f["check"] in ("memory_bandwidth", "pcie_bandwidth")))
        for f in folded), folded


def test_nccl_socket_ifname_ib0_is_one_root_cause() -> None:
    import psutil

    if "ib0" in psutil.net_if_addrs():
        pytest.skip("this host has an ib0: NCCL_SOCKET_IFNAME=ib0 is not wrong here")
    res = run_cli(["check", "--timeout", "60", "--json", "-"],
                  env=clean_env({**ONE_GPU, "NCCL_SOCKET_IFNAME": "ib0"}), timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert PG_NOT_DESTROYED not in res.stderr, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    root = _one_root(doc, "fail")
    assert root["check"] == "env" and root["details"]["variable"] == "NCCL_SOCKET_IFNAME", doc["findings"]
    folded = {f["check"] for f in doc["findings"] if f["caused_by"] is not None}
    assert "gpu" in folded, doc["findings"]  # the gpu preflight's reading of the same variable
    # NCCL's failed bootstrap (init_process_group) is under it too, not a failure of its own.
    assert all(f["caused_by"] is not None for f in doc["findings"] if f["check"] == "connectivity"
               and f["status"] == "fail"), doc["findings"]
    shown = run_cli(["check", "--timeout", "60"], env=clean_env({**ONE_GPU, "NCCL_SOCKET_IFNAME": "ib0"}),
                    timeout=300)
    text = shown.stdout
    assert PG_NOT_DESTROYED not in shown.stderr, shown.stderr[-3000:]
    # One host, one list of interfaces: the env finding's "(have: ...)" is the gpu finding's "(interfaces: ...)".
    have = re.search(r"\(have: ([^)]*)\)", json.dumps(doc))
    listed = re.search(r"\(interfaces: ([^)]*)\)", json.dumps(doc))
    assert have and listed and have.group(1) == listed.group(1), doc["findings"]
    todo = text.split("What to do:")[1].split("\n\n")[0].strip().splitlines()
    # One remedy for the variable (the host may add its own warnings' remedies, e.g. an old hardware Xid).
    about_it = [line for line in todo if "NCCL_SOCKET_IFNAME" in line]
    assert len(about_it) == 1 and "[env]" in about_it[0], text
    assert not any("[connectivity]" in line for line in todo), text
