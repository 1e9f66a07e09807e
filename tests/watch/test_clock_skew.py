"""A host whose clock is off (issue 32): watch's times are the supervisor's, never a rank's wall clock.

"No report since HH:MM:SS" is when the supervisor last *received* something from the rank (its own
monotonic clock turned into wall time), and a rank's "my script ended at" stamp is read against the rank's
own "sent at" stamp, so a rank 90 s behind is neither shown as silent for 90 s nor as the first to fail.
"""

from __future__ import annotations

import time

from ddpdoctor.watch.aggregate import CRASH, HANG
from ddpdoctor.watch.report import render
from ddpdoctor.watch.verdict import clock
from tests.watch.test_verdict import HOST_OF, beat, two_hosts


def test_no_report_since_is_the_supervisors_receive_time_whatever_the_ranks_clock() -> None:
    agg = two_hosts()
    for now in (1.0, 2.0):
        for rank in HOST_OF:
            beat(agg, rank, now)
    for now in range(3, 13):
        for rank in (0, 1):
            beat(agg, rank, float(now))
    assert agg.verdict(12.0) == HANG
    text = render(agg.result(HANG))
    # 2.0 is when the supervisor last heard nodeB (its monotonic clock); the ranks' clocks play no part.
    assert f"no report from ranks 2-3 on nodeB since {clock(2.0 + agg.wall_offset)}, 10 s before the verdict" in text


def test_a_rank_whose_clock_is_90_s_behind_is_not_taken_for_the_first_to_fail() -> None:
    agg = two_hosts()
    wall = time.time()
    # Rank 0 (nodeA, the supervisor's clock) ended 0.5 s before it wrote; rank 2 (nodeB, 90 s behind) 0.2 s.
    agg.feed(0, {"t": "exit", "code": 1, "crashed": True, "error": "RuntimeError: boom", "at": wall - 0.5,
                 "sent": wall}, 5.0)
    agg.feed(2, {"t": "exit", "code": 1, "crashed": True, "error": "RuntimeError: echo",
                 "at": wall - 90 - 0.2, "sent": wall - 90}, 5.0)
    for rank in (0, 2):
        agg.process_exited(rank, 1, 5.1)
    result = agg.result(CRASH)
    assert result["crash_order"][:2] == [0, 2]  # without "sent": rank 2 would be taken as 60 s earlier
    assert render(result).startswith("ddpdoctor watch: CRASH: rank 0")
