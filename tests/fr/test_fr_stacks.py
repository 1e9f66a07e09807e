"""`fr` joined with `ddpdoctor stacks --json` taken from the same hung job, both for real."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from tests.fr.jobs import finish, start_job
from tests.support import run_cli


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


def test_the_stalled_rank_is_shown_where_it_is_now(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    job = start_job(dumps, "stall", nproc=3, hang=20)
    try:
        pids = _ranks(job.pid, time.monotonic() + 120)
        time.sleep(6)  # past init and the first three steps: rank 1 sleeps, the others wait in all_reduce
        stacks = run_cli(["stacks", *(f"--pid={p}" for p in pids), "--json", str(tmp_path / "node.json")],
                         timeout=120)
        assert stacks.returncode in (0, 1), stacks.stderr
    finally:
        finish(job)
    out = run_cli(["fr", str(dumps), str(tmp_path / "node.json")], timeout=60)
    assert out.returncode == 1, out.stderr
    assert "rank 1 never issued collective #4" in out.stdout
    line = next(line for line in out.stdout.splitlines() if line.strip().startswith("rank 1 now"))
    assert "at fr_hang.py:" in line and "in main" in line and "pid " in line, out.stdout
