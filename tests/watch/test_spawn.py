"""`ddpdoctor watch` on the scripts people really write (issue #17), as real processes on gloo: a script
that starts its own ranks with mp.spawn (healthy, skipping a collective, every process claiming rank 0),
a 3-rank job with a straggler, a rank stuck before its first collective, and the evidence bundle.

Every run is the real CLI as a subprocess; each test checks that no process of the job survived.
"""

from __future__ import annotations

import json
import pickletools
from pathlib import Path
from typing import Any

import pytest

from tests.support import run_cli
from tests.watch.test_watch import EXAMPLES, HANG_TIMEOUT, groups_by_rank, leftovers, site

pytestmark = pytest.mark.slow


def watch(cwd: Path, script: str, *args: str, options: tuple[str, ...] = ()) -> tuple[Any, dict[str, Any]]:
    report = cwd / "watch.json" if cwd != EXAMPLES else Path(options[options.index("--json") + 1])
    proc = run_cli(["watch", "--hang-timeout", str(HANG_TIMEOUT), *options, script, *args], timeout=240, cwd=cwd)
    assert report.exists(), f"no report; stderr:\n{proc.stderr[-3000:]}"
    assert leftovers(Path(script).name) == [], "processes of the job survived watch"
    return proc, json.loads(report.read_text())


def pickle_strings(path: Path) -> set[str]:
    """The strings inside a pickle, read with pickletools (nothing is unpickled, no code can run)."""
    return {str(arg) for _op, arg, _pos in pickletools.genops(path.read_bytes()) if isinstance(arg, str)}


def test_mp_spawn_script_runs_once_and_both_spawned_ranks_are_watched(tmp_path: Path) -> None:
    report = tmp_path / "w.json"
    proc, data = watch(EXAMPLES, "spawn_ddp.py", "--steps", "3", options=("--json", str(report)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("SPAWN_DDP_OK world_size=2") == 1  # the script ran once, not once per rank
    assert "starts its own ranks (spawn_ddp.py:" in proc.stderr and "EADDRINUSE" not in proc.stderr
    assert data["status"] == "ok" and data["launch"] == "script" and data["world_size"] == 2
    ranks = data["ranks"]
    assert [r["state"] for r in ranks] == ["exited", "exited"]
    assert len({r["pid"] for r in ranks}) == 2
    setup = site("spawn_ddp.py", 'dist.init_process_group("gloo"')
    assert [(r["init"]["rank"], r["init"]["world_size"], r["init"]["site"]) for r in ranks] == \
        [(0, 2, setup), (1, 2, setup)]
    assert all(r["issued"]["WORLD"] == 4 for r in ranks)  # 3 loss all_reduces + the barrier, per rank
    assert all(r["steps"]["boundary"] == "optimizer" and r["steps"]["steps"] == 2 for r in ranks)


def test_mp_spawn_rank_skipping_a_collective_is_named_with_both_lines_and_its_evidence(tmp_path: Path) -> None:
    report, bundle = tmp_path / "w.json", tmp_path / "evidence"
    proc, data = watch(EXAMPLES, "spawn_ddp.py", "--steps", "3", "--bug", "skip-collective",
                       options=("--json", str(report), "--evidence", str(bundle)))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "mismatch"
    by_rank = groups_by_rank(data["divergence"])
    reduce_site, barrier_site = site("spawn_ddp.py", "dist.all_reduce(logged)"), site("spawn_ddp.py", "dist.barrier()")
    assert (by_rank[0]["op"], by_rank[0]["site"]) == ("all_reduce", reduce_site)
    assert (by_rank[1]["op"], by_rank[1]["site"]) == ("barrier", barrier_site)
    assert f"rank 1 in barrier at {barrier_site}" in proc.stderr
    # The stacks start in the user's function, not in multiprocessing's bootstrap.
    assert data["ranks"][1]["stack"][0].startswith("spawn_ddp.py:")
    assert data["evidence"] == str(bundle) and f"evidence: {bundle}" in proc.stderr
    for rank in (0, 1):
        # Each live rank's Flight Recorder dump, written by the rank: torch's pickle, with its collectives.
        strings = pickle_strings(bundle / "flight_recorder" / f"fr_rank_{rank}")
        assert {"entries", "gloo:all_reduce"} <= strings
        history = json.loads((bundle / f"history_rank_{rank}.json").read_text())["calls"]
        assert history[-1]["site"] == (reduce_site if rank == 0 else barrier_site)
    # PyTorch's own record of the same hang, read by `ddpdoctor fr`, is in the report beside watch's verdict.
    assert data["fr"]["status"] == "fail" and data["fr"]["path"] == str(bundle / "flight_recorder")
    assert "rank 1 in barrier" in data["fr"]["summary"] and "all_reduce" in data["fr"]["summary"]
    assert "Flight Recorder (ddpdoctor fr " in proc.stderr


def test_every_process_claiming_rank_0_is_named_as_such_not_as_a_busy_port(tmp_path: Path) -> None:
    report = tmp_path / "w.json"
    proc, data = watch(EXAMPLES, "spawn_ddp.py", "--bug", "same-rank",
                       options=("--json", str(report), "--evidence", str(tmp_path / "evidence")))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "init_conflict"
    conflict = data["init_conflict"]
    assert conflict["kind"] == "duplicate_rank"
    setup = site("spawn_ddp.py", 'dist.init_process_group("gloo"')
    assert [(c["rank"], c["site"]) for c in conflict["claims"]] == [(0, setup), (0, setup)]
    assert len({c["pid"] for c in conflict["claims"]}) == 2
    assert "INIT CONFLICT: two processes claim rank 0" in proc.stderr
    assert "EADDRINUSE" not in json.dumps(data) and "address already in use" not in proc.stderr.lower()
    # Stopped before the rendezvous: no process group recorded anything, and there is no rank 1 whose
    # missing Flight Recorder dump could be blamed (issue 28).
    assert "no dump from rank" not in proc.stderr and "Flight Recorder (" not in proc.stderr
    # ... and the bundle keeps no empty flight_recorder/ folder that its listing does not name.
    assert "fr" not in data and not (tmp_path / "evidence" / "flight_recorder").exists()
    assert "flight_recorder" not in proc.stderr


def test_a_rank_sleeping_every_step_is_the_straggler_and_the_others_are_not(tmp_path: Path) -> None:
    report = tmp_path / "w.json"
    proc, data = watch(EXAMPLES, "straggler.py", "--slow-rank", "1", "--delay", "0.05", "--steps", "25",
                       options=("--nproc", "3", "--json", str(report)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert data["status"] == "ok"
    found = data["straggler"]
    assert found is not None and found["rank"] == 1
    # The others wait about the 50 ms the straggler sleeps (gloo on a busy CPU adds its noise).
    assert 30_000 < found["wait_us"] < 200_000
    assert "warning: rank 1 is the straggler: the others wait" in proc.stderr
    waits = {r["rank"]: r["steps"]["wait_us"] for r in data["ranks"]}
    assert waits[1] < waits[0] and waits[1] < waits[2]


STUCK = """\
import os
import threading

import torch.distributed as dist


def load_data(rank):
    lock = threading.Lock()
    lock.acquire()
    if rank == 1:
        lock.acquire()  # a lock nobody releases: this rank never gets to init_process_group


load_data(int(os.environ["RANK"]))
dist.init_process_group("gloo")
dist.barrier()
"""


def test_a_rank_stuck_before_its_first_collective_is_named_with_its_stack_and_evidence(tmp_path: Path) -> None:
    (tmp_path / "stuck_first.py").write_text(STUCK)
    bundle = tmp_path / "bundle"
    proc, data = watch(tmp_path, "stuck_first.py",
                       options=("--nproc", "2", "--json", str(tmp_path / "watch.json"), "--evidence", str(bundle)))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "hang"
    assert [(o["rank"], o["site"], o["before_init"]) for o in data["outside"]] == [(1, "stuck_first.py:11", True)]
    assert ("rank 1 is stuck outside any collective (it never reached its first one), at stuck_first.py:11; "
            "meanwhile rank 0 waits in init_process_group at stuck_first.py:15") in proc.stderr
    names = {p.name for p in bundle.iterdir()}
    assert {"verdict.json", "report.txt", "env.json", "stack_rank_0.txt", "stack_rank_1.txt"} <= names
    assert json.loads((bundle / "verdict.json").read_text())["status"] == "hang"
    assert "lock.acquire()  # a lock nobody releases" in (bundle / "stack_rank_1.txt").read_text()
    assert "HANG" in (bundle / "report.txt").read_text()
    assert json.loads((bundle / "env.json").read_text())  # what `ddpdoctor env` reports
    assert not list(bundle.glob("*.tmp*"))  # every file written whole
