"""A hang is no progress, not a place (issue 25): real gloo jobs through the real CLI.

On NCCL a hung job rarely has a host thread inside a collective. These jobs reproduce what it looks like
instead, on gloo: every rank stopped outside any collective after a few steps (asleep, which stands for a
GPU kernel that never ends; waiting for a DataLoader worker that deadlocked), and NCCL's asynchrony itself
(``async_op=True`` all_reduces, one rank skipping one, every rank then blocked elsewhere). Each must get a
verdict within ``--hang-timeout`` + 10 s naming every rank's place with file:line, a filled evidence folder,
exit 1 and no process left behind; a healthy job with a long collective-free evaluation must not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import run_cli
from tests.watch.test_watch import EXAMPLES, leftovers, site

pytestmark = pytest.mark.slow

HANG_TIMEOUT = 8


def _watch(tmp_path: Path, nproc: int, example: str, *args: str,
           hang_timeout: float = HANG_TIMEOUT) -> tuple[Any, dict[str, Any], Path]:
    bundle = tmp_path / "evidence"
    report = tmp_path / "watch.json"
    proc = run_cli(["watch", "--nproc", str(nproc), "--hang-timeout", str(hang_timeout), "--json", str(report),
                    "--evidence", str(bundle), "--shutdown-timeout", "2", str(EXAMPLES / example), *args],
                   timeout=300, cwd=EXAMPLES)
    assert report.exists(), f"no report; stderr:\n{proc.stderr[-3000:]}"
    assert leftovers(example) == [], "processes of the job survived watch"
    return proc, json.loads(report.read_text()), bundle


def _bundle_is_filled(bundle: Path, nproc: int) -> None:
    names = {p.name for p in bundle.iterdir()}
    expected = {"verdict.json", "report.txt", "env.json"}
    for rank in range(nproc):
        expected |= {f"stack_rank_{rank}.txt", f"output_rank_{rank}.txt"}
    assert expected <= names, sorted(names)
    assert json.loads((bundle / "verdict.json").read_text())["status"] == "hang"


def test_every_rank_asleep_outside_any_collective_is_a_stall_verdict_in_time(tmp_path: Path) -> None:
    """3 ranks asleep after their last step, rank 2 in a C call that holds the GIL (``--gil-rank 2``: a C
    extension blocked in a system call without releasing it, ctypes.PyDLL), so its own watchdog thread cannot
    answer and the supervisor reads its stack from outside, with py-spy. One job for both (the GIL-holding rank
    ran as a 1-rank job of its own at a 45 s hang timeout: 57 s of the suite; a stack read from outside at the
    same verdict is what it asserted)."""
    nproc = 3
    proc, data, bundle = _watch(tmp_path, nproc, "hang_outside_collectives.py", "--mode", "sleep", "--gil-rank", "2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert data["status"] == "hang" and data["stall"] is True, [(r["rank"], r["wait"]) for r in data["ranks"]]
    assert data["stalled_s"] < HANG_TIMEOUT + 10
    where = site("hang_outside_collectives.py", "time.sleep(600)")
    held = site("hang_outside_collectives.py", "hold_the_gil(600)")
    ranks = {r["rank"]: r for r in data["ranks"]}
    for rank in (0, 1):
        assert (ranks[rank]["wait"]["kind"], ranks[rank]["wait"]["site"]) == ("user_code", where), ranks[rank]["wait"]
    assert (ranks[2]["wait"]["kind"], ranks[2]["wait"]["site"]) == ("user_code", held), ranks[2]["wait"]
    assert ranks[2]["stack"][-1].startswith(f"{held} in main"), ranks[2]["stack"]  # py-spy's read
    assert f"ddpdoctor watch: STALL: no rank made progress for {HANG_TIMEOUT} s (3 ranks)" in proc.stderr
    assert f"ranks 0-1: in its own code at {where}: time.sleep(600)" in proc.stderr
    assert f"rank 2: in its own code at {held}: hold_the_gil(600)" in proc.stderr
    assert "raise --hang-timeout above its duration" in proc.stderr
    assert "older ddpdoctor run" not in proc.stderr  # the ranks' Flight Recorder dumps, written side by side
    _bundle_is_filled(bundle, nproc)
    for rank in range(nproc):  # each rank's last words, kept (rank 2's too, though its threads cannot run)
        assert "step 4 done" in (bundle / f"output_rank_{rank}.txt").read_text()


def test_a_deadlocked_dataloader_worker_is_named_with_its_pid_and_stack(tmp_path: Path) -> None:
    """3 ranks, each with its own stuck worker."""
    nproc = 3
    proc, data, bundle = _watch(tmp_path, nproc, "hang_outside_collectives.py", "--mode", "dataloader")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert data["status"] == "hang" and data["stall"] is False
    assert data["stalled_s"] < HANG_TIMEOUT + 10
    loop = site("hang_outside_collectives.py", "for step, (x, y) in enumerate(loader)")
    stuck = site("hang_outside_collectives.py", "_LOCK.acquire()  # BUG")
    for rank in data["ranks"]:
        wait = rank["wait"]
        assert (wait["kind"], wait["site"]) == ("dataloader", loop), wait
        worker = wait["worker"]
        assert worker["id"] in (0, 1) and isinstance(worker["pid"], int)
        # The worker's own stack, read with py-spy by its rank: it ends at the lock in __getitem__.
        assert worker["stack"][-1] == f"{stuck} in StuckAfter.__getitem__", worker["stack"]
        assert f"waiting for a batch from DataLoader worker {worker['id']} (pid {worker['pid']}) at {loop}" \
            in proc.stderr
    assert "HANG: no rank made progress" in proc.stderr and "a DataLoader worker never delivered its batch" in proc.stderr
    _bundle_is_filled(bundle, nproc)


def test_an_async_all_reduce_skipped_by_one_rank_names_that_rank_and_the_line(tmp_path: Path) -> None:
    """NCCL's shape: every call returns at once, nobody sits in the collective that never completes."""
    proc, data, _bundle = _watch(tmp_path, 3, "hang_async_skip.py")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert data["status"] == "hang" and data["stall"] is False
    reduce_line = site("hang_async_skip.py", "dist.all_reduce(grads, async_op=True)")
    div = data["divergence"]
    assert (div["group"], div["seq"]) == ("WORLD", 6)
    (behind,) = div["behind"]
    assert (behind["ranks"], behind["issued"], behind["others"], behind["op"], behind["site"]) == \
        ([1], 5, [0, 2], "all_reduce", reduce_line)
    assert f"rank 1 never issued all_reduce #6 float32[4] (ranks 0,2 issued it at {reduce_line})" in proc.stderr
    ranks = {r["rank"]: r for r in data["ranks"]}
    for rank in (0, 2):
        # Issued, not completed: tracked as in flight, and the last *completed* is #5.
        assert ranks[rank]["last_completed"]["seq"] == 5 and ranks[rank]["inflight"] == 1
        pending = ranks[rank]["wait"]["pending"]
        assert [(p["op"], p["seq"], p["site"], p["on"]) for p in pending] == [("all_reduce", 6, reduce_line, "work")]
    assert ranks[1]["wait"]["site"] == site("hang_async_skip.py", "time.sleep(600)")
    assert ranks[1]["inflight"] == 0


def test_a_healthy_job_with_a_long_evaluation_below_the_timeout_is_not_a_hang(tmp_path: Path) -> None:
    proc, data, bundle = _watch(tmp_path, 2, "train_long_eval.py", "--eval-seconds", "4", hang_timeout=12)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert data["status"] == "ok" and data["evidence"] is None and not bundle.exists()
    assert "[rank0]:LONG_EVAL_OK" in proc.stdout
    assert "HANG" not in proc.stderr and "STALL" not in proc.stderr


# The rank's main thread holds the GIL in a C call that does not return (a C extension blocked in a system call
# without releasing the GIL: ctypes.PyDLL keeps it held during the call), so its own watchdog thread cannot notice
# anything (the stall test above has such a rank read from outside, with py-spy). It uses no CPU, unlike the
# backtracking regex that stood for it before and took one of CI's two cores.
GIL_HOG = """\
import ctypes
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
print("all_reduce done", flush=True)
libc = ctypes.PyDLL(None)
libc.sleep.argtypes = [ctypes.c_uint]
libc.sleep(600)
"""


def test_a_rank_holding_the_gil_does_not_outlive_a_sigkilled_watch(tmp_path: Path) -> None:
    """Its watchdog cannot run to notice the closed channel: the kernel's parent-death signal ends it."""
    import signal
    import subprocess
    import sys
    import time

    from tests.support import clean_env

    script = tmp_path / "gil_hog.py"
    script.write_text(GIL_HOG)
    proc = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "watch", "--nproc", "1", "--hang-timeout", "600",
                             str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("ddpdoctor.watch.rank" in line for line in leftovers("gil_hog.py")):
            time.sleep(0.2)
        time.sleep(8)  # past torch's import and the one all_reduce: in the GIL-holding call by now
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 15
    while leftovers("gil_hog.py") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers("gil_hog.py") == []
