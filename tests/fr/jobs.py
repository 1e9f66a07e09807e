"""Real Flight Recorder dumps for the tests: examples/fr_hang.py under torchrun on gloo, hanging for real.

Facts relied on (checked on torch 2.13.0+cpu): gloo collectives are recorded by the Flight Recorder when
TORCH_FR_BUFFER_SIZE is set; torch._C._distributed_c10d._dump_fr_trace(includeCollectives,
includeStackTraces, onlyActive) returns the pickle PyTorch writes on an NCCL timeout, and
_dump_fr_trace_json(includeCollectives, onlyActive) the JSON form (FlightRecorder.cpp, dump / dump_json).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import REPO, clean_env, torchrun_cmd

EXAMPLE = REPO / "examples" / "fr_hang.py"


def start_job(out: Path, mode: str, fmt: str = "pickle", nproc: int = 3, hang: float = 5) -> subprocess.Popen[str]:
    """Start the job (it hangs, every rank dumps after ``hang`` s, the job ends); :func:`finish` waits for it."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [*torchrun_cmd(), "--standalone", "--nproc-per-node", str(nproc), str(EXAMPLE), "--mode", mode,
           "--format", fmt, "--out", str(out), "--hang", str(hang), "--grace", "2"]
    env = clean_env({"TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"})
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=str(REPO), start_new_session=True)


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> None:
    """Wait for a job with a deadline; a job that overruns is killed (its whole process group) and fails."""
    import os
    import signal

    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"fr_hang.py job still running after {timeout} s:\n{output[-3000:]}") from None
    assert proc.returncode == 0, output[-4000:]
