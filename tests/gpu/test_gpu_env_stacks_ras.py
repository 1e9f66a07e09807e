"""`env` shows the real GPU; `stacks` reads a process blocked in a CUDA sync; `ras` asks a real NCCL job.

Needs one NVIDIA GPU (``requires_cuda``); nothing here is faked. The RAS test also needs NCCL >= 2.24 in
this PyTorch (it skips with the version otherwise).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.gpu.support import TARGETS, one_rank_env
from tests.support import free_port, kill_session, run_cli, started, wait_ready

pytestmark = pytest.mark.requires_cuda


def test_env_shows_the_gpu() -> None:
    import torch

    res = run_cli(["env", "--json", "-"], timeout=120)
    assert res.returncode == 0, res.stderr
    text = run_cli(["env"], timeout=120).stdout
    name = torch.cuda.get_device_name(0)
    assert name in text
    assert name in json.dumps(json.loads(res.stdout))


def test_stacks_on_a_process_blocked_in_cuda_synchronize(tmp_path: Path) -> None:
    with started([sys.executable, str(TARGETS / "cuda_sync_block.py")], tmp_path / "target.log") as proc:
        frames: list[str] = []
        for _ in range(20):  # "ready" is printed just before the call: give it a moment to enter it
            res = run_cli(["stacks", "--pid", str(proc.pid), "--json", "-"], timeout=120)
            doc = json.loads(res.stdout)
            [main] = [t for t in doc["processes"][0]["threads"] if t["main"]]
            frames = [f["function"] for f in main["frames"]]
            if "synchronize" in frames:
                break
            time.sleep(0.5)
    assert "synchronize" in frames and "wait_for_gpu" in frames, frames


def test_ras_of_a_real_nccl_job(tmp_path: Path) -> None:
    import torch

    version = torch.cuda.nccl.version()
    if tuple(version) < (2, 24, 0):
        pytest.skip(f"NCCL {version} has no RAS service (2.24 and later)")
    addr = f"127.0.0.1:{free_port()}"
    env = one_rank_env({"NCCL_RAS_ADDR": addr})
    cmd = [sys.executable, str(TARGETS / "nccl_ras_job.py")]
    log = tmp_path / "job.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True)
    try:
        wait_ready(proc, log)
        res = run_cli(["ras", "--addr", addr, "--json", "-"], timeout=120)
        text = run_cli(["ras", "--addr", addr, "--text"], timeout=120)
    finally:
        kill_session(proc)
        if proc.stdout is not None:
            proc.stdout.close()
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok" and doc["nccl_version"], doc
    assert doc["communicators"] and doc["dead_ranks"] == [] and doc["unresponsive_ranks"] == []
    assert text.returncode == 0 and "every rank answered" in text.stdout, text.stdout + text.stderr
