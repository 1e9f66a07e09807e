"""The env check's clock comparison (issue 32): pure functions of each rank's facts, and the exchange through a
real TCPStore between two threads (no processes: the real two-host job with one host's clock 90 s ahead is in
tests/lab/test_check_lab.py)."""

from __future__ import annotations

import threading
import time
from typing import Any
from unittest import mock

from ddpdoctor.check import CheckContext, CheckOptions
from ddpdoctor.checks.env import CLOCK_WARN_S, clock_finding, measure_clock
from ddpdoctor.findings import RankInfo


def fact(host: str, offset: float | None, error: float = 0.01) -> dict[str, Any]:
    clock = None if offset is None else {"offset_s": offset, "error_s": error}
    return {"host": host, "clock": clock}


def test_a_host_whose_clock_is_90_s_ahead_is_named_with_its_offset() -> None:
    found = clock_finding({0: fact("nodea", None), 1: fact("nodea", 0.001), 2: fact("nodeb", 90.2),
                           3: fact("nodeb", 89.9)})
    assert found is not None and found.status == "warn" and found.ranks == [2, 3]
    assert found.summary == "nodeb: clock 90 s ahead of nodea (rank 0's host)"
    assert "chronyc tracking" in found.remedy and "monotonic clocks" in found.remedy
    assert found.details["offsets_s"] == {"nodea": 0.001, "nodeb": 90.05}
    assert found.details["reference_host"] == "nodea" and found.details["threshold_s"] == CLOCK_WARN_S


def test_a_clock_behind_says_behind_and_a_small_offset_or_a_wide_error_bound_is_not_reported() -> None:
    behind = clock_finding({0: fact("a", None), 1: fact("b", -2.5)})
    assert behind is not None and behind.summary == "b: clock 2.5 s behind a (rank 0's host)"
    assert clock_finding({0: fact("a", None), 1: fact("b", 0.4)}) is None
    # 1.5 s measured, but the round trip allows 0.6 s of it to be the measurement: not shown as a fault.
    assert clock_finding({0: fact("a", None), 1: fact("b", 1.5, error=0.6)}) is None
    assert clock_finding({0: fact("a", None), 1: fact("b", None)}) is None  # rank 0 did not answer in time


def context(rank: int, store: Any) -> CheckContext:
    peers = {r: RankInfo(r, 0, "h", 1) for r in (0, 1)}
    return CheckContext(rank=rank, world_size=2, local_rank=0, local_world_size=1, host="h", pid=1,
                        launcher="local", backend="gloo", device="cpu", master_addr="127.0.0.1", master_port=0,
                        process_group=None, store=store, options=CheckOptions(timeout_s=20),
                        deadline=time.monotonic() + 20, peers=peers)


def test_the_exchange_through_a_real_store_measures_a_rank_whose_clock_is_ahead() -> None:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False)
    real_time = time.time
    answers: list[Any] = []
    rank0 = threading.Thread(target=lambda: answers.append(measure_clock(context(0, server))))
    rank0.start()
    # Rank 1 (this thread) reads a wall clock 90 s ahead, as under libfaketime; rank 0's thread reads the real
    # one. time.time is patched (one process cannot have two clocks): the real skew is in tests/lab/.

    def skewed() -> float:
        return real_time() + (0.0 if threading.current_thread() is rank0 else 90.0)

    with mock.patch("ddpdoctor.checks.env.time.time", skewed):
        measured = measure_clock(context(1, client))
    rank0.join(timeout=20)
    assert answers == [None]  # rank 0 measures nobody against itself
    assert measured is not None
    assert abs(measured["offset_s"] - 90.0) <= measured["error_s"] + 0.05
    assert 0 <= measured["error_s"] < 2


def test_clocks_in_step_pass_with_the_offsets_in_the_json() -> None:
    from ddpdoctor.checks.env import FACTS, _combine
    from ddpdoctor.findings import Finding

    def rank(r: int, host: str, offset: float | None) -> Finding:
        details = {"vars": {}, "versions": {"torch": "2.13.0", "python": "3.11.7"}, "world_size": 2,
                   "local_world_size": 1, "host": host, "clock": None if offset is None else
                   {"offset_s": offset, "error_s": 0.002}}
        return Finding("env", "pass", FACTS, [r], details=details)

    out = _combine({0: [rank(0, "a", None)], 1: [rank(1, "b", 0.03)]}, {})
    assert [f.status for f in out] == ["pass"]
    assert out[0].details["clock_offsets_s"] == {"b": 0.03}
