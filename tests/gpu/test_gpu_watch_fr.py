"""`watch` passes a healthy NCCL DDP job through, and `fr` reads a real NCCL Flight Recorder dump.

Needs one NVIDIA GPU (``requires_cuda``); nothing here is faked: the DDP job and the dump are NCCL's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.support import TARGETS, one_rank_env
from tests.support import clean_env, run_cli

pytestmark = pytest.mark.requires_cuda


def test_watch_passes_a_healthy_nccl_ddp_job_through() -> None:
    res = run_cli(["watch", "--nproc", "1", "--hang-timeout", "120", "--json", "-",
                   str(TARGETS / "nccl_ddp_train.py"), "--steps", "20"],
                  env=clean_env({"CUDA_VISIBLE_DEVICES": "0"}), timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok" and doc["world_size"] == 1
    # 20 DDP steps: every backward's gradient all_reduce and every explicit one were recorded.
    assert sum(doc["ranks"][0]["issued"].values()) >= 20, doc["ranks"][0]


def test_fr_reads_a_real_nccl_flight_recorder_dump(tmp_path: Path) -> None:
    from ddpdoctor.cli import COMMANDS

    if "fr" not in COMMANDS:
        pytest.skip("ddpdoctor fr is not part of this build")
    env = one_rank_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    made = subprocess.run([sys.executable, str(TARGETS / "nccl_fr_dump.py"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    dump = tmp_path / "nccl_trace_rank_0"
    assert dump.stat().st_size > 0
    res = run_cli(["fr", str(tmp_path), "--json", "-"], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr  # one healthy rank: nothing diverged
    doc = json.loads(res.stdout)
    assert doc["ranks"] == [0] and doc["missing_ranks"] == []
    # The target's collectives (3 all_reduces, then a broadcast) all completed: the group holds all four and
    # agrees, whichever one the report happens to name last.
    [group] = doc["groups"]
    low, high = group["window"]
    assert group["status"] != "fail" and high - low + 1 >= 4, group
