"""The watch supervisor's bookkeeping and wording, fed with the messages ranks send (no processes).

The multi-process behaviour is in test_watch.py; here the decisions themselves: what is a mismatch,
when silence is a hang and when it is just a rank doing its own work, and how the report reads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.watch.aggregate import CRASH, HANG, MISMATCH, OK, Aggregator
from ddpdoctor.watch.config import WatchConfig
from ddpdoctor.watch.report import divergence_line, render


def rec(op: str, seq: int | None, site: str, sig: str = "", group: str = "WORLD",
        members: list[int] | None = None) -> dict[str, Any]:
    return {"op": op, "group": group, "members": members, "seq": seq, "sig": sig, "desc": sig, "site": site}


def start(agg: Aggregator, rank: int, record: dict[str, Any], done: int, now: float,
          seqs: dict[str, int] | None = None) -> None:
    """A rank enters ``record`` (sent as records + beat, as the watchdog does)."""
    agg.feed(rank, {"t": "rec", "recs": [record]}, now)
    agg.feed(rank, {"t": "beat", "progress": 2 * done + 1, "done": done, "cur": record, "last": None,
                    "seqs": seqs or {"WORLD": record["seq"] or done}}, now)


def hello_all(agg: Aggregator, now: float = 0.0) -> None:
    for rank in agg.ranks:
        agg.feed(rank, {"t": "hello", "rank": rank, "pid": 100 + rank, "host": "h"}, now)


def test_same_seq_different_op_is_a_mismatch_at_once() -> None:
    agg = Aggregator(3, hang_timeout_s=60)
    hello_all(agg)
    start(agg, 0, rec("all_reduce", 57, "train.py:55", "float32[4]"), 56, 1.0)
    start(agg, 2, rec("all_reduce", 57, "train.py:55", "float32[4]"), 56, 1.0)
    assert agg.verdict(1.0) is None
    start(agg, 1, rec("barrier", 57, "eval.py:40"), 56, 1.1)
    assert agg.verdict(1.1) == MISMATCH
    line = divergence_line(agg.divergence() or {})
    assert line == "collective #57: ranks 0,2 in all_reduce float32[4] at train.py:55; rank 1 in barrier at eval.py:40"


def test_same_op_different_shape_is_a_mismatch_but_equal_calls_are_not() -> None:
    agg = Aggregator(2, hang_timeout_s=60)
    hello_all(agg)
    start(agg, 0, rec("all_reduce", 1, "a.py:3", "float32[3]"), 0, 1.0)
    start(agg, 1, rec("all_reduce", 1, "a.py:3", "float32[3]"), 0, 1.0)
    assert agg.verdict(1.0) is None and agg.expect == {}  # matched calls are forgotten (bounded memory)
    start(agg, 0, rec("all_reduce", 2, "a.py:9", "float32[3]"), 1, 2.0)
    start(agg, 1, rec("all_reduce", 2, "a.py:9", "float32[4]"), 1, 2.0)
    assert agg.verdict(2.0) == MISMATCH


def test_send_matches_recv_on_its_channel_and_a_size_difference_is_caught() -> None:
    agg = Aggregator(2, hang_timeout_s=60)
    hello_all(agg)
    channel = "WORLD:p2p:0->1"
    agg.feed(0, {"t": "rec", "recs": [rec("send", 1, "p.py:5", "float32[4]", channel, [0, 1])]}, 1.0)
    agg.feed(1, {"t": "rec", "recs": [rec("irecv", 1, "p.py:8", "float32[4]", channel, [0, 1])]}, 1.0)
    assert agg.verdict(1.0) is None
    agg.feed(0, {"t": "rec", "recs": [rec("send", 2, "p.py:5", "float32[4]", channel, [0, 1])]}, 1.0)
    agg.feed(1, {"t": "rec", "recs": [rec("recv", 2, "p.py:8", "float32[5]", channel, [0, 1])]}, 1.0)
    assert agg.verdict(1.0) == MISMATCH


def test_no_progress_is_a_hang_wherever_the_ranks_are_and_a_stall_when_nobody_waits() -> None:
    """Issue 25: on NCCL no host thread sits in the collective; silence is the hang, not a place."""
    agg = Aggregator(2, hang_timeout_s=5)
    hello_all(agg)
    for rank in (0, 1):
        agg.feed(rank, {"t": "beat", "progress": 4, "done": 2, "cur": None, "last": None, "seqs": {"WORLD": 2}}, 1.0)
    agg.feed(1, {"t": "beat", "progress": 4, "done": 3, "cur": None, "last": None, "seqs": {"WORLD": 2}}, 4.0)
    assert agg.verdict(8.9) is None  # rank 1 completed something at 4.0: the clock restarted there
    # Issuing is not progress (a desynchronised NCCL rank issues on until it blocks).
    agg.feed(0, {"t": "rec", "recs": [rec("all_reduce", 3, "t.py:38", "float32[4]")]}, 8.0)
    assert agg.verdict(9.1) == HANG
    # Both ranks in their own code (a long evaluation), nothing in flight: the same verdict, worded as a stall.
    for rank in (0, 1):
        agg.feed(rank, {"t": "stack", "stack": ["t.py:70 in evaluate: score(batch)"],
                        "frames": [["/job/t.py", 70, "evaluate", "score(batch)"]]}, 9.1)
    result = agg.result(HANG)
    assert result["stall"] is True
    assert [r["wait"]["kind"] for r in result["ranks"]] == ["user_code", "user_code"]
    text = render(result)
    assert text.startswith("ddpdoctor watch: STALL: no rank made progress for 5 s (2 ranks)")
    assert "ranks 0-1: in its own code at t.py:70: score(batch)" in text
    assert "raise --hang-timeout above its duration" in text
    # One rank with a collective in flight: nobody calls that a legitimate long phase.
    agg.feed(0, {"t": "stack", "stack": [], "frames": [["/job/t.py", 70, "evaluate", "score(batch)"]],
                 "inflight": [{"op": "all_reduce", "seq": 3, "group": "WORLD", "site": "t.py:38", "desc": "float32[4]",
                               "on": "work", "age_s": 6.0}]}, 9.2)
    result = agg.result(HANG)
    assert result["stall"] is False and render(result).startswith("ddpdoctor watch: HANG: no rank made progress")
    assert "rank 0: in its own code at t.py:70: score(batch); 1 collective still pending: #3 all_reduce float32[4] " \
           "(issued at t.py:38, 6.0 s ago)" in render(result)


def test_a_rank_that_exited_while_others_wait_is_named_with_its_exit() -> None:
    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    start(agg, 0, rec("all_reduce", 7, "t.py:33", "float32[16]"), 6, 1.0)
    agg.feed(1, {"t": "beat", "progress": 12, "done": 6, "cur": None, "last": None, "seqs": {"WORLD": 6}}, 1.0)
    agg.feed(1, {"t": "exit", "code": 0, "crashed": False, "error": ""}, 1.0)
    agg.process_exited(1, 0, 1.0)
    assert agg.verdict(2.0) is None
    assert agg.verdict(3.5) == HANG
    result = agg.result(HANG)
    assert divergence_line(result["divergence"]) == (
        "collective #7: rank 0 in all_reduce float32[16] at t.py:33; rank 1 exited with code 0")
    assert result["exit_code"] == 1
    assert "HANG" in render(result)


def test_crash_beats_hang_and_the_first_to_die_is_named_first() -> None:
    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    start(agg, 0, rec("all_reduce", 4, "c.py:37", "float32[8]"), 3, 1.0)
    agg.feed(1, None, 1.2)  # the channel closed: killed
    agg.process_exited(1, -9, 1.3)
    assert agg.verdict(3.5) == CRASH
    result = agg.result(CRASH)
    assert result["crash_order"] == [1]
    text = render(result)
    assert text.startswith("ddpdoctor watch: CRASH: rank 1 was killed by signal 9 (SIGKILL)")
    assert "the rest were torn down" in text


def test_a_nonzero_exit_is_the_rank_failing_and_watch_exits_1_not_the_scripts_code() -> None:
    """A script's exit code 3 must not pass through as ddpdoctor's own bug code 3 (issue #20)."""
    agg = Aggregator(3, hang_timeout_s=2)
    hello_all(agg)
    for rank, code, at in ((0, 0, 1.0), (2, 3, 1.1), (1, 4, 1.2)):
        agg.feed(rank, {"t": "exit", "code": code, "crashed": False, "error": ""}, at)
        agg.process_exited(rank, code, at)
    assert agg.verdict(9.0) == CRASH
    result = agg.result(CRASH)
    assert result["exit_code"] == 1 and result["crash_order"] == [2, 1]
    assert render(result).startswith("ddpdoctor watch: CRASH: rank 2 exited with code 3 first; then rank 1 failed")


def test_every_rank_exiting_0_is_ok_and_exit_0() -> None:
    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    for rank in (0, 1):
        agg.feed(rank, {"t": "exit", "code": 0, "crashed": False, "error": ""}, 1.0)
        agg.process_exited(rank, 0, 1.0)
    assert agg.verdict(9.0) == OK and agg.exit_code(OK) == 0
    assert render(agg.result(OK)).startswith("ddpdoctor watch: ok: 2 ranks finished (exit code 0)")


def test_the_rank_that_failed_first_is_named_even_when_its_echo_was_seen_first() -> None:
    """Rank 1 is SIGKILLed; rank 0's collective then fails with gloo's "Connection closed by peer" and its
    exit message can be processed before the supervisor sees rank 1's death: rank 1 is still first."""
    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    agg.feed(0, {"t": "exit", "code": 1, "crashed": True,
                 "error": "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                          "[127.0.0.1]:29500 (at t.py:9)"}, 1.00)
    agg.process_exited(0, 1, 1.01)
    agg.feed(1, None, 1.02)
    agg.process_exited(1, -9, 1.03)
    result = agg.result(agg.verdict(1.1) or "")
    assert result["status"] == CRASH and result["crash_order"] == [1, 0]
    assert render(result).startswith("ddpdoctor watch: CRASH: rank 1 was killed by signal 9 (SIGKILL) first; "
                                     "then rank 0 failed")


def test_ranks_that_raised_the_same_error_are_said_to_have_hit_it_each_not_to_have_followed() -> None:
    """Ranks 0 and 1 raise the same ValueError at the same line (a bug every rank hits); rank 2's all_reduce then
    fails on the closed connection. "then ranks 1-2 failed" read as if rank 1 were rank 0's victim."""
    agg = Aggregator(3, hang_timeout_s=2)
    hello_all(agg)
    same = "ValueError: corrupt sample in batch 3 (at train.py:24)"
    for rank, at in ((0, 1.00), (1, 1.01)):
        agg.feed(rank, {"t": "exit", "code": 1, "crashed": True, "error": same}, at)
        agg.process_exited(rank, 1, at + 0.001)
    agg.feed(2, {"t": "exit", "code": 1, "crashed": True,
                 "error": "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                          "[127.0.0.1]:29500 (at train.py:38)"}, 1.05)
    agg.process_exited(2, 1, 1.051)
    result = agg.result(agg.verdict(1.1) or "")
    assert result["crash_order"] == [0, 1, 2]
    assert render(result).splitlines()[0] == (
        f"ddpdoctor watch: CRASH: rank 0 raised {same} first; rank 1 raised the same at the same place (each rank "
        "hit it: not a consequence of rank 0's crash); then rank 2 failed")
    # A different error (another line) is not "the same".
    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    agg.feed(0, {"t": "exit", "code": 1, "crashed": True, "error": same}, 1.0)
    agg.process_exited(0, 1, 1.001)
    agg.feed(1, {"t": "exit", "code": 1, "crashed": True, "error": same.replace("24", "25")}, 1.01)
    agg.process_exited(1, 1, 1.011)
    assert render(agg.result(agg.verdict(1.1) or "")).splitlines()[0].endswith(" first; then rank 1 failed")


def test_a_ranks_own_end_stamp_orders_failures_seen_in_one_poll() -> None:
    """Two exit messages read in one poll (fd order, not time order): the ranks' own stamps decide."""
    import time as clock

    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    now = clock.time()
    agg.feed(0, {"t": "exit", "code": 1, "crashed": True, "error": "RuntimeError: boom", "at": now - 0.2}, 5.0)
    agg.feed(1, {"t": "exit", "code": 3, "crashed": False, "error": "", "at": now - 0.5}, 5.0)
    agg.process_exited(0, 1, 5.1)
    agg.process_exited(1, 3, 5.1)
    assert agg.result(CRASH)["crash_order"] == [1, 0]
    assert "CRASH: rank 1 exited with code 3 first" in render(agg.result(CRASH))


def test_pitfalls_merge_across_ranks_and_single_rank_jobs_skip_the_sampler_warning() -> None:
    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    save = {"kind": "torch_save", "site": "t.py:50", "key": "/ckpt/last.pt"}
    loader = {"kind": "dataloader_without_distributed_sampler", "site": "t.py:20", "key": "t.py:20"}
    agg.feed(0, {"t": "exit", "code": 0, "crashed": False, "error": "", "pitfalls": [save, loader]}, 1.0)
    agg.feed(1, {"t": "exit", "code": 0, "crashed": False, "error": "", "pitfalls": [save, loader]}, 1.0)
    warnings = {w["kind"]: w for w in agg.result(OK)["warnings"]}
    assert warnings["torch_save"]["ranks"] == [0, 1] and "/ckpt/last.pt" in warnings["torch_save"]["summary"]
    assert warnings["dataloader_without_distributed_sampler"]["site"] == "t.py:20"
    solo = Aggregator(1, hang_timeout_s=2)
    solo.feed(0, {"t": "exit", "code": 0, "crashed": False, "error": "", "pitfalls": [loader]}, 1.0)
    assert solo.result(OK)["warnings"] == []


def test_a_launched_rank_is_finished_only_when_its_process_ended() -> None:
    # After its exit message a rank may still run atexit handlers (uploading logs): not torn down then.
    agg = Aggregator(1, hang_timeout_s=2, owns_processes=True)
    hello_all(agg)
    agg.feed(0, {"t": "exit", "code": 0, "crashed": False, "error": ""}, 1.0)
    agg.feed(0, None, 1.1)  # its channel closed, the process still runs: its script ended, no hang clock
    assert agg.verdict(60.0) is None
    assert agg.ranks[0].state == "running" and not agg.ranks[0].crashed
    agg.process_exited(0, 0, 61.0)
    assert agg.verdict(61.0) == OK


def test_rank0_supervisor_stops_waiting_for_a_rank_that_never_connected(monkeypatch: Any) -> None:
    """Under a launcher, a rank behind a firewall runs unwatched; rank 0 must still finish (in-process:
    the supervisor thread with a real socket, rank 0 as a real client, rank 1 never connecting)."""
    import ddpdoctor.watch.supervisor as watch
    from ddpdoctor.watch.channel import Client, Server

    monkeypatch.setattr(watch, "UNWATCHED_AFTER_S", 0.5)
    server = Server("127.0.0.1", 0)
    supervisor = watch.RankZeroSupervisor(server, 2, WatchConfig("x.py", [], hang_timeout_s=600))
    supervisor.start()
    client = Client.connect(f"127.0.0.1:{server.port}", 10)
    try:
        client.send({"t": "hello", "rank": 0, "pid": 1, "host": "h", "world_size": 2})
        client.send({"t": "exit", "code": 0, "crashed": False, "error": "", "pitfalls": []})
        assert supervisor.done.wait(30), "rank 0 waited forever for a rank that never connected"
    finally:
        client.close()
        server.close()
    assert supervisor.exit_code == 0
    assert supervisor.agg.ranks[1].error == "never reached the watch channel; it ran unwatched"


def test_three_ranks_two_diverging_differently_are_three_groups() -> None:
    """Ranks 0,2 agree; rank 1 is in barrier; later rank 2 alone changes shape: each group named apart."""
    agg = Aggregator(3, 5)
    hello_all(agg)
    start(agg, 0, rec("all_reduce", 5, "train.py:55", "float32[4]"), 4, 1)
    start(agg, 2, rec("all_reduce", 5, "train.py:55", "float32[4]"), 4, 1)
    start(agg, 1, rec("barrier", 5, "eval.py:40"), 4, 1)
    assert agg.verdict(2) == MISMATCH
    assert divergence_line(agg.divergence()) == ("collective #5: ranks 0,2 in all_reduce float32[4] at train.py:55; "
                                                 "rank 1 in barrier at eval.py:40")

    hang = Aggregator(3, 5)
    hello_all(hang)
    start(hang, 0, rec("all_reduce", 5, "train.py:55", "float32[4]"), 4, 1)
    hang.feed(1, {"t": "beat", "progress": 8, "done": 4, "cur": None, "last": rec("all_reduce", 4, "train.py:55"),
                  "seqs": {"WORLD": 4}}, 1)
    hang.feed(1, {"t": "stack", "stack": ["train.py:70 in main: load()", "data.py:10 in load: time.sleep(9)"]}, 1)
    hang.feed(2, {"t": "beat", "progress": 9, "done": 4, "cur": rec("backward", None, "train.py:50"),
                  "last": rec("all_reduce", 4, "train.py:55"), "seqs": {"WORLD": 4}}, 1)
    assert hang.verdict(10) == HANG
    assert divergence_line(hang.divergence()) == (
        "collective #5: rank 0 in all_reduce float32[4] at train.py:55; rank 1 not in any collective, running "
        "data.py:10; rank 2 in backward at train.py:50")


def test_rank0_supervisor_that_fails_still_lets_rank0_finish(monkeypatch: Any,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A bug inside the supervisor thread must not leave rank 0 waiting for it forever (exit 3, one line)."""
    import ddpdoctor.watch.supervisor as watch
    from ddpdoctor.watch.channel import Server

    def broken(server: Any, agg: Any, poll_s: float) -> None:
        raise KeyError("deliberate")

    monkeypatch.setattr(watch, "_drain", broken)
    server = Server("127.0.0.1", 0)
    try:
        supervisor = watch.RankZeroSupervisor(server, 2, WatchConfig("x.py", [], hang_timeout_s=600))
        supervisor.start()
        assert supervisor.done.wait(30), "rank 0 would wait forever for a dead supervisor"
    finally:
        server.close()
    assert supervisor.exit_code == 3
    assert "the supervisor failed (KeyError" in capsys.readouterr().err


def test_a_rank_that_never_issued_what_the_others_issued_is_behind_only_once_it_moved_on() -> None:
    """NCCL's shape of a skipped collective: ranks 0,2 issued all_reduce #6 (async, pending) and wait; rank 1
    issued 5 and is in its own code. Named as behind, with the skipped call's line. A rank waiting in another
    collective instead (rank 0 alone in an extra barrier) is a divergence, not a skip."""
    agg = Aggregator(3, hang_timeout_s=5)
    hello_all(agg)
    sixth = rec("all_reduce", 6, "skip.py:20", "float32[4]")
    waiting = rec("wait for #6 all_reduce (skip.py:20)", None, "skip.py:23")
    agg.feed(1, {"t": "rec", "recs": [rec("all_reduce", n, "skip.py:20", "float32[4]") for n in range(1, 6)]}, 0.5)
    agg.feed(1, {"t": "beat", "progress": 10, "done": 5, "cur": None, "last": None, "seqs": {"WORLD": 5}}, 0.5)
    for rank in (0, 2):
        agg.feed(rank, {"t": "rec", "recs": [rec("all_reduce", n, "skip.py:20", "float32[4]") for n in range(1, 6)]
                        + [sixth, waiting]}, 1.0)
        agg.feed(rank, {"t": "beat", "progress": 20, "done": 5, "cur": waiting, "last": None, "seqs": {"WORLD": 6},
                        "inflight_n": 1}, 1.0)
    # Rank 1's count is from before the others' #6 arrived: it may have issued #6 since (a short script whose
    # ranks all raised read "rank 1 never issued #1" under torchrun): no claim yet.
    assert agg.result(HANG)["divergence"]["behind"] == []
    agg.feed(1, {"t": "beat", "progress": 10, "done": 5, "cur": None, "last": None, "seqs": {"WORLD": 5}}, 1.5)
    assert agg.verdict(6.5) == HANG
    div = agg.result(HANG)["divergence"]
    assert (div["seq"], div["behind"]) == (6, [{"ranks": [1], "issued": 5, "others": [0, 2], "others_issued": 6,
                                                "op": "all_reduce", "desc": "float32[4]", "site": "skip.py:20",
                                                "busy": None}])
    assert "rank 1 never issued all_reduce #6 float32[4] (ranks 0,2 issued it at skip.py:20)" in render(agg.result(HANG))
    # The same counts with rank 1 inside another recorded call: no "skipped" claim.
    agg.feed(1, {"t": "beat", "progress": 11, "done": 5, "cur": rec("backward", None, "skip.py:30"), "last": None,
                 "seqs": {"WORLD": 5}}, 6.6)
    assert agg.result(HANG)["divergence"]["behind"] == []


def test_the_exit_message_counts_collectives_that_completed_after_the_watchdogs_last_poll() -> None:
    """A healthy NCCL job ends with ``torch.cuda.synchronize()``: its last all_reduces complete after the
    watchdog thread's last poll. The report must not show them as still in flight (an H200 run read 85)."""
    import time

    from ddpdoctor.watch.channel import Server
    from ddpdoctor.watch.progress import InFlight
    from ddpdoctor.watch.recorder import Record, Recorder
    from ddpdoctor.watch.watchdog import Watchdog

    server = Server("127.0.0.1", 0)
    recorder = Recorder(0, 1)
    dog = Watchdog(recorder, None, f"127.0.0.1:{server.port}", exit_on_lost=False)

    class Event:  # a CUDA event whose work ends only once the script has ended (its last synchronize)
        def query(self) -> bool:
            return dog.stopping.is_set()

    try:
        dog.start()
        assert dog.connected.wait(10)
        rec = Record("all_reduce", "WORLD", None, 1, "all_reduce float32[4]", "float32[4]", "train.py:40")
        recorder.completions._track(InFlight(rec, Event(), "gpu"))
        dog.finish(0, crashed=False, error="")
        messages: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while not any(m.get("t") == "exit" for m in messages) and time.monotonic() < deadline:
            messages += [m for _key, m in server.poll(0.1) if m is not None]
    finally:
        server.close()
    beats = [m for m in messages if m.get("t") == "beat"]
    assert beats and beats[-1]["inflight_n"] == 0 and beats[-1]["done"] == 1, beats[-1:]


def test_rank0s_own_crash_waits_briefly_for_the_others_under_a_launcher() -> None:
    """Under torchrun rank 0 is both a rank and the supervisor. When its own script failed first, the verdict
    waits up to OWN_CRASH_SETTLE_S for the other ranks' news (a bug every rank hits is named on every rank, not
    as "torn down"), and not a moment longer once every other rank has reported its end; a crash of another rank
    is reported at once (the launcher tears rank 0 down within 0.1 s of that rank's exit)."""
    import ddpdoctor.watch.supervisor as watch
    from ddpdoctor.watch.channel import Server

    server = Server("127.0.0.1", 0)
    try:
        supervisor = watch.RankZeroSupervisor(server, 2, WatchConfig("x.py", [], hang_timeout_s=600))
        agg = supervisor.agg
        hello_all(agg, 10.0)
        # As supervisor._own_crash feeds it from script.local_end: with the last call that completed.
        agg.feed(0, {"t": "exit", "code": 1, "crashed": True, "error": "ValueError: bad batch",
                     "last": rec("all_reduce", 3, "train.py:38", "float32[8]")}, 10.0)
        assert agg.ranks[0].failed and not agg.ranks[1].finished
        assert "#3 all_reduce float32[8] at train.py:38" in render(agg.result(CRASH))
        assert supervisor._own_crash_settling(10.0 + watch.OWN_CRASH_SETTLE_S / 2)
        assert not supervisor._own_crash_settling(10.0 + watch.OWN_CRASH_SETTLE_S + 0.01)
        agg.feed(1, {"t": "exit", "code": 1, "crashed": True, "error": "ValueError: bad batch"}, 10.1)
        assert not supervisor._own_crash_settling(10.2), "every rank reported: nothing left to wait for"
        other = watch.RankZeroSupervisor(server, 2, WatchConfig("x.py", [], hang_timeout_s=600))
        hello_all(other.agg, 10.0)
        other.agg.feed(1, {"t": "exit", "code": 1, "crashed": True, "error": "ValueError: bad batch"}, 10.0)
        assert not other._own_crash_settling(10.01), "another rank's crash is reported at once"
    finally:
        server.close()


GLOO_PEER_GONE = ("RuntimeError: Connection closed by peer [127.0.0.1]:10117. This is typically caused by a remote "
                  "worker crashing. Check the logs of the remote worker before reporting an error.")


def test_a_rank_that_exits_0_early_is_the_cause_of_the_peer_gone_failure_that_follows() -> None:
    """Rank 1 runs one step fewer (sys.exit(0), a `continue`, fewer batches) and exits 0; rank 0, still in its
    all_reduce, fails on the closed connection. The exit is the cause: rank 0's echo must not be "the crash"."""
    agg = Aggregator(2, hang_timeout_s=15)
    hello_all(agg)
    start(agg, 0, rec("all_reduce", 4, "faulty.py:46", "float32[4]"), 3, 1.0)
    agg.feed(1, {"t": "exit", "code": 0, "crashed": False, "error": ""}, 1.1)
    agg.process_exited(1, 0, 1.11)
    agg.feed(0, {"t": "exit", "code": 1, "crashed": True, "error": f"{GLOO_PEER_GONE} (at faulty.py:46)"}, 1.2)
    agg.process_exited(0, 1, 1.21)
    result = agg.result(agg.verdict(1.3) or "")
    assert result["status"] == CRASH and result["crash_order"] == [0]
    assert result["early_exit"]["rank"] == 1
    text = render(result)
    assert text.splitlines()[0] == (
        "ddpdoctor watch: CRASH: rank 1 exited with code 0 while rank 0 was still in all_reduce #4 at faulty.py:46; "
        "rank 0 then failed (Connection closed by peer): a rank that ends early (fewer batches, an early return or "
        "sys.exit) leaves the others in a collective")
    assert "fix: give every rank the same number of steps" in text and "Join" in text
    assert result["failure"]["summary"].startswith("rank 1 exited with code 0 while rank 0")


def test_a_real_crash_first_keeps_its_place_and_a_clean_end_is_not_an_early_exit() -> None:
    # Rank 1 raised first; rank 2 had ended well before; rank 0's echo follows: rank 1's crash is the cause.
    agg = Aggregator(3, hang_timeout_s=15)
    hello_all(agg)
    agg.feed(2, {"t": "exit", "code": 0, "crashed": False, "error": ""}, 0.5)
    agg.process_exited(2, 0, 0.51)
    agg.feed(1, {"t": "exit", "code": 1, "crashed": True, "error": "ValueError: bad batch (at t.py:20)"}, 1.0)
    agg.process_exited(1, 1, 1.01)
    agg.feed(0, {"t": "exit", "code": 1, "crashed": True, "error": f"{GLOO_PEER_GONE} (at t.py:46)"}, 1.1)
    agg.process_exited(0, 1, 1.11)
    result = agg.result(agg.verdict(1.3) or "")
    assert result["early_exit"] is None
    assert render(result).startswith("ddpdoctor watch: CRASH: rank 1 raised ValueError: bad batch")
    # Every rank exiting 0 is still ok.
    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    for rank in (0, 1):
        agg.feed(rank, {"t": "exit", "code": 0, "crashed": False, "error": ""}, 1.0)
        agg.process_exited(rank, 0, 1.0)
    assert agg.verdict(9.0) == OK and agg.result(OK)["early_exit"] is None


def test_a_rank_busy_in_its_own_code_before_the_call_has_not_reached_it_and_is_not_said_to_skip_it() -> None:
    """Rank 0 sleeps (a checkpoint, an evaluation) before barrier #4 while rank 1 waits in it. Its stack is in its
    own code with nothing pending: it has not reached the barrier; "skipped" and the desync fix were wrong."""
    agg = Aggregator(2, hang_timeout_s=8)
    hello_all(agg)
    start(agg, 1, rec("barrier", 4, "slowrank.py:8"), 3, 1.0)
    agg.feed(0, {"t": "beat", "progress": 6, "done": 3, "cur": None, "last": None, "seqs": {"WORLD": 3}}, 1.5)
    assert agg.verdict(9.6) == HANG
    agg.feed(0, {"t": "stack", "stack": ["slowrank.py:7 in <module>: time.sleep(60)"],
                 "frames": [["slowrank.py", 7, "<module>", "time.sleep(60)"]]}, 9.7)
    result = agg.result(HANG)
    (behind,) = result["divergence"]["behind"]
    assert behind["ranks"] == [0] and behind["busy"] == "slowrank.py:7"
    assert result["failure"]["class"] == "hang" and result["failure"]["user_code"]
    text = render(result)
    assert ("rank 0 never issued barrier #4 (rank 1 issued it at slowrank.py:8): 3 issued on WORLD against 4; it has "
            "not reached it: busy in its own code at slowrank.py:7 (not in any collective, nothing pending)") in text
    assert "skipped" not in text and "every rank must issue the same collectives" not in text
    assert "fix: if the phase at slowrank.py:7 (an evaluation, a checkpoint, loading data) is expected to take longer " \
           "than 8 s, raise --hang-timeout" in text
    # The same rank a few lines below the call in its file went past it: that is a skip, as before.
    agg.feed(0, {"t": "stack", "stack": ["slowrank.py:12 in <module>: time.sleep(60)"],
                 "frames": [["slowrank.py", 12, "<module>", "time.sleep(60)"]]}, 9.8)
    result = agg.result(HANG)
    assert result["divergence"]["behind"][0]["busy"] is None and result["failure"]["class"] == "desync"
    assert "a collective skipped there" in render(result)


def test_one_rank_working_alone_while_the_other_waits_in_ddps_backward_is_told_what_to_raise() -> None:
    """Rank 0 evaluates alone after step 4 while rank 1 waits in the next backward (DDP's gradient all_reduce is
    issued by the reducer, not counted as a call): nothing diverges by count, rank 0 is outside any collective.
    The fix named the line only; an evaluation on one rank on purpose also needs the two timeouts raised."""
    agg = Aggregator(2, hang_timeout_s=5)
    hello_all(agg)
    start(agg, 1, rec("backward", None, "longeval.py:12"), 4, 1.0)
    agg.feed(0, {"t": "beat", "progress": 9, "done": 4, "cur": None, "last": None, "seqs": {"WORLD": 4},
                 "steps": {"steps": 4, "window": 4, "boundary": "optimizer", "step_us": 900.0, "wait_us": 400.0}}, 1.5)
    assert agg.verdict(6.6) == HANG
    agg.feed(0, {"t": "stack", "stack": ["longeval.py:16 in <module>: evaluate(model)"],
                 "frames": [["longeval.py", 16, "<module>", "evaluate(model)"]]}, 6.7)
    result = agg.result(HANG)
    assert result["divergence"] is None and [o["rank"] for o in result["outside"]] == [0]
    text = render(result)
    assert "rank 0: in its own code at longeval.py:16: evaluate(model)" in text
    # No collective of its script completed, but its steps did: the table says so rather than "-" alone.
    assert re.search(r"^ +0 +running +- \(4 steps done\) +its own code", text, re.M), text
    assert ("if it is work one rank does alone on purpose (an evaluation, a checkpoint), the others wait for it in "
            "their next collective: raise --hang-timeout above its duration (5 s now), and init_process_group's "
            "timeout") in text


GLOO_ABORT = """rank 0 step 4
terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:510] op.preamble.length <= op.nbytes. 28 \
vs 16. Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?
"""


def test_a_rank_killed_by_a_signal_is_explained_by_its_own_last_output() -> None:
    """gloo aborts the receiving rank of a size mismatch (SIGABRT) before its mismatched call is reported: the
    reason is only in that rank's output. explain reads it; only a specific diagnosis is kept."""
    from ddpdoctor.watch.known_errors import known_cause_in_output

    known = known_cause_in_output(GLOO_ABORT, 0)
    assert known is not None and known["id"] == "collective-mismatch" and known["source"] == "output"
    assert "Received data size doesn't match expected size" in known["line"]
    assert known_cause_in_output("rank 0 step 4\nloss 0.3\n", 0) is None and known_cause_in_output("", 0) is None
    agg = Aggregator(2, hang_timeout_s=15)
    hello_all(agg)
    agg.feed(0, None, 1.0)
    agg.process_exited(0, -6, 1.01)
    agg.feed(1, {"t": "exit", "code": 1, "crashed": True, "error": f"{GLOO_PEER_GONE} (at mism.py:11)"}, 1.1)
    agg.process_exited(1, 1, 1.11)
    result = agg.result(agg.verdict(1.2) or "")
    result["known_cause"] = known  # what supervisor.write_result adds for a rank killed by a signal
    text = render(result)
    assert text.startswith("ddpdoctor watch: CRASH: rank 0 was killed by signal 6 (SIGABRT)")
    assert "rank 0's last output says: what():  [enforce fail at" in text
    assert "what that means (ddpdoctor explain: collective-mismatch): Ranks called different collectives" in text


def test_ranks_that_each_exit_with_the_same_code_before_any_collective_did_not_follow_each_other() -> None:
    """argparse rejects an argument on every rank (exit 2, its message on stderr only): "then rank 1 failed" read
    as if rank 1 were rank 0's victim. Only without error text, signal or any collective issued."""
    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    for rank, at in ((0, 1.0), (1, 1.01)):
        agg.feed(rank, {"t": "exit", "code": 2, "crashed": False, "error": ""}, at)
        agg.process_exited(rank, 2, at)
    assert render(agg.result(agg.verdict(1.1) or "")).splitlines()[0] == (
        "ddpdoctor watch: CRASH: rank 0 exited with code 2 first; rank 1 exited with the same code (each rank ended "
        "so on its own, before any collective: not a consequence of rank 0's exit)")
    # After a collective, the second exit may well follow the first: the old wording stays.
    agg = Aggregator(2, hang_timeout_s=2)
    hello_all(agg)
    for rank, at in ((0, 1.0), (1, 1.01)):
        agg.feed(rank, {"t": "beat", "progress": 2, "done": 1, "cur": None, "last": None, "seqs": {"WORLD": 1}}, 0.5)
        agg.feed(rank, {"t": "exit", "code": 2, "crashed": False, "error": ""}, at)
        agg.process_exited(rank, 2, at)
    assert render(agg.result(agg.verdict(1.1) or "")).splitlines()[0] == (
        "ddpdoctor watch: CRASH: rank 0 exited with code 2 first; then rank 1 failed")


def test_a_script_started_by_a_relative_path_is_named_by_that_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ddpdoctor watch sub/train.py`: the code's file name is the relative path; the report said `train.py:5`,
    which does not say which of a project's train.py files failed."""
    from ddpdoctor.watch import recorder

    monkeypatch.setattr(recorder, "_site_names", {})
    monkeypatch.chdir(tmp_path)
    assert recorder.site_name("sub/train.py") == "sub/train.py"
    assert recorder.site_name("./sub/../train.py") == "train.py"
    assert recorder.site_name(str(tmp_path / "pkg" / "model.py")) == "pkg/model.py"  # inside the working folder
    assert recorder.site_name("/opt/elsewhere/train.py") == "train.py"  # outside it: the base name, as before
    assert recorder.site_name("<string>") == "<string>"


def test_every_rank_waiting_in_the_same_collective_blames_the_transport_not_the_code() -> None:
    """Two hosts, the link between them shaped to 2 Mbit/s (an explorer's lab run): both ranks sat in the same
    all_reduce #9 and the report said "a collective inside `if rank == ...` must run on every rank", user_code
    true. A call every rank issued alike cannot be skipped or reordered: the collective itself does not finish."""
    agg = Aggregator(2, hang_timeout_s=8)
    for rank, host in ((0, "nodeA"), (1, "nodeB")):
        agg.feed(rank, {"t": "hello", "rank": rank, "pid": 100 + rank, "host": host}, 0.0)
        start(agg, rank, rec("all_reduce", 9, "train.py:38", sig="float32[2000000]"), 8, 1.0)
    for rank in (0, 1):  # still beating: alive and reporting, only the call does not end
        agg.feed(rank, {"t": "beat", "progress": 17, "done": 8, "cur": rec("all_reduce", 9, "train.py:38",
                                                                          sig="float32[2000000]"),
                        "last": None, "seqs": {"WORLD": 9}}, 8.5)
    assert agg.verdict(9.6) == HANG
    result = agg.result(HANG)
    failure = result["failure"]
    assert (failure["class"], failure["user_code"]) == ("hang", False)
    assert failure["same_call"]["ranks"] == [0, 1] and failure["same_call"]["seq"] == 9
    text = render(result)
    assert ("ranks 0-1 on nodeA, nodeB all wait in all_reduce #9 float32[2000000] at train.py:38: the same call, "
            "issued alike, and it has not completed") in text
    assert "conclusion: every rank is in the same all_reduce #9 and it does not complete" in text
    assert "fix: the collective itself does not finish, not the order of your code's collectives" in text
    assert "`ddpdoctor bench --pairs` names a slow or shaped link" in text and "longer than 8 s" in text
    assert "if rank ==" not in text
    # The Flight Recorder also counts DDP's gradient all_reduces, which watch does not see: when its dumps (from
    # every rank) say the collectives differ, the code is in question after all. Agreeing, or missing a rank's
    # dump, it changes nothing.
    from copy import deepcopy

    from ddpdoctor.watch.verdict import weigh_flight_recorder

    for fr in ({"status": "pass", "summary": "every rank issued the same collectives", "missing_ranks": []},
               {"status": "fail", "summary": "no dump from rank 1", "missing_ranks": [1]}):
        kept = deepcopy(failure)
        weigh_flight_recorder(kept, fr)
        assert kept == failure
    path = "/tmp/bundle/flight_recorder"
    weigh_flight_recorder(failure, {"status": "fail", "summary": "rank 1 never issued collective #10 (all_reduce)",
                                    "missing_ranks": [], "path": path})
    assert failure["user_code"] is True
    assert failure["evidence"][-1].endswith("found the ranks' collectives differ: rank 1 never issued collective #10 "
                                            "(all_reduce)")
    text = render(result)
    assert ("conclusion: every rank is in the same all_reduce #9 by watch's count, but the Flight Recorder found the "
            "ranks' collectives differ") in text
    assert f"fix: `ddpdoctor fr {path}` names the first collective the ranks issued differently" in text
    assert "bench --pairs" not in text
    # One rank elsewhere (another call, or its own code) is not this case: the code's order is in question again.
    agg.feed(1, {"t": "beat", "progress": 19, "done": 9, "cur": rec("barrier", 10, "train.py:40"),
                 "last": None, "seqs": {"WORLD": 10}}, 9.7)
    assert agg.result(HANG)["failure"].get("same_call") is None
