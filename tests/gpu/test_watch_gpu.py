"""`watch` on a real GPU (issue 25): the hangs as they look on NCCL, and a healthy NCCL job.

Needs one NVIDIA GPU (``requires_cuda``); nothing is faked: NCCL, the CUDA kernel that never ends, the
DataLoader worker that deadlocks. One rank each (the GPU machines have one GPU). Run by
``scripts/gpu-tests.sh`` in its watch section, within 4 minutes in total.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.support import TARGETS
from tests.support import clean_env, run_cli
from tests.watch.test_watch import leftovers

pytestmark = pytest.mark.requires_cuda
HANG_TIMEOUT = 15


def _line(target: str, marker: str) -> str:
    lines = (TARGETS / target).read_text().splitlines()
    return f"{target}:{max(i for i, line in enumerate(lines, start=1) if marker in line)}"


def _watch(tmp_path: Path, target: str, *args: str, hang_timeout: float = HANG_TIMEOUT) -> tuple[Any, dict[str, Any]]:
    report = tmp_path / "watch.json"
    res = run_cli(["watch", "--nproc", "1", "--hang-timeout", str(hang_timeout), "--shutdown-timeout", "5",
                   "--json", str(report), "--evidence", str(tmp_path / "evidence"), target, *args],
                  env=clean_env({"CUDA_VISIBLE_DEVICES": "0"}), timeout=200, cwd=TARGETS)
    assert report.exists(), res.stderr[-3000:]
    # This test's processes only (its tag, tests/conftest.py): the GPU suite runs test_gpu_explain_fr.py's job of
    # the same target beside it (the first H200 run read that job's rank as a survivor here).
    survivors = leftovers(target)
    assert survivors == [], f"processes of the job survived watch: {survivors}"
    return res, json.loads(report.read_text())


def _why(res: Any, tmp_path: Path) -> str:
    """What a failed assertion shows: watch's own words, then the rank's output from the evidence folder (the
    second H200 run read one job as a crash, and its assertion had kept neither)."""
    parts = [f"watch's stderr (tail):\n{res.stderr[-3000:]}"]
    for path in sorted((tmp_path / "evidence").glob("output_rank_*.txt")):
        parts.append(f"{path.name} (tail):\n{path.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


def test_a_kernel_that_never_ends_is_a_hang_waiting_for_the_gpu_with_the_all_reduce_pending(tmp_path: Path) -> None:
    res, doc = _watch(tmp_path, "nccl_kernel_hang.py")
    assert res.returncode == 1, _why(res, tmp_path)
    assert doc["status"] == "hang" and doc["stall"] is False, _why(res, tmp_path)
    assert doc["stalled_s"] < HANG_TIMEOUT + 10
    (rank,) = doc["ranks"]
    wait = rank["wait"]
    assert (wait["kind"], wait["site"]) == ("gpu", _line("nccl_kernel_hang.py", "torch.cuda.synchronize()  # HANG")), wait
    pending = {(p["op"], p["site"]) for p in wait["pending"] if p["on"] == "gpu"}
    assert ("all_reduce", _line("nccl_kernel_hang.py", "dist.all_reduce(logged)")) in pending, wait["pending"]
    assert "waiting for the GPU at nccl_kernel_hang.py" in res.stderr and "still pending" in res.stderr
    names = {p.name for p in (tmp_path / "evidence").iterdir()}
    assert {"verdict.json", "report.txt", "stack_rank_0.txt", "output_rank_0.txt"} <= names


def test_a_deadlocked_dataloader_worker_on_a_gpu_job_is_named_with_its_stack(tmp_path: Path) -> None:
    res, doc = _watch(tmp_path, "nccl_dataloader_deadlock.py")
    assert res.returncode == 1, _why(res, tmp_path)
    assert doc["status"] == "hang" and doc["stalled_s"] < HANG_TIMEOUT + 10, _why(res, tmp_path)
    wait = doc["ranks"][0]["wait"]
    assert wait["kind"] == "dataloader", wait
    assert wait["worker"]["stack"][-1].startswith(_line("nccl_dataloader_deadlock.py", "_LOCK.acquire()  # DEADLOCK"))


def test_a_healthy_nccl_ddp_job_is_not_a_hang(tmp_path: Path) -> None:
    """Its host thread races ahead of the GPU and NCCL's all_reduces complete later, with no host thread
    ever inside a collective: completions, tracked with CUDA events, are the progress (20000 small steps:
    about as long as the hang timeout, or longer)."""
    res, doc = _watch(tmp_path, str(TARGETS / "nccl_ddp_train.py"), "--steps", "20000")
    assert res.returncode == 0, _why(res, tmp_path)
    assert doc["status"] == "ok" and doc["evidence"] is None, _why(res, tmp_path)
    assert "HANG" not in res.stderr and "STALL" not in res.stderr
    assert doc["ranks"][0]["inflight"] == 0  # every tracked completion arrived
