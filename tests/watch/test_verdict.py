"""Failure classes told apart by evidence (issue 32), as pure functions of the supervisor's picture.

The aggregator is fed the messages ranks on two hosts send (no processes): a host whose ranks vanish at
once, a host whose ranks go silent with their connections open, a crash with an exit status, a desync of
ranks that all report. What a user reads (the report) and what a program reads (``failure`` in the JSON)
are both checked; the real two-host jobs are in tests/lab/.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from ddpdoctor.watch.aggregate import CRASH, HANG, MISMATCH, Aggregator
from ddpdoctor.watch.channel import Server
from ddpdoctor.watch.recorder import Recorder
from ddpdoctor.watch.report import render
from ddpdoctor.watch.verdict import HOST_WINDOW_S, clock, lost_contact
from ddpdoctor.watch.watchdog import Watchdog
from tests.watch.test_aggregate import rec

HOST_OF = {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
ECHO = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.77.0.2]:1234"


def two_hosts(now: float = 0.0) -> Aggregator:
    """Four ranks under a launcher (ddpdoctor did not start them), two per host, each in all_reduce #5."""
    agg = Aggregator(4, hang_timeout_s=8)
    agg.here = "nodeA"
    for rank, host in HOST_OF.items():
        agg.feed(rank, {"t": "hello", "rank": rank, "pid": 100 + rank, "host": host}, now)
    for rank in HOST_OF:
        beat(agg, rank, now)
    return agg


def beat(agg: Aggregator, rank: int, now: float, cur: dict[str, Any] | None = None, seq: int = 5) -> None:
    record = cur or rec("all_reduce", seq, "train.py:30", "float32[4]")
    agg.feed(rank, {"t": "rec", "recs": [record]} if record.get("seq") else {"t": "beat", "progress": 0, "cur": None,
                                                                              "last": None}, now)
    agg.feed(rank, {"t": "beat", "progress": 9, "done": 4, "cur": record, "last": None, "seqs": {"WORLD": seq}}, now)


def test_a_host_whose_ranks_vanish_together_is_lost_and_no_code_is_blamed() -> None:
    agg = two_hosts()
    for now in (1.0, 2.0, 3.0):
        for rank in HOST_OF:
            agg.feed(rank, {"t": "beat", "progress": 9, "done": 4, "cur": rec("all_reduce", 5, "train.py:30"),
                            "last": None, "seqs": {"WORLD": 5}}, now)
    # nodeB's two connections close within milliseconds, no exit message; rank 1's gloo call then fails.
    agg.feed(2, None, 3.50)
    assert agg.host_settling(3.51)  # rank 3 may follow: wait before naming a single rank
    agg.feed(3, None, 3.52)
    assert not agg.host_settling(3.53)
    agg.feed(1, {"t": "exit", "code": 1, "crashed": True, "error": ECHO}, 3.6)
    assert agg.verdict(20.0) == CRASH
    result = agg.result(CRASH)
    failure = result["failure"]
    assert failure["class"] == "host_lost" and failure["user_code"] is False
    assert [(h["host"], h["ranks"]) for h in failure["lost_hosts"]] == [("nodeB", [2, 3])]
    assert result["hosts"] == [{"host": "nodeA", "ranks": [0, 1]}, {"host": "nodeB", "ranks": [2, 3]}]
    text = render(result)
    assert text.startswith("ddpdoctor watch: HOST LOST: host nodeB lost: every one of its ranks (ranks 2-3) vanished")
    assert "hosts: nodeA: ranks 0-1; nodeB: ranks 2-3" in text
    # Evidence first (who, what, when), then the conclusion, then the host's own next step.
    assert text.index("what was seen (who reported what, when):") < text.index("conclusion:") < text.index("next step:")
    assert "ranks 2-3 on nodeB closed at " + clock(3.5 + agg.wall_offset) in text
    assert "rank 1 then failed" in text and "dmesg -T` on nodeB" in text
    for blame in ("rank-dependent branch", "skipped", "running its own code", "now running"):
        assert blame not in text
    # 20 ms apart: one rank killed and its launcher's teardown of the other look the same from here (an
    # explorer's lab run: an OOM-style SIGKILL of rank 2 alone read as the host lost); the report says so.
    assert ("rank 2's closed first: a launcher ends a host's other ranks once one of them dies (torchrun's agent "
            "checks every 0.1 s), so one rank killed on nodeB (the OOM killer) looks the same from here") in text


def test_a_single_rank_that_vanishes_is_a_crash_of_that_rank_not_a_host() -> None:
    agg = two_hosts()
    agg.feed(2, None, 3.5)
    assert agg.host_settling(3.6) and not agg.host_settling(3.5 + HOST_WINDOW_S + 0.1)
    assert agg.verdict(20.0) == CRASH
    result = agg.result(CRASH)
    assert result["failure"]["class"] == "crash"
    assert render(result).startswith("ddpdoctor watch: CRASH: rank 2 on nodeB lost its connection")
    # The next step names where the rank's output is kept: under --quiet there is no output "above" to read.
    step = result["failure"]["next_step"]
    assert "output_rank_N.txt in the evidence folder" in step and "above" not in step
    assert f"next step: {step}" in render(result)  # the text says it too, not only the JSON


def test_a_silent_host_with_open_connections_is_a_partition_with_its_last_report_time() -> None:
    agg = two_hosts()
    for now in (1.0, 2.0):
        for rank in HOST_OF:
            beat(agg, rank, now)
    for now in range(3, 13):  # nodeA's ranks keep beating from inside all_reduce #5; nodeB is silent
        for rank in (0, 1):
            beat(agg, rank, float(now))
    assert agg.verdict(12.0) == HANG
    result = agg.result(HANG)
    failure = result["failure"]
    assert failure["class"] == "partition" and failure["user_code"] is False
    assert [(h["host"], h["ranks"], h["last_report"]) for h in failure["silent_hosts"]] == [
        ("nodeB", [2, 3], clock(2.0 + agg.wall_offset))]
    text = render(result)
    assert text.startswith("ddpdoctor watch: LINK OR PARTITION: no progress for 8 s and nodeB stopped answering")
    assert f"no report from ranks 2-3 on nodeB since {clock(2.0 + agg.wall_offset)}, 10 s before the verdict" in text
    assert "ranks 0-1 on nodeA kept reporting until the verdict" in text
    assert "ip -s link" in text and "not a fault in the training code" in text
    # The table says what is known about a silent rank: its last report's age, not a place.
    row = next(line for line in text.splitlines() if line.lstrip().startswith("2 "))
    assert "nodeB" in row and "silent" in row and "no report since" in row and "10 s before the verdict" in row
    assert [r["state"] for r in result["ranks"]] == ["waiting", "waiting", "silent", "silent"]
    for blame in ("rank-dependent branch", "skipped", "running its own code", "make the branch"):
        assert blame not in text


def test_a_desync_of_reporting_ranks_names_each_host_and_points_at_the_code() -> None:
    agg = two_hosts()
    agg.feed(0, {"t": "rec", "recs": [rec("barrier", 6, "train.py:40")]}, 1.0)
    for rank in (1, 2, 3):
        agg.feed(rank, {"t": "rec", "recs": [rec("all_reduce", 6, "train.py:30", "float32[4]")]}, 1.0)
    assert agg.verdict(1.0) == MISMATCH
    result = agg.result(MISMATCH)
    assert result["failure"]["class"] == "desync" and result["failure"]["user_code"] is True
    text = render(result)
    assert ("collective #6: rank 0 on nodeA in barrier at train.py:40; rank 1 on nodeA, ranks 2-3 on nodeB in "
            "all_reduce float32[4] at train.py:30") in text
    assert "rank-dependent branch" in text


def test_a_hang_with_one_host_silent_and_the_other_reporting_never_blames_a_skip() -> None:
    """A rank whose last report is old is not 'behind' (its issue count is old news) and never 'running
    its own code': the old wording sent users to their code for a network fault."""
    agg = two_hosts()
    for rank in (0, 1):
        agg.feed(rank, {"t": "rec", "recs": [rec("all_reduce", 6, "train.py:30", "float32[4]")]}, 1.0)
    for now in range(2, 12):
        for rank in (0, 1):
            beat(agg, rank, float(now), seq=6)
    assert agg.verdict(12.0) == HANG
    result = agg.result(HANG)
    assert result["divergence"] is None or not result["divergence"]["behind"]
    text = render(result)
    assert "never issued" not in text and "its own code" not in text


def test_one_host_jobs_keep_their_wording() -> None:
    agg = Aggregator(2, hang_timeout_s=8)
    for rank in (0, 1):
        agg.feed(rank, {"t": "hello", "rank": rank, "pid": 10 + rank, "host": "h"}, 0.0)
    agg.feed(0, {"t": "exit", "code": 3, "crashed": False, "error": ""}, 1.0)
    assert agg.verdict(20.0) == CRASH
    result = agg.result(CRASH)
    assert result["failure"]["class"] == "crash" and result["hosts"] == [{"host": "h", "ranks": [0, 1]}]
    text = render(result)
    assert text.startswith("ddpdoctor watch: CRASH: rank 0 exited with code 3") and "hosts:" not in text


def test_the_cut_off_hosts_own_verdict_names_the_lost_host_and_its_ranks() -> None:
    failure = lost_contact("nodeB", [2, 3], "10.77.0.1", {"nodeA": [0, 1], "nodeB": [2, 3]}, 1000.0, 8.2)
    assert failure["class"] == "lost_contact"
    assert failure["summary"] == (f"lost contact with nodeA (the store and the watch supervisor at 10.77.0.1, "
                                  f"ranks 0-1) at {clock(1000.0)}")
    text = render({"status": "lost_contact", "host": "nodeB", "world_size": 4, "hang_timeout_s": 8, "failure": failure,
                   "hosts": failure["hosts"], "ranks": []})
    assert text.startswith("ddpdoctor watch on nodeB: LOST CONTACT: lost contact with nodeA")
    assert "no word from nodeA's watch supervisor since" in text and "ip -s link" in text
    assert f"since {clock(1000.0)} (8 s before this verdict); ranks 2-3 on nodeB were still running" in text
    # One rank: "was"; and the wait is not called "--hang-timeout" (a closed connection decides within a second).
    one = lost_contact("nodeC", [4], "10.77.0.1", {"nodeA": [0, 1], "nodeC": [4]}, 1000.0, 1.2)
    assert one["evidence"] == [f"no word from nodeA's watch supervisor since {clock(1000.0)} (1 s before this "
                               "verdict); rank 4 on nodeC was still running"]


def _armed_watchdog(server: Server, lost_after_s: float, on_lost: Any) -> Watchdog:
    """Rank 2's watchdog, connected to ``server`` and armed by one ping naming two hosts (nodeA: ranks 0-1)."""
    dog = Watchdog(Recorder(2, 4), None, f"127.0.0.1:{server.port}", exit_on_lost=False, lost_after_s=lost_after_s,
                   on_lost=on_lost)
    dog.start()
    deadline = time.monotonic() + 30
    while 2 not in server.ranks and time.monotonic() < deadline:
        server.poll(0.05)
    server.keepalive({"nodeA": [0, 1], socket.gethostname(): [2, 3]}, decided=False)
    return dog


def test_a_rank_calls_its_lost_contact_verdict_when_the_supervisors_pings_stop() -> None:
    """Real sockets: the supervisor pings once (arming the rank), then goes silent with its connection open
    (as behind a cut link); the rank's watchdog calls on_lost after lost_after_s, with the rank map."""
    server = Server("127.0.0.1", 0)
    called: list[tuple[float, float, dict[str, list[int]]]] = []
    done = threading.Event()

    def on_lost(since: float, silent: float, hosts: dict[str, list[int]]) -> None:
        called.append((since, silent, hosts))
        done.set()

    dog = _armed_watchdog(server, 1.0, on_lost)
    try:
        started = time.monotonic()
        assert done.wait(30), "on_lost was never called"
        assert time.monotonic() - started >= 0.9
        since, silent, hosts = called[0]
        assert abs(time.time() - silent - since) < 5
        assert silent >= 1.0 and hosts == {"nodeA": [0, 1], socket.gethostname(): [2, 3]}
    finally:
        dog.stopping.set()
        server.close()


def test_a_rank_read_from_outside_has_left_the_call_it_last_reported_only_when_no_frame_is_there() -> None:
    """py-spy's stack of a rank that took the GIL right after init_process_group (it could not report the
    call's end): the stale call goes, so the wait is read from the stack, not as "in the rendezvous"."""
    from ddpdoctor.watch.waits import moved_on

    init = {"op": "init_process_group", "site": "gil_hog.py:5"}
    assert moved_on(init, ["/usr/lib/python3.11/runpy.py:198", "/tmp/x/gil_hog.py:10"])
    # Still inside the call: a frame at its site (named from another working directory).
    assert not moved_on(init, ["/tmp/x/gil_hog.py:5", "/venv/torch/distributed/distributed_c10d.py:1500"])
    assert not moved_on({"op": "all_reduce", "site": "sub/train.py:40"}, ["/work/sub/train.py:40"])
    # Nothing to go on: keep what the rank said.
    assert not moved_on(None, ["/tmp/x/gil_hog.py:10"]) and not moved_on(init, [])


def test_a_rank_the_supervisor_ended_after_its_verdict_does_not_report_it_lost() -> None:
    """Three hosts, nodeB lost: the rank on nodeC failed first (its collective's peer reset the connection), and
    its watchdog thread had stopped when nodeA's supervisor, done with its verdict, sent every rank its exit and
    closed. The rank read the exit, then the close, and wrote "LOST CONTACT with nodeA" (an explorer's lab run,
    2 of 4 three-host runs). Real sockets; the closing sequence as the supervisor does it."""
    server = Server("127.0.0.1", 0)
    called: list[float] = []
    dog = _armed_watchdog(server, 30.0, lambda since, silent, hosts: called.append(silent))
    try:
        deadline = time.monotonic() + 30
        while dog.sup_heard is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dog.sup_heard is not None, "the ping never armed the watchdog"
        dog.stopping.set()  # the script failed: finish() stops the thread first ...
        dog.join(timeout=5)
        server.send(2, {"t": "exit", "code": 1})  # ... while the supervisor ends every rank and closes
        server.close()
        time.sleep(0.2)
        dog.finish(1, True, "RuntimeError: Connection closed by peer (at train.py:9)")
        assert called == [], "a rank the supervisor ended reported it lost"
    finally:
        dog.stopping.set()
        server.close()


def test_a_peer_gone_crash_after_a_whole_host_went_silent_is_that_host_or_its_link() -> None:
    """The watch port blocked on nodeB (an explorer's lab run): nodeB's ranks went silent, nodeB then ended its
    own ranks on its lost-contact verdict, and rank 0's collective failed on the connection they closed. The
    report said "CRASH: rank 0 raised RuntimeError: Connection closed by peer", user_code true, though the JSON
    listed nodeB's ranks silent for 9.6 s: the silence came first, the echo is its consequence."""
    agg = two_hosts()
    for now in range(1, 10):  # nodeA's ranks keep beating; nodeB is silent from 0.0 on
        for rank in (0, 1):
            beat(agg, rank, float(now))
    agg.feed(0, {"t": "exit", "code": 1, "crashed": True, "error": ECHO + " (at train.py:30)"}, 9.6)
    for now in range(10, 18):
        beat(agg, 1, float(now))
    assert agg.verdict(17.7) == CRASH
    result = agg.result(CRASH)
    failure = result["failure"]
    assert (failure["class"], failure["user_code"]) == ("partition", False)
    assert [(h["host"], h["ranks"]) for h in failure["silent_hosts"]] == [("nodeB", [2, 3])]
    text = render(result)
    assert text.startswith("ddpdoctor watch: LINK OR PARTITION: nodeB stopped answering"), text
    assert f"no report from ranks 2-3 on nodeB since {clock(0.0 + agg.wall_offset)}" in text
    assert "rank 0 then failed, a peer gone: rank 0 raised RuntimeError" in text
    assert "ip -s link" in text and "fix the first failure" not in text
    # The same echo with nodeB still reporting is a crash, as before.
    agg = two_hosts()
    for now in range(1, 10):
        for rank in HOST_OF:
            beat(agg, rank, float(now))
    agg.feed(0, {"t": "exit", "code": 1, "crashed": True, "error": ECHO + " (at train.py:30)"}, 9.6)
    for now in range(10, 18):
        for rank in (1, 2, 3):
            beat(agg, rank, float(now))
    assert agg.verdict(17.7) == CRASH and agg.result(CRASH)["failure"]["class"] == "crash"
