"""One cause, one finding: the root cause is reported once, first, and what it explains is folded under it.

Through the renderer with recorded inputs: a real gloo report (``tests/data/check_reports``, recorded
here) and the two NCCL scenarios the first H100 run showed (issue 29), composed from the runner's
finding shapes around error texts quoted from public reports (named next to each; no GPU here). For real
where gloo can produce it: ``GLOO_SOCKET_IFNAME=nosuch ddpdoctor check``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ddpdoctor.check.causes import RULES, fold
from ddpdoctor.check.model import Report
from ddpdoctor.check.report import render_table
from ddpdoctor.check.runner import _backend_error
from ddpdoctor.findings import FAIL, PASS, SKIP, WARN, Finding, RankInfo
from tests.support import REPO, clean_env, run_cli

RECORDED = REPO / "tests" / "data" / "check_reports"
ORDER = ["env", "gpu", "port", "barrier", "connectivity", "bandwidth", "unused_params", "state_dict"]
PEERS = [RankInfo(0, 0, "h100", 101), RankInfo(1, 1, "h100", 102)]

# NVIDIA/nccl users' reports, verbatim (EvolvingLMMs-Lab/open-r1-multimodal issue #7: NCCL_SOCKET_IFNAME=eth0
# on a host without eth0; verl-project/verl issue #161: two ranks on one GPU).
NO_SOCKET_INTERFACE = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2588, internal "
                       "error - please report this issue to the NCCL developers, NCCL version 2.21.5\n"
                       "ncclInternalError: Internal check failed.\nLast error:\nBootstrap : no socket interface found")
DUPLICATE_GPU = ("NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid usage (run with "
                 "NCCL_DEBUG=WARN for details), NCCL version 2.20.5\nncclInvalidUsage: This usually reflects invalid "
                 "usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 10")


def _init_failed(error: str) -> Finding:
    """The runner's finding for an init_process_group that raised ``error`` (as ``RankRun`` builds it)."""
    why = _backend_error(RuntimeError(error))
    return Finding("connectivity", FAIL, f"init_process_group(nccl) failed: {why}", [0, 1],
                   "the ranks reached each other's store but not each other: check firewalls between nodes and "
                   "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME", {"kind": "pg_init_failed"})


def _skipped(check: str, why: str) -> Finding:
    return Finding(check, SKIP, f"not run: the process group is not usable ({why})", [0, 1],
                   details={"kind": "pg_unusable"})


def _report(findings: list[Finding], backend: str = "nccl") -> Report:
    return Report(2, backend, "local", PEERS, findings, ORDER, 1.0, {}, 8.1).fold()


def _rows(table: str) -> list[str]:
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    end = lines.index("", start)
    return [line for line in lines[start:end] if not line.startswith(" " * 20)]


def _todo(table: str) -> list[str]:
    lines = table.splitlines()
    if "What to do:" not in lines:
        return []
    start = lines.index("What to do:") + 1
    return [line for line in lines[start:lines.index("", start)]]


def test_the_recorded_gloo_report_folds_the_init_failure_under_the_interface() -> None:
    data = json.loads((RECORDED / "gloo_socket_ifname_nosuch.json").read_text())
    findings = [Finding.from_json({**f, "caused_by": None}) for f in data["findings"]]  # as rank 0 merges them
    report = Report(data["world_size"], data["backend"], data["launcher"],
                    [RankInfo.from_json(r) for r in data["ranks"]], findings, ORDER, data["elapsed_s"],
                    data["phases_s"], data["wall_s"]).fold()
    table = render_table(report)
    rows = _rows(table)
    assert rows[0].startswith("env") and "FAIL" in rows[0] and "GLOO_SOCKET_IFNAME=nosuch" in rows[0]
    assert rows[1].startswith("-> connectivity") and " fail " in rows[1] and "Unable to find address" in rows[1]
    assert rows[2].startswith("-> bandwidth") and " skip " in rows[2]
    assert sum(" FAIL " in row for row in rows) == 1  # one failure the user has to act on
    [todo] = _todo(table)
    assert todo.startswith("  1. [env] set GLOO_SOCKET_IFNAME") and "also explains the bandwidth, connectivity" in todo
    assert table.splitlines()[-1] == "Result: FAIL (1 fail, 2 pass, 3 skip; 2 more explained by the finding above them)"
    out = report.to_json()
    assert out["status"] == "fail"
    assert out["findings"][1]["caused_by"] == {"check": "env", "summary": out["findings"][0]["summary"],
                                               "rule": "gloo_socket_ifname", "index": 0}
    assert out["findings"][0]["caused_by"] is None


def test_nccl_socket_ifname_ib0_is_one_root_cause_with_three_consequences() -> None:
    findings = [
        Finding("gpu", FAIL, "[h100:0] NCCL_SOCKET_IFNAME='ib0' names ib0, which match no network interface here "
                "(interfaces: eth0, lo); NCCL fails with \"no socket interface found\"", [0],
                "set NCCL_SOCKET_IFNAME to an interface this host has (ip -br link), or unset it",
                {"kind": "nccl_socket_ifname"}),
        _init_failed(NO_SOCKET_INTERFACE),
        _skipped("bandwidth", "init_process_group failed on this rank"),
        Finding("env", FAIL, "NCCL_SOCKET_IFNAME=ib0 matches no interface on this host (have: eth0, lo)", [0, 1],
                "set NCCL_SOCKET_IFNAME to an interface this host has (see `ip -br addr` on h100), or unset it",
                {"kind": "nccl_socket_ifname", "variable": "NCCL_SOCKET_IFNAME"}),
        Finding("port", PASS, "every reporting rank reached the master port", [0, 1]),
    ]
    table = render_table(_report(findings))
    rows = _rows(table)
    assert [r.split()[0] if not r.startswith("->") else r.split()[1] for r in rows] == [
        "env", "gpu", "connectivity", "bandwidth", "port"]
    assert rows[0].startswith("env ") and all(r.startswith("->") for r in rows[1:4])
    assert "last error: Bootstrap : no socket interface found" in " ".join(table.split())  # wrapped in the table
    assert len(_todo(table)) == 1 and "[env]" in _todo(table)[0]
    assert "Result: FAIL (1 fail, 1 pass; 3 more explained" in table


def test_two_ranks_on_one_gpu_is_one_fail_with_nccls_invalid_usage_folded() -> None:
    findings = [
        Finding("env", PASS, "12 watched variables and versions agree", [0, 1]),
        Finding("gpu", FAIL, "ranks 0-1 share one GPU GPU-5a3f (NVIDIA H100 80GB HBM3): rank 0 [h100:0] (cuda:0), "
                "rank 1 [h100:1] (cuda:0); NCCL fails with \"Duplicate GPU detected : rank 1 and rank 0 both on "
                "CUDA device ...\"", [0, 1], "give each rank its own GPU", {"kind": "duplicate_gpu"}),
        _init_failed(DUPLICATE_GPU),
        _skipped("bandwidth", "init_process_group failed on this rank"),
    ]
    report = _report(findings)
    table = render_table(report)
    rows = _rows(table)
    assert rows[0].startswith("gpu ") and "FAIL" in rows[0] and "share one GPU" in rows[0]
    assert rows[1].startswith("-> connectivity") and " fail " in rows[1]
    flat = " ".join(table.split())
    assert "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.20.5; last error: Duplicate GPU " \
           "detected : rank 1 and rank 0 both on CUDA device 10" in flat
    assert [line.split("]")[0] for line in _todo(table)] == ["  1. [gpu"]
    assert report.status == FAIL and "Result: FAIL (1 fail, 1 pass; 2 more explained" in table
    assert [f["caused_by"]["rule"] for f in report.to_json()["findings"] if f["caused_by"]] == ["duplicate_gpu"] * 2


def test_the_result_line_counts_the_causes_it_folds_under() -> None:
    ifname = Finding("env", FAIL, "NCCL_SOCKET_IFNAME=ib0 matches no interface", [0, 1], "set it",
                     {"kind": "nccl_socket_ifname"})
    said_twice = Finding("gpu", FAIL, "[h100:0] NCCL_SOCKET_IFNAME='ib0' names ib0", [0], "set it",
                         {"kind": "nccl_socket_ifname"})
    duplicate = Finding("gpu", FAIL, "ranks 0-1 share one GPU", [0, 1], "one GPU each", {"kind": "duplicate_gpu"})
    wrong = Finding("gpu", FAIL, "rank 1 uses cuda:0, not cuda:1", [1], "set_device", {"kind": "wrong_device"})
    port = Finding("port", PASS, "every reporting rank reached the master port", [0, 1])
    one = render_table(_report([ifname, said_twice, port]))
    assert one.splitlines()[-1] == "Result: FAIL (1 fail, 1 pass; 1 more explained by the finding above them)"
    two = render_table(_report([ifname, said_twice, duplicate, wrong]))
    assert two.splitlines()[-1] == "Result: FAIL (2 fail; 2 more explained by the findings above them)"


def test_a_cause_folds_only_on_the_backend_it_breaks() -> None:
    # GLOO_SOCKET_IFNAME means nothing to NCCL: a connectivity failure next to it is a problem of its own.
    wrong_gloo = Finding("env", FAIL, "GLOO_SOCKET_IFNAME=nosuch names nosuch", [0, 1], "set it",
                         {"kind": "gloo_socket_ifname"})
    broken = _init_failed(NO_SOCKET_INTERFACE)
    assert _report([wrong_gloo, broken], backend="nccl").findings[1].caused_by is None
    again = [Finding.from_json(wrong_gloo.to_json()), Finding.from_json(broken.to_json())]
    assert _report(again, backend="gloo").findings[1].caused_by is not None


def test_measurements_and_unrelated_failures_are_never_folded() -> None:
    cause = Finding("env", FAIL, "NCCL_SOCKET_IFNAME=ib0 matches no interface", [0, 1], "fix it",
                    {"kind": "nccl_socket_ifname"})
    slow = Finding("bandwidth", FAIL, "all_reduce busbw 1.20 GB/s is below --min-busbw 10 GB/s", [0, 1], "look")
    warned = Finding("gpu", WARN, "[h100:0] clocks slowed down: hw_slowdown", [0], "check cooling",
                     {"kind": "gpu_health"})
    report = _report([cause, slow, warned])
    assert all(f.caused_by is None for f in report.findings)
    assert len(_todo(render_table(report))) == 3


def test_without_its_cause_a_consequence_is_a_root_and_keeps_its_remedy() -> None:
    report = _report([_init_failed(NO_SOCKET_INTERFACE), _skipped("bandwidth", "init failed")])
    assert report.findings[0].caused_by is None
    table = render_table(report)
    assert _rows(table)[0].startswith("connectivity") and "check firewalls" in _todo(table)[0]


def test_ranks_that_never_joined_explain_the_skipped_checks() -> None:
    missing = Finding("barrier", FAIL, "rank 1 did not report: never joined within 30 s", [1], "start it",
                      {"kind": "never_joined", "unreported": True})
    report = _report([missing, _skipped("connectivity", "rank 1 never joined"),
                      _skipped("bandwidth", "rank 1 never joined")])
    assert [f.caused_by["rule"] for f in report.findings[1:] if f.caused_by] == ["rank_missing", "rank_missing"]


def test_a_backend_this_host_cannot_run_explains_the_skips() -> None:
    # Under torchrun with --backend nccl on a host without a GPU: the runner's finding, then every skip.
    unusable = Finding("connectivity", FAIL, "--backend nccl needs a CUDA GPU and none is visible on cpu-node; use "
                       "--backend gloo (or auto)", [0, 1], "run with --backend gloo or auto on hosts without GPUs",
                       {"kind": "backend_unusable"})
    report = _report([unusable, _skipped("bandwidth", "--backend nccl needs a CUDA GPU")])
    assert report.findings[0].caused_by is None
    assert report.findings[1].caused_by is not None and report.findings[1].caused_by["rule"] == "backend_unusable"


def test_folding_is_stable_through_the_json_and_every_rule_names_real_check_ids() -> None:
    report = _report([Finding("gpu", FAIL, "dup", [0, 1], "fix", {"kind": "duplicate_gpu"}),
                      _init_failed(DUPLICATE_GPU)])
    loaded = [Finding.from_json(f) for f in report.to_json()["findings"]]
    assert loaded[1].caused_by is not None and loaded[1].caused_by["index"] == 0
    assert fold(loaded, "nccl")[1].caused_by == loaded[1].caused_by  # a folded report is not folded twice
    from ddpdoctor.checks import CHECK_IDS

    for rule in RULES:
        assert rule.cause.check in CHECK_IDS
        assert all(m.check in (*CHECK_IDS, "*") for m in rule.explains)


@pytest.mark.slow
def test_real_gloo_socket_ifname_nosuch_is_one_root_cause() -> None:
    res = run_cli(["check", "--timeout", "40", "--json", "-"], env=clean_env({"GLOO_SOCKET_IFNAME": "nosuch"}),
                  timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    roots = [f for f in data["findings"] if f["status"] == "fail" and f["caused_by"] is None]
    assert [(f["check"], f["details"].get("variable")) for f in roots] == [("env", "GLOO_SOCKET_IFNAME")]
    folded = [f for f in data["findings"] if f["caused_by"] is not None]
    assert {f["check"] for f in folded} >= {"connectivity"}
    assert all(f["caused_by"]["index"] == data["findings"].index(roots[0]) for f in folded)
    assert "Unable to find address for: nosuch" in next(f for f in folded if f["check"] == "connectivity")["summary"]


def test_a_gpu_measurement_on_a_shared_gpu_is_folded_under_the_sharing_not_a_failure() -> None:
    # What the first H100 run of the GPU suite showed (2026-11-28, other test jobs on the GPU): memory_bandwidth
    # read 832 GB/s, 25 % of 3350, while eight other processes used the GPU, and failed the check beside the
    # gpu check's warning about those processes: two findings, one of them sending the user to the hardware.
    # The check now warns (checks/pcie_bandwidth.shared_outcome) and the warning is folded under its cause.
    others = Finding("gpu", WARN, "[vm:0] GPU GPU-a0cc is also used by other processes: pid 1016 (1.1 GiB), pid 1014 "
                     "(0.7 GiB)", [0], "stop the other processes", {"kind": "other_processes"})
    copy = Finding("memory_bandwidth", WARN, "device-to-device copy 832 GB/s is 25 % of the 3350 GB/s NVIDIA H100 80GB "
                   "HBM3 datasheet figure (read + written bytes, 1024 MiB); bottleneck: other processes use this GPU: "
                   "pid 1014, 1016 (NVML) (measured while the GPU was shared: what this rank got, not what the GPU can "
                   "do)", [0], "rerun when nothing else runs there", {"kind": "other_processes"})
    host = Finding("pcie_bandwidth", PASS, "host-to-device 51.4 GB/s (107 %)", [0])
    report = _report([others, copy, host])
    assert [f.caused_by["rule"] if f.caused_by else None for f in report.findings] == [None, "other_processes", None]
    table = render_table(report)
    assert report.status == WARN and table.splitlines()[-1].startswith("Result: WARN (1 warn, 1 pass; 1 more explained")
    assert [line.split("]")[0] for line in _todo(table)] == ["  1. [gpu"]
    # Two ranks on one GPU: each rank's copy shared the GPU with the other: folded under the duplicate GPU.
    duplicate = Finding("gpu", FAIL, "ranks 0-1 share one GPU", [0, 1], "one GPU each", {"kind": "duplicate_gpu"})
    halved = Finding("memory_bandwidth", WARN, "device-to-device copy 1500 GB/s is 45 %", [0, 1], "own GPU",
                     {"kind": "shared_gpu"})
    assert _report([duplicate, halved]).findings[1].caused_by["rule"] == "duplicate_gpu"  # type: ignore[index]
    # A low figure with nobody else on the GPU is the GPU's own: a root with its remedy, never folded.
    alone = Finding("memory_bandwidth", FAIL, "device-to-device copy 832 GB/s is 25 %", [0], "check the clocks")
    assert _report([others, alone]).findings[1].caused_by is None
