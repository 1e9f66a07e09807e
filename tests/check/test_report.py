"""Rendering is a pure function of findings: merged, root cause first, outliers tagged, JSON contract."""

from __future__ import annotations

import json

from ddpdoctor.check import collapse
from ddpdoctor.check.model import Report
from ddpdoctor.check.report import format_ranks, render_table
from ddpdoctor.findings import Finding, RankInfo
from ddpdoctor.ranks import format_rank_list

PEERS = [RankInfo(r, r % 4, "node-a" if r < 4 else "node-b", 1000 + r) for r in range(8)]


def make_report(findings: list[Finding]) -> Report:
    return Report(8, "nccl", "torchrun", PEERS, findings, ["env", "port", "barrier", "connectivity"], 2.5)


def test_identical_outcomes_collapse_into_one_row_listing_all_ranks() -> None:
    per_rank = [Finding("port", "pass", "reached", [r]) for r in range(8)]
    merged = collapse(per_rank)
    assert len(merged) == 1 and merged[0].ranks == list(range(8))
    table = render_table(make_report(merged))
    assert "all (0-7)" in table


def test_outliers_are_tagged_with_host_and_local_rank() -> None:
    assert format_ranks([5], 8, {p.rank: p for p in PEERS}) == "5 [node-b:1]"
    assert format_ranks([0, 1, 2, 3, 4, 6], 8, {}) == "0-4,6"


def test_rank_lists_compress_to_ranges() -> None:
    assert format_rank_list([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"


def test_root_cause_first_then_failures_in_check_order_and_every_failure_has_its_remedy() -> None:
    findings = [
        Finding("env", "pass", "ok", list(range(8))),
        Finding("connectivity", "fail", "all_reduce failed", [0, 1, 2], "check the links"),
        Finding("env", "fail", "NCCL_IB_DISABLE differs", [3], "export the same value"),
        Finding("barrier", "fail", "rank 6 did not report", [6], "look at rank 6", {"unreported": True}),
        Finding("port", "warn", "slow connect", [7], "check the path"),
    ]
    report = make_report(findings)
    order = [f.summary for f in report.ordered()]
    assert order[0] == "rank 6 did not report"
    assert order[1:3] == ["NCCL_IB_DISABLE differs", "all_reduce failed"]
    assert order[-1] == "ok"
    table = render_table(report)
    for remedy in ("check the links", "export the same value", "look at rank 6", "check the path"):
        assert remedy in table
    assert table.index("rank 6 did not report") < table.index("all_reduce failed")
    assert "Result: FAIL" in table


def test_json_follows_the_contract() -> None:
    report = make_report([Finding("barrier", "fail", "rank 6 did not report", [6], "x", {"unreported": True}),
                          Finding("env", "warn", "w", [1], "y")])
    data = json.loads(json.dumps(report.to_json()))
    assert data["tool"] == "ddpdoctor" and data["status"] == "fail" and data["world_size"] == 8
    assert data["backend"] == "nccl"
    assert data["ranks"][6] == {"rank": 6, "local_rank": 2, "host": "node-b", "pid": 1006}
    first = data["findings"][0]
    assert set(first) == {"check", "status", "summary", "ranks", "remedy", "details", "caused_by"}
    assert first["caused_by"] is None  # a root cause (tests/check/test_causes.py folds the others)
    assert first["ranks"] == [6] and "did not report" in first["summary"]


def test_warnings_alone_do_not_fail_the_run() -> None:
    assert make_report([Finding("port", "warn", "w", [0], "r")]).status == "warn"
    assert make_report([Finding("port", "pass", "ok", [0]), Finding("gpu", "skip", "no GPU", [0])]).status == "pass"
    assert make_report([Finding("port", "error", "crashed", [0])]).status == "fail"


def test_a_run_that_checked_nothing_is_a_skip_and_says_so() -> None:
    # `check --only gpu` on a node without a GPU: nothing passed, nothing failed.
    report = make_report([Finding("gpu", "skip", "no GPU check: PyTorch 2.13.0+cpu is a CPU-only build", [0, 1])])
    assert report.status == "skip" and report.to_json()["status"] == "skip"
    assert render_table(report).splitlines()[-1] == (
        "Result: SKIP: nothing was checked: every check run here skipped (gpu); see why above")


def test_details_that_differ_per_rank_are_kept_per_rank() -> None:
    merged = collapse([Finding("c", "pass", "s", [0], details={"t": 1}), Finding("c", "pass", "s", [1], details={"t": 2})])
    assert merged[0].details == {"per_rank": {"0": {"t": 1}, "1": {"t": 2}}}


def test_verbose_shows_details() -> None:
    report = make_report([Finding("port", "pass", "ok", [0], details={"connect_ms": 0.25})])
    assert "connect_ms" in render_table(report, verbose=True)
    assert "connect_ms" not in render_table(report, verbose=False)


def test_rank_lists_read_the_same_in_every_column() -> None:
    """Issue 28: '1 2 3' in one report and '1-7' in another. Ranks that never reported (no tag) read as
    ranges, as everywhere else (ranks.py); a tagged rank keeps its [host:local_rank]."""
    peers = {p.rank: p for p in PEERS}
    assert format_ranks([1, 2, 3], 8, {}) == "1-3"
    assert format_ranks([3, 1], 8, {}) == "1,3"
    tagged = format_ranks([5, 6, 7], 8, {5: peers[5]})
    assert tagged == "5 [node-b:1], 6-7"
    assert " " not in format_ranks([1, 2, 3, 4], 8, {})


def test_ranks_on_several_hosts_are_named_per_host_in_text_and_json() -> None:
    report = make_report([Finding("port", "pass", "ok", list(range(8)))])
    table = render_table(report)
    assert table.splitlines()[1] == "hosts: node-a: ranks 0-3; node-b: ranks 4-7"
    assert report.to_json()["hosts"] == {"node-a": [0, 1, 2, 3], "node-b": [4, 5, 6, 7]}
    one_host = Report(2, "gloo", "local", [RankInfo(r, r, "vm", 10 + r) for r in range(2)],
                      [Finding("port", "pass", "ok", [0, 1])], ["port"], 1.0)
    assert "hosts:" not in render_table(one_host)  # one host: the header names it, nothing more to say
    many = Report(128, "nccl", "slurm", [RankInfo(r, r % 8, f"gpu{r // 8:02d}", 10 + r) for r in range(128)],
                  [Finding("port", "pass", "ok", list(range(128)))], ["port"], 1.0)
    # 16 hosts: the first two and the last show the naming and the layout; the JSON has every host.
    assert render_table(many).splitlines()[1] == (
        "hosts: gpu00: ranks 0-7; gpu01: ranks 8-15; ... gpu15: ranks 120-127 (16 hosts; the JSON's hosts lists all)")
    assert len(many.to_json()["hosts"]) == 16
