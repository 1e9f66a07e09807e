"""`explain` on logs this suite makes on the GPU itself, and `fr` on the watchdog's own Flight Recorder dump.

The logs are real: a one-rank NCCL job whose all_reduce the watchdog times out (and dumps), an out-of-memory
allocation, a device-side assert, and a healthy DDP run under ``NCCL_DEBUG=INFO`` -- the last must raise
no alarm. Needs one NVIDIA GPU (``requires_cuda``); nothing here is faked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.support import TARGETS, one_rank_env
from tests.support import clean_env, free_port, run_cli, torchrun_cmd

pytestmark = pytest.mark.requires_cuda


def _run(target: str, log: Path, env: dict[str, str], *args: str, timeout: float = 240) -> int:
    """Run a target with stdout and stderr in ``log`` (as a job's log file holds them); its exit code."""
    with open(log, "wb") as out:
        proc = subprocess.run([sys.executable, str(TARGETS / target), *args], stdout=out, stderr=subprocess.STDOUT,
                              env=env, timeout=timeout)
    return proc.returncode


def _torchrun(target: str, log: Path) -> int:
    """Run a target as a one-rank torchrun job (as training jobs run), its whole output in ``log``."""
    cmd = [*torchrun_cmd(), "--nproc-per-node", "1", "--master-port", str(free_port()), str(TARGETS / target)]
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=clean_env({"CUDA_VISIBLE_DEVICES": "0"}),
                              timeout=240)
    return proc.returncode


def _explain(log: Path) -> tuple[int, dict[str, Any]]:
    res = run_cli(["explain", str(log), "--json", "-"], timeout=120)
    assert res.returncode in (0, 1), res.stderr
    return res.returncode, json.loads(res.stdout)


def _ids(doc: dict[str, Any]) -> list[str]:
    return [d["id"] for d in doc["diagnoses"]]


@pytest.fixture(scope="module")
def watchdog_timeout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the job's log, the folder of its Flight Recorder dump), made once for the explain and fr tests."""
    base = tmp_path_factory.mktemp("watchdog")
    dumps = base / "dumps"
    dumps.mkdir()
    prefix = str(dumps / "nccl_trace_rank_")
    env = one_rank_env({"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "2000",
                        "TORCH_FR_DUMP_TEMP_FILE": prefix, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix})
    log = base / "train.log"
    code = _run("nccl_watchdog_timeout.py", log, env)
    assert code != 0, log.read_text(errors="replace")  # the watchdog took the process down
    return log, dumps


def test_explain_names_the_watchdog_timeout_of_a_real_nccl_job(watchdog_timeout: tuple[Path, Path]) -> None:
    log, _ = watchdog_timeout
    code, doc = _explain(log)
    assert code == 1, log.read_text(errors="replace")[-3000:]
    [timeout] = [d for d in doc["diagnoses"] if d["id"] == "nccl-timeout"]
    assert "ALLREDUCE" in timeout["details"].get("op_type", []), timeout
    assert "5000" in [str(v) for v in timeout["details"].get("timeout_ms", [])], timeout
    assert "ddpdoctor fr" in timeout["command"]


def test_fr_reads_the_watchdogs_dump_and_names_the_collective_that_never_completed(
        watchdog_timeout: tuple[Path, Path]) -> None:
    log, dumps = watchdog_timeout
    files = sorted(p.name for p in dumps.iterdir())
    assert "nccl_trace_rank_0" in files, (files, log.read_text(errors="replace")[-3000:])
    res = run_cli(["fr", str(dumps), "--json", "-"], timeout=120)
    assert res.returncode in (0, 1), res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["ranks"] == [0] and doc["missing_ranks"] == []
    [group] = doc["groups"]
    # Two all_reduces were issued; the second was still running behind the spinning kernel when dumped.
    assert group["window"][1] >= 2, group
    assert "not yet completed on rank 0" in group["note"] and "all_reduce" in group["note"], group


def test_explain_names_a_real_cuda_out_of_memory(tmp_path: Path) -> None:
    log = tmp_path / "oom.log"
    assert _torchrun("cuda_oom.py", log) != 0
    code, doc = _explain(log)
    ids = _ids(doc)
    assert code == 1 and ids and ids[0] == "cuda-oom", (ids, log.read_text(errors="replace")[-3000:])


def test_explain_names_a_real_device_side_assert(tmp_path: Path) -> None:
    log = tmp_path / "assert.log"
    assert _torchrun("cuda_device_assert.py", log) != 0
    code, doc = _explain(log)
    ids = _ids(doc)
    assert code == 1 and ids and ids[0] == "cuda-kernel-error", (ids, log.read_text(errors="replace")[-3000:])


def test_explain_raises_no_alarm_on_a_healthy_nccl_debug_info_run(tmp_path: Path) -> None:
    log = tmp_path / "healthy.log"
    code = _run("nccl_ddp_train.py", log, one_rank_env({"NCCL_DEBUG": "INFO"}), "--steps", "20")
    text = log.read_text(errors="replace")
    assert code == 0 and "NCCL INFO" in text and "done: 20 steps" in text, text[-3000:]
    code, doc = _explain(log)
    assert code == 0 and doc["diagnoses"] == [], doc
