"""The decisions behind issue #17, fed with the messages processes send (no processes here; the real runs
are in test_spawn.py): contradicting init_process_group claims, the straggler, the script's own spawn
calls recognised from its source, and how each reads in the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.watch.aggregate import CRASH, INIT_CONFLICT, OK, Aggregator
from ddpdoctor.watch.claims import claim_conflict, straggler
from ddpdoctor.watch.report import render
from ddpdoctor.watch.spawned import spawn_sites


def claim(rank: int | None, world: int | None = 2, pid: int = 1, backend: str = "gloo",
          site: str = "train.py:12") -> dict[str, Any]:
    return {"backend": backend, "init_method": "env://", "rank": rank, "world_size": world, "timeout_s": None,
            "site": site, "pid": pid}


@pytest.mark.parametrize(("claims", "kind", "words"), [
    ([claim(0, pid=1), claim(0, pid=2, site="train.py:40")], "duplicate_rank",
     "two processes claim rank 0: pid 1 at train.py:12 and pid 2 at train.py:40"),
    ([claim(0, 2, pid=1), claim(1, 3, pid=2)], "different_world_size", "disagree on world sizes: 2"),
    ([claim(2, 2, pid=1)], "rank_outside_world", "rank 2 is outside a world of 2 ranks"),
    ([claim(0, pid=1, backend="gloo"), claim(1, pid=2, backend="nccl")], "different_backend", "gloo"),
])
def test_contradicting_claims_are_named_with_their_call_sites(claims: list[dict[str, Any]], kind: str,
                                                             words: str) -> None:
    found = claim_conflict(claims)
    assert found is not None and found["kind"] == kind
    assert words in found["summary"]


def test_consistent_claims_and_a_default_backend_are_fine() -> None:
    assert claim_conflict([claim(0, pid=1), claim(1, pid=2, backend="default"), claim(None, None, pid=3)]) is None
    # The same process calling init twice (destroy + init again) is not two claimants.
    assert claim_conflict([claim(0, pid=1), claim(0, pid=1)]) is None


def test_a_duplicate_claim_stops_a_spawned_job_at_once_and_reads_as_such() -> None:
    agg = Aggregator(0, hang_timeout_s=600, spawned=True)
    for pid in (11, 12):
        agg.feed(-pid, {"t": "hello", "rank": -pid, "pid": pid, "host": "h", "role": "child", "index": pid - 11}, 0.0)
    agg.feed(0, {"t": "init", "claim": claim(0, pid=11), "bind": True, "rank": 0, "was": -11}, 0.1)
    assert agg.verdict(0.1) is None and agg.world_size == 2
    agg.feed(0, {"t": "init", "claim": claim(0, pid=12), "bind": True, "rank": 0, "was": -12}, 0.2)
    assert agg.verdict(0.2) == INIT_CONFLICT
    text = render(agg.result(INIT_CONFLICT))
    assert "INIT CONFLICT: two processes claim rank 0" in text
    assert "pid 12 at train.py:12: init_process_group(backend=gloo, init_method=env://, rank=0, world_size=2)" in text
    assert "EADDRINUSE" not in text and "port" not in text


def test_a_spawned_job_is_over_when_its_launcher_exits_and_its_failure_is_exit_1() -> None:
    agg = Aggregator(0, hang_timeout_s=600, spawned=True)
    assert agg.verdict(0.0) is None  # nothing has started yet: not "ok"
    agg.feed(-11, {"t": "hello", "rank": -11, "pid": 11, "host": "h", "role": "child", "index": 0}, 0.0)
    agg.feed(0, {"t": "init", "claim": claim(0, 1, pid=11), "bind": True, "rank": 0, "was": -11}, 0.1)
    agg.feed(0, {"t": "exit", "code": 0}, 0.5)
    assert agg.verdict(0.6) is None  # the launcher still runs
    agg.launcher_exited(4, 0.7)
    assert agg.verdict(0.7) == CRASH
    result = agg.result(CRASH)
    assert result["exit_code"] == 1 and result["script_exit_code"] == 4
    assert render(result).startswith("ddpdoctor watch: CRASH: the script exited with code 4")


def test_a_script_that_never_started_a_rank_says_nothing_was_watched() -> None:
    agg = Aggregator(0, hang_timeout_s=600, spawned=True)
    agg.launcher_exited(1, 0.5)
    assert agg.verdict(0.5) == CRASH
    assert render(agg.result(CRASH)).startswith("ddpdoctor watch: CRASH: the script exited with code 1 before any "
                                                "process it started joined a process group: nothing was watched")
    agg = Aggregator(0, hang_timeout_s=600, spawned=True)
    agg.launcher_exited(0, 0.5)
    assert agg.verdict(0.5) == OK
    assert render(agg.result(OK)).startswith("ddpdoctor watch: the script ended (exit code 0) before any process")


def stats(step_ms: float, wait_ms: float, window: int = 30) -> dict[str, Any]:
    return {"steps": window, "window": window, "boundary": "optimizer", "step_us": step_ms * 1000,
            "wait_us": wait_ms * 1000}


def test_the_rank_the_others_wait_for_is_the_straggler_with_its_share() -> None:
    found = straggler({0: stats(150, 80), 1: stats(150, 2), 2: stats(150, 76)})
    assert found is not None and found["rank"] == 1
    assert found["summary"] == "rank 1 is the straggler: the others wait 76 ms per step for it (51 % of the step)"


@pytest.mark.parametrize("ranks", [
    {0: stats(150, 8), 1: stats(150, 5), 2: stats(150, 7)},  # balanced: small differences are noise
    {0: stats(150, 80), 1: stats(150, 2), 2: stats(150, 3)},  # only one rank waits: no straggler for all
    {0: stats(150, 80, window=3), 1: stats(150, 2, window=3)},  # too few steps to say
    {0: stats(150, 80), 1: None},  # a rank without steps yet
])
def test_no_straggler_without_every_other_rank_waiting_for_one(ranks: dict[int, Any]) -> None:
    assert straggler(ranks) is None


def test_a_straggler_is_named_live_once_after_consecutive_checks() -> None:
    agg = Aggregator(2, hang_timeout_s=600)
    for rank in (0, 1):
        agg.feed(rank, {"t": "hello", "rank": rank, "pid": rank, "host": "h"}, 0.0)
    agg.ranks[0].steps, agg.ranks[1].steps = stats(100, 60), stats(100, 1)
    notices = [agg.straggler_notice(float(t)) for t in range(1, 6)]
    assert [n for n in notices if n] == ["ddpdoctor watch: rank 1 is the straggler: the others wait 59 ms per step "
                                         "for it (59 % of the step) (the job goes on)"]
    result = agg.result(OK)
    assert result["straggler"]["rank"] == 1 and result["exit_code"] == 0
    assert "warning: rank 1 is the straggler" in render(result)


@pytest.mark.parametrize(("source", "expected"), [
    ("import torch.multiprocessing as mp\nmp.spawn(f, nprocs=2)\n", ["x.py:2 mp.spawn"]),
    ("import torch\ntorch.multiprocessing.spawn(f, nprocs=2)\n", ["x.py:2 torch.multiprocessing.spawn"]),
    ("from torch.multiprocessing import start_processes as sp\nsp(f, nprocs=2, start_method='fork')\n", ["x.py:2 sp"]),
    ("import multiprocessing as mp\nctx = mp.get_context('spawn')\nmp.Process(target=f).start()\n",
     ["x.py:3 mp.Process"]),
    ("from multiprocessing import Process\nProcess(target=f)\n", ["x.py:2 Process"]),
    ("import torch.distributed as dist\ndist.init_process_group('gloo')\n", []),  # the torchrun style
    ("from torch.utils.data import DataLoader\nDataLoader(ds, num_workers=4)\n", []),
    ("def spawn(): pass\nspawn()\n", []),
    ("this is not python(\n", []),
])
def test_scripts_that_start_their_own_ranks_are_recognised(tmp_path: Path, source: str,
                                                            expected: list[str]) -> None:
    script = tmp_path / "x.py"
    script.write_text(source)
    found = spawn_sites(str(script))
    assert [entry.split(" ", 1)[0].rsplit("/", 1)[-1] + " " + entry.split(" ", 1)[1] for entry in found] == expected


def test_one_slow_step_moves_no_median_so_it_makes_no_straggler() -> None:
    """The rank-side window: 40 steps of 100 ms with 5 ms in collectives on rank 1, one of them a 3 s spike
    in its own code (a checkpoint) during which rank 0 waited 3 s: the medians do not move."""
    from ddpdoctor.watch.recorder import Recorder

    ranks = {}
    for rank in (0, 1):
        recorder = Recorder(rank, 2)
        for step in range(40):
            spike = step == 20
            step_s = 3.1 if spike else 0.1
            wait_s = (3.0 if spike and rank == 0 else 0.006) if rank == 0 else 0.005
            recorder.step_window.append((step_s, wait_s))
        recorder.steps = 40
        ranks[rank] = recorder.step_stats()
    assert ranks[0] is not None and ranks[0]["step_us"] == pytest.approx(100_000) and ranks[0]["wait_us"] == pytest.approx(6000)
    assert straggler(ranks) is None
