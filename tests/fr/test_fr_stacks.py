"""`fr` joined with `ddpdoctor stacks --json` taken from the same hung job, both for real."""

from __future__ import annotations

import json
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


def _in_main(path: Path, rank: int) -> bool:
    """Whether ``rank``'s main thread in a `stacks --json` file is inside fr_hang.py's main()."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    for proc in doc["processes"]:
        if proc["rank"] == rank:
            main = [t for t in proc["threads"] if t["main"]]
            return bool(main) and any(f["function"] == "main" for f in main[0]["frames"])
    return False


def test_the_stalled_rank_is_shown_where_it_is_now(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    job = start_job(dumps, "stall", nproc=3, hang=20)
    try:
        pids = _ranks(job.pid, time.monotonic() + 120)
        # Past init and the first three steps: rank 1 sleeps in main(), the others wait in all_reduce. A loaded
        # machine can take longer than any fixed wait to import torch (rank 1 was once read at `import torch`):
        # read again until rank 1 is in main(), within the 20 s before the ranks dump and exit.
        give_up = time.monotonic() + 60
        while True:
            stacks = run_cli(["stacks", *(f"--pid={p}" for p in pids), "--json", str(tmp_path / "node.json")],
                             timeout=120)
            assert stacks.returncode in (0, 1), stacks.stderr
            if _in_main(tmp_path / "node.json", 1) or time.monotonic() > give_up:
                break
            time.sleep(1)
    finally:
        finish(job)
    out = run_cli(["fr", str(dumps), str(tmp_path / "node.json")], timeout=60)
    assert out.returncode == 1, out.stderr
    assert "rank 1 never issued collective #4" in out.stdout
    line = next(line for line in out.stdout.splitlines() if line.strip().startswith("rank 1 now"))
    assert "at fr_hang.py:" in line and "in main" in line and "pid " in line, out.stdout
