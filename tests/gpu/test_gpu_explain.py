"""`explain` on the messages a real NCCL job prints when it fails (issue 26): on a GPU, torch + NCCL as installed.

The inventory's texts come from NCCL v2.28.9 and torch 2.13 (c10d's .cpp from a 2.7.0a0 copy); these tests check
that what the installed versions really print is recognised, the families named and, for template matches, the
source cited. One GPU is enough: a one-rank job with NCCL_SOCKET_IFNAME naming no interface, one with no visible
GPU, and two ranks on the same GPU. Nothing is faked; the output is what the job printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.support import TARGETS, one_rank_env
from tests.support import run_cli, torchrun_cmd

pytestmark = pytest.mark.requires_cuda


def _failing_job(tmp_path: Path, cmd: list[str], env: dict[str, str]) -> Path:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode != 0, f"the job was meant to fail:\n{proc.stdout}\n{proc.stderr}"
    log = tmp_path / "job.log"
    log.write_text(proc.stdout + proc.stderr)
    return log


def _explain(log: Path) -> list[dict]:
    res = run_cli(["explain", "--json", "-", str(log)], timeout=120)
    assert res.returncode == 1, (res.returncode, res.stdout[-2000:], res.stderr[-2000:], log.read_text()[-4000:])
    return json.loads(res.stdout)["diagnoses"]


def test_bootstrap_without_a_usable_interface(tmp_path: Path) -> None:
    env = one_rank_env({"NCCL_SOCKET_IFNAME": "ddpdoctor_no_such_if", "NCCL_DEBUG": "WARN"})
    log = _failing_job(tmp_path, [sys.executable, str(TARGETS / "nccl_init_fail.py")], env)
    diagnoses = _explain(log)
    assert diagnoses[0]["id"] == "socket-ifname", ([d["id"] for d in diagnoses], log.read_text()[-4000:])


def test_no_visible_gpu(tmp_path: Path) -> None:
    env = one_rank_env({"CUDA_VISIBLE_DEVICES": ""})
    log = _failing_job(tmp_path, [sys.executable, str(TARGETS / "nccl_init_fail.py")], env)
    diagnoses = _explain(log)
    assert diagnoses[0]["id"] == "no-gpu-visible", ([d["id"] for d in diagnoses], log.read_text()[-4000:])


def test_two_ranks_on_one_gpu(tmp_path: Path) -> None:
    env = one_rank_env({"NCCL_DEBUG": "WARN", "DDPDOCTOR_TEST_DEVICE": "0"})
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(var)
    port = env.pop("MASTER_PORT")
    cmd = [*torchrun_cmd(), "--nproc-per-node=2", f"--master-port={port}", str(TARGETS / "nccl_init_fail.py")]
    log = _failing_job(tmp_path, cmd, env)
    diagnoses = _explain(log)
    ids = [d["id"] for d in diagnoses]
    assert ids[0] == "duplicate-gpu", (ids, log.read_text()[-4000:])
    sources = [s for d in diagnoses for s in d["details"].get("template_source", [])]
    assert any("src/init.cc:" in s for s in sources), diagnoses[0]["details"]
