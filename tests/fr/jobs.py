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


def make_dumps(out: Path, mode: str, fmt: str = "pickle", nproc: int = 3, buffer: int = 2000) -> Path:
    """Run the job (it hangs, every rank dumps after 3 s, the job ends) and return the folder of dumps."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [*torchrun_cmd(), "--standalone", "--nproc-per-node", str(nproc), str(EXAMPLE), "--mode", mode,
           "--format", fmt, "--out", str(out), "--hang", "3", "--grace", "2"]
    env = clean_env({"TORCH_FR_BUFFER_SIZE": str(buffer), "OMP_NUM_THREADS": "1"})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out
