"""The env check's cross-rank judgement, as a pure function of each rank's facts."""

from __future__ import annotations

from typing import Any

from ddpdoctor.checks.env import FACTS, _combine
from ddpdoctor.findings import Finding, RankInfo

VERSIONS = {"torch": "2.13.0", "python": "3.11.7", "cuda": "12.4", "nccl": "2.21.5"}


def facts(rank: int, host: str, variables: dict[str, str], **versions: str) -> Finding:
    details: dict[str, Any] = {"vars": variables, "versions": {**VERSIONS, **versions}, "world_size": 4,
                               "local_world_size": 2, "host": host}
    return Finding("env", "pass", FACTS, [rank], details=details)


def judge(*per_rank: Finding) -> list[Finding]:
    peers = {f.ranks[0]: RankInfo(f.ranks[0], f.ranks[0] % 2, f.details["host"], 100) for f in per_rank}
    return _combine({f.ranks[0]: [f] for f in per_rank}, peers)


def test_a_differing_nccl_variable_fails_naming_the_outlier_rank_against_rank_0() -> None:
    base = {"NCCL_IB_DISABLE": "1"}
    out = judge(facts(0, "a", base), facts(1, "a", {"NCCL_IB_DISABLE": "0"}), facts(2, "b", base), facts(3, "b", base))
    assert [(f.status, f.ranks) for f in out] == [("fail", [1])]
    assert out[0].summary == "NCCL_IB_DISABLE differs across ranks: '1' on ranks 0,2-3; '0' on rank 1"


def test_on_a_tie_the_rank_that_differs_from_rank_0_is_blamed() -> None:
    out = judge(facts(0, "a", {"TORCH_NCCL_BLOCKING_WAIT": "1"}), facts(1, "a", {}))
    assert out[0].ranks == [1]


def test_logging_variables_and_per_task_gpu_binding_may_differ() -> None:
    out = judge(facts(0, "a", {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "8"}),
                facts(1, "a", {"CUDA_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": "4"}))
    assert [f.status for f in out] == ["pass"]
    assert "CUDA_VISIBLE_DEVICES" in out[0].summary and "differ per rank, as allowed" in out[0].summary


def test_socket_ifname_differing_across_hosts_warns_but_within_a_host_fails() -> None:
    across = judge(facts(0, "a", {"NCCL_SOCKET_IFNAME": "eth0"}), facts(1, "a", {"NCCL_SOCKET_IFNAME": "eth0"}),
                   facts(2, "b", {"NCCL_SOCKET_IFNAME": "ens5"}), facts(3, "b", {"NCCL_SOCKET_IFNAME": "ens5"}))
    assert [(f.status, f.ranks) for f in across] == [("warn", [2, 3])]
    within = judge(facts(0, "a", {"NCCL_SOCKET_IFNAME": "eth0"}), facts(1, "a", {"NCCL_SOCKET_IFNAME": "ib0"}))
    assert [(f.status, f.ranks) for f in within] == [("fail", [1])]


def test_version_mismatch_names_only_the_outliers() -> None:
    out = judge(facts(0, "a", {}), facts(1, "a", {}), facts(2, "b", {}, torch="2.12.0"), facts(3, "b", {}))
    assert [(f.status, f.ranks) for f in out] == [("fail", [2])]
    assert "torch version differs" in out[0].summary and "'2.12.0' on rank 2" in out[0].summary


def test_consistent_ranks_pass() -> None:
    out = judge(facts(0, "a", {"NCCL_IB_HCA": "mlx5"}), facts(1, "b", {"NCCL_IB_HCA": "mlx5"}))
    assert [f.status for f in out] == ["pass"]
    assert out[0].ranks == [0, 1]


def test_mixed_nccl_builds_across_hosts_fail_once() -> None:
    out = judge(facts(0, "a", {}), facts(1, "a", {}), facts(2, "b", {}, nccl="2.19.3"), facts(3, "b", {}, nccl="2.19.3"))
    fails = [f for f in out if f.status == "fail"]
    assert len(fails) == 1 and fails[0].ranks == [2, 3]
    assert "nccl version" in fails[0].summary and "2.19.3" in fails[0].summary and "2.21.5" in fails[0].summary


def test_flight_recorder_warning_names_what_is_off_and_the_remedy_sets_it() -> None:
    from ddpdoctor.checks.env import FR_REMEDY, flight_recorder_problem

    # torch 2.7 turned both on by default (pytorch/pytorch#143446): nothing to say unless switched off.
    assert flight_recorder_problem({}, "2.13.0+cu128") is None
    assert flight_recorder_problem({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, "2.13.0") == \
        "no Flight Recorder dump on an NCCL timeout (TORCH_NCCL_DUMP_ON_TIMEOUT=0)"
    assert flight_recorder_problem({"TORCH_FR_BUFFER_SIZE": "0"}, "2.13.0") == \
        "Flight Recorder off (TORCH_FR_BUFFER_SIZE=0): an NCCL timeout leaves no record of the collectives"
    # Before 2.7 both had to be set; the older spelling of the buffer variable counts.
    assert "TORCH_FR_BUFFER_SIZE unset; torch 2.5.1 defaults to 0" in str(flight_recorder_problem({}, "2.5.1"))
    assert flight_recorder_problem({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}, "2.5.1") == \
        "no Flight Recorder dump on an NCCL timeout (TORCH_NCCL_DUMP_ON_TIMEOUT unset; torch 2.5.1 defaults to off)"
    assert flight_recorder_problem({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"},
                                   "2.5.1") is None
    assert "TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1" in FR_REMEDY and "ddpdoctor fr" in FR_REMEDY
