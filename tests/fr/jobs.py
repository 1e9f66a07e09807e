"""Real Flight Recorder dumps for the tests: examples/fr_hang.py under torchrun on gloo, hanging for real.

Facts relied on (checked on torch 2.13.0+cpu): gloo collectives are recorded by the Flight Recorder when
TORCH_FR_BUFFER_SIZE is set; torch._C._distributed_c10d._dump_fr_trace(includeCollectives,
includeStackTraces, onlyActive) returns the pickle PyTorch writes on an NCCL timeout, and
_dump_fr_trace_json(includeCollectives, onlyActive) the JSON form (FlightRecorder.cpp, dump / dump_json).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil

from tests.support import REPO, clean_env, run_cli, torchrun_cmd

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


# The stall job's hang: long enough to read its stacks before the ranks dump and exit.
STALL_HANG_S = 12


def _ranks(torchrun_pid: int, deadline: float) -> list[int]:
    """The pids of the job's three rank processes (children of torchrun's agent running fr_hang.py)."""
    while time.monotonic() < deadline:
        try:
            kids = psutil.Process(torchrun_pid).children(recursive=True)
            found = [k.pid for k in kids if any("fr_hang.py" in part for part in k.cmdline())]
        except psutil.Error:
            found = []
        if len(found) == 3:
            return found
        time.sleep(0.2)
    raise AssertionError("the job's ranks never appeared")


def _in_main(path: Path, rank: int) -> bool:
    """Whether ``rank``'s main thread in a `stacks --json` file stands in fr_hang.py's main() itself (its stall's
    sleep): its innermost fr_hang.py frame is main. (Any main() frame on the stack also matched a rank still in
    an earlier step's all_reduce, called from main through train_step: a CI run read rank 1 there.)"""
    doc = json.loads(path.read_text(encoding="utf-8"))
    for proc in doc["processes"]:
        if proc["rank"] == rank:
            main = [t for t in proc["threads"] if t["main"]]
            ours = [f for f in (main[0]["frames"] if main else []) if str(f.get("file", "")).endswith("fr_hang.py")]
            return bool(ours) and ours[0]["function"] == "main"  # frames are innermost first
    return False


def read_stalled_job(job: subprocess.Popen[str], out: Path) -> None:
    """``stacks --json out`` of the running 3-rank stall job (started with ``hang=STALL_HANG_S``)."""
    pids = _ranks(job.pid, time.monotonic() + 120)
    # Past init and the first three steps: rank 1 sleeps in main(), the others wait in all_reduce. A loaded
    # machine can take longer than any fixed wait to import torch (rank 1 was once read at `import torch`):
    # read again until rank 1 is in main(), within the STALL_HANG_S before the ranks dump and exit.
    give_up = time.monotonic() + 60
    while True:
        stacks = run_cli(["stacks", *(f"--pid={p}" for p in pids), "--json", str(out)], timeout=120)
        assert stacks.returncode in (0, 1), stacks.stderr
        if _in_main(out, 1) or time.monotonic() > give_up:
            break
        time.sleep(1)
