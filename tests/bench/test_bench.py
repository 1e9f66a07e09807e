"""`ddpdoctor bench` and the `bandwidth` check: real gloo ranks, real torchrun, real network namespaces."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from ddpdoctor.bench.analysis import OPS, parse_size, size_sweep
from ddpdoctor.bench.ops import count_wrong, expected_output, make_input, modulus, pattern
from ddpdoctor.bench.pairs import PairResult, analyse_pairs, pair_schedule, round_robin
from ddpdoctor.errors import DoctorError
from tests.netns import NetnsHosts, torchrun_on_hosts
from tests.support import PG_NOT_DESTROYED, clean_env, free_port, run_cli, torchrun_cmd

SMALL = ["-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "1"]
FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0, "sendrecv": lambda n: 1.0}


# -- the numbers, without processes ---------------------------------------------------------------


def test_sizes_parse_like_nccl_tests() -> None:
    assert parse_size("8") == 8
    assert parse_size("1K") == 1024
    assert parse_size("64M") == 64 << 20
    assert parse_size("1G") == 1 << 30
    assert parse_size("2MiB") == 2 << 20
    with pytest.raises(DoctorError, match="1X"):
        parse_size("1X")
    assert size_sweep(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    assert size_sweep(1000, 5000, 3) == [1000, 3000]  # max is not forced in, as nccl-tests
    with pytest.raises(DoctorError, match="larger than"):
        size_sweep(2048, 1024, 2)


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", ["float", "bfloat16", "int8"])
def test_checker_detects_corruption(op: str, nranks: int, dtype: str) -> None:
    """The verifier itself: the exact expected result passes, one flipped element or swapped chunks do not."""
    count = 12 * nranks
    for rank in range(nranks):
        good = expected_output(op, rank, nranks, count, dtype, torch.device("cpu"))
        assert count_wrong(op, rank, nranks, count, dtype, good.clone()) == 0
        bad = good.clone()
        bad[len(bad) // 2] += 1
        assert count_wrong(op, rank, nranks, count, dtype, bad) == 1
        stale = torch.zeros_like(good)  # an output the collective never wrote
        assert count_wrong(op, rank, nranks, count, dtype, stale) > 0
    if op in ("all_gather", "all_to_all"):
        good = expected_output(op, 0, nranks, count, dtype, torch.device("cpu"))
        c = count // nranks
        swapped = torch.cat([good[c:2 * c], good[:c], good[2 * c:]])  # chunks of ranks 0 and 1 swapped
        assert count_wrong(op, 0, nranks, count, dtype, swapped) > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "half", "int8", "float"])
@pytest.mark.parametrize("nranks", [2, 3, 8, 64])
def test_reduction_inputs_sum_exactly(dtype: str, nranks: int) -> None:
    """Whatever order the backend adds in, the sum of the inputs is exact in the dtype."""
    count = 257
    total = sum(make_input("all_reduce", r, nranks, count, dtype, "cpu").to(torch.float64)
                for r in range(nranks))
    expected = expected_output("all_reduce", 0, nranks, count, dtype, "cpu")
    assert torch.equal(expected.to(torch.float64), total)
    assert modulus("all_reduce", dtype, nranks) >= 2
    # Ranks differ from each other, so a rank that sends the wrong buffer is caught.
    assert not torch.equal(pattern(0, 0, count, 101, dtype, "cpu"), pattern(1, 0, count, 101, dtype, "cpu"))


def test_pairs_name_the_slow_host_not_its_partners() -> None:
    fast, slow = 1.0, 0.05
    pairs = [PairResult(0, 1, "A", "B", fast, 10), PairResult(0, 2, "A", "C", slow, 200),
             PairResult(1, 2, "B", "C", slow, 200)]
    assert analyse_pairs(pairs).slow_hosts == ["C"]
    # Two hosts, one link: no way to tell which end is slow, so none is named.
    assert analyse_pairs(pairs[1:2]).slow_hosts == []
    # A bad cable between two healthy hosts is a slow link, not a slow host.
    four = [PairResult(a, b, "ABCD"[a], "ABCD"[b], slow if (a, b) == (0, 1) else fast, 1)
            for a in range(4) for b in range(a + 1, 4)]
    result = analyse_pairs(four)
    assert result.slow_hosts == [] and [(p.a, p.b) for p in result.slow_links] == [(0, 1)]


def test_pair_rounds_cover_every_pair_once_without_sharing_a_rank() -> None:
    for n in range(2, 9):
        rounds = round_robin(list(range(n)))
        seen = [p for r in rounds for p in r]
        assert sorted(seen) == [(a, b) for a in range(n) for b in range(a + 1, n)]
        for r in rounds:
            flat = [x for p in r for x in p]
            assert len(flat) == len(set(flat))
    hosts = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    scheduled = [p for r in pair_schedule(hosts) for p in r]
    assert sorted(scheduled) == [(0, 1), (0, 2), (0, 4), (2, 3), (2, 4), (4, 5)]


def _rows(op: str, sizes_and_busbw: list[tuple[int, float]]) -> list:
    from ddpdoctor.bench.analysis import Timing, make_row

    return [make_row(op, size, size // 4, "float", None, Timing(100.0, 110.0, 1, bw, bw, 0))
            for size, bw in sizes_and_busbw]


def test_min_busbw_verdict_is_the_same_in_footer_fail_lines_and_json() -> None:
    """One decision (analysis.min_busbw_check) behind the exit code, the FAIL line, the footer and the JSON:
    the footer names the figure compared and the threshold and ends in OK/FAILED, the JSON has the status
    and the failure lines, also when no size reaches 1 MiB (the average is then over every size)."""
    from ddpdoctor.bench.analysis import BenchConfig, min_busbw_check, problems
    from ddpdoctor.bench.render import result_json, table_footer

    small = _rows("all_reduce", [(1024, 0.01), (4096, 0.03)])
    config = BenchConfig(sizes=(1024, 4096), min_busbw_gbps=100.0)
    floor = min_busbw_check(config, small)
    assert floor is not None and floor.all_sizes and floor.measured_gbps == pytest.approx(0.02)
    assert table_footer(small, floor).splitlines()[-1] == (
        "# Avg bus bandwidth    : 0.02 GB/s (over all sizes: none >= 1 MiB) against --min-busbw 100 GB/s: FAILED")
    found = problems(config, small, None)
    assert found == ["all_reduce: average busbw 0.02 GB/s (over all sizes: none >= 1 MiB) is below "
                     "--min-busbw 100 GB/s"]
    doc = result_json(config, 2, "gloo", small, None, None, found)
    assert doc["status"] == "fail" and doc["failures"] == found
    assert doc["min_busbw"] == {"threshold_gbps": 100.0, "source": "--min-busbw"}
    assert doc["per_op"]["all_reduce"]["min_busbw"] == {
        "measured_busbw_gbps": pytest.approx(0.02), "over": "all_sizes", "threshold_gbps": 100.0, "status": "fail"}

    # Sizes >= 1 MiB: only those are averaged; NCCL_TESTS_MIN_BW's threshold is named as nccl-tests' 90 %.
    big = _rows("all_reduce", [(1024, 0.01), (1 << 20, 2.0), (4 << 20, 4.0)])
    env_config = BenchConfig(min_busbw_gbps=2.7, min_busbw_label="90 % of NCCL_TESTS_MIN_BW=3, as nccl-tests")
    env_floor = min_busbw_check(env_config, big)
    assert env_floor is not None and env_floor.passed
    assert table_footer(big, env_floor).splitlines()[-1] == (
        "# Avg bus bandwidth    : 3.00 GB/s (sizes >= 1 MiB) against 2.7 GB/s (90 % of NCCL_TESTS_MIN_BW=3, "
        "as nccl-tests): OK")
    passed = result_json(env_config, 2, "gloo", big, None, None, problems(env_config, big, None))
    assert passed["status"] == "pass" and passed["failures"] == []
    assert passed["per_op"]["all_reduce"]["min_busbw"]["over"] == "sizes_ge_1mib"
    # Without a threshold the footer is nccl-tests' plain average, and the JSON says no threshold was set.
    assert table_footer(big).splitlines()[-1] == "# Avg bus bandwidth    : 3.00 GB/s (sizes >= 1 MiB)"
    assert table_footer(small).splitlines()[-1] == "# Avg bus bandwidth    : n/a (no size >= 1 MiB in the sweep)"
    plain = result_json(BenchConfig(), 2, "gloo", big, None)
    assert plain["status"] == "pass" and plain["min_busbw"] is None and plain["per_op"]["all_reduce"]["min_busbw"] is None


def test_json_status_is_warn_for_what_prints_but_exits_0() -> None:
    """An op's peak below --warn-busbw-pct of its expectation (printed WARN, exit 0) is status "warn"."""
    from ddpdoctor.bench.analysis import BenchConfig
    from ddpdoctor.bench.expect import Assessment, LinkPath, Thresholds, Verdict
    from ddpdoctor.bench.render import result_json

    rows = _rows("all_reduce", [(1 << 20, 1.0)])
    path = LinkPath(kind="ethernet", description="Ethernet eth0 at 10000 Mb/s", expected_gbps=1.25)
    assessment = Assessment({0: "a", 1: "b"}, Thresholds(), per_op={"all_reduce": Verdict(0.9, path, "warn", 72.0)})
    assert result_json(BenchConfig(), 2, "gloo", rows, None, assessment)["status"] == "warn"


# -- real ranks -----------------------------------------------------------------------------------


def _check_rows(data: dict, nranks: int) -> None:
    """Every row: #wrong 0, and algbw/busbw exactly nccl-tests' formulas from the row's own time."""
    assert data["world_size"] == nranks and data["backend"] == "gloo"
    assert {r["op"] for r in data["rows"]} == set(data["per_op"])
    for row in data["rows"]:
        op, t = row["op"], row["time_us"] * 1e-6
        assert row["wrong"] == 0, row
        assert t > 0 and row["max_time_us"] >= row["time_us"] * (1 - 1e-9)
        assert 0 <= row["slowest_rank"] < nranks
        per_rank = row["bytes"] / nranks if op in ("all_gather", "reduce_scatter", "all_to_all") else row["bytes"]
        scaled = nranks if op in ("all_gather", "reduce_scatter", "all_to_all") else 1
        algbw = per_rank * scaled / t / 1e9
        assert row["algbw_gbps"] == pytest.approx(algbw, rel=1e-9)
        assert row["busbw_gbps"] == pytest.approx(algbw * FACTORS[op](nranks), rel=1e-9)
        assert row["count"] * {"float": 4}[row["dtype"]] == row["bytes"]


def test_all_ops_two_ranks_correct_and_nccl_tests_numbers(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_cli(["bench", "--nproc", "2", "--op", "all", *SMALL, "--json", str(out)], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["status"] == "pass" and data["failures"] == [] and data["min_busbw"] is None
    assert data["op"] == "all" and set(data["per_op"]) == set(OPS)
    assert len(data["rows"]) == 2 * len(OPS)
    _check_rows(data, 2)
    # The table: nccl-tests' columns in order, one block per op, and the footer.
    header = next(line for line in proc.stdout.splitlines() if "size" in line and "count" in line)
    columns = header.lstrip("#").split()
    assert columns[:9] == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"]
    assert proc.stdout.count("# Out of bounds values : 0 OK") == len(OPS)
    assert "# Avg bus bandwidth    : n/a" in proc.stdout  # no size >= 1 MiB in this sweep
    # Two ranks on one host under gloo: loopback TCP, no model, so never "below expected" (issue 34).
    assert proc.stdout.count("# Expected busbw       : no model applies: gloo between processes on one host") \
        == len(OPS)
    assert all(v["expected"]["status"] == "none" and v["expected"]["expected_busbw_gbps"] is None
               for v in data["per_op"].values())
    assert "below" not in proc.stdout and "# hosts:" not in proc.stdout  # one host: nothing to group


def test_json_dash_is_rank_0s_whole_stdout_and_failures_go_to_stderr() -> None:
    proc = run_cli(["bench", "--nproc", "2", "--backend", "gloo", "--op", "all_reduce", *SMALL, "--json", "-",
                    "--min-busbw", "100000"], timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)  # no table around it
    assert data["world_size"] == 2 and [r["op"] for r in data["rows"]] == ["all_reduce", "all_reduce"]
    assert "ddpdoctor bench: FAIL: all_reduce: average busbw" in proc.stderr
    # The document alone carries the verdict of the exit code: status, the FAIL lines, the threshold.
    assert data["status"] == "fail"
    assert [f"ddpdoctor bench: FAIL: {line}" for line in data["failures"]] == [
        line for line in proc.stderr.splitlines() if line.startswith("ddpdoctor bench: FAIL:")]
    assert data["min_busbw"] == {"threshold_gbps": 100000.0, "source": "--min-busbw"}
    assert data["per_op"]["all_reduce"]["min_busbw"]["status"] == "fail"
    assert PG_NOT_DESTROYED not in proc.stderr  # a failing bench's ranks destroy their group too


def test_three_ranks_correct_and_min_busbw_fails(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_cli(["bench", "--nproc", "3", "--op", "all", "-b", "1M", "-e", "1M", "-n", "2", "-w", "1",
                    "-d", "bf16", "--json", str(out), "--min-busbw", "100000"], timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "below --min-busbw 100000 GB/s" in proc.stdout
    # Each op's footer: the figure compared, the threshold, the verdict.
    assert "(sizes >= 1 MiB) against --min-busbw 100000 GB/s: FAILED" in proc.stdout
    data = json.loads(out.read_text())
    assert data["status"] == "fail" and len(data["failures"]) == len({r["op"] for r in data["rows"]})
    for row in data["rows"]:
        assert row["wrong"] == 0 and row["dtype"] == "bfloat16"
        assert row["requested_bytes"] == 1 << 20
    # 1 MiB rows count for the average even when rounded to whole elements per rank (all_gather on 3).
    assert all(v["avg_busbw_gbps"] is not None for v in data["per_op"].values())
    for row in data["rows"]:
        op, n, t = row["op"], 3, row["time_us"] * 1e-6
        assert row["busbw_gbps"] == pytest.approx(row["bytes"] / t / 1e9 * FACTORS[op](n), rel=1e-9)


def test_under_torchrun_with_pairs(tmp_path: Path) -> None:
    """A rank under a real launcher: torchrun's store, one host, pairs between its ranks."""
    out = tmp_path / "bench.json"
    cmd = [*torchrun_cmd(), "--nproc-per-node", "3", "--master-port", str(free_port()), "-m", "ddpdoctor",
           "bench", "--op", "sendrecv", *SMALL, "--pairs", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    _check_rows(data, 3)
    pairs = {(p["a"], p["b"]) for p in data["pairs"]}
    assert pairs == {(0, 1), (0, 2)}  # one host: every rank against the host's first rank
    assert all(p["busbw_gbps"] > 0 for p in data["pairs"])
    assert "# pairwise sendrecv" in proc.stdout and data["pair_bytes"] == 64 << 10


@pytest.mark.parametrize("args, needle", [
    (["-b", "1X"], "-b/--min-bytes takes a size like"),
    (["-b", "1M", "-e", "1K"], "is larger than -e/--max-bytes"),
    (["--op", "allreduc"], "--op must be one of"),
    (["--op", ""], "--op is empty"),  # an unset shell variable ran all_reduce (an explorer's find)
    (["-d", "float8"], "-d/--dtype must be one of"),
    (["-c", "-1"], "-c/--check takes how many checked calls"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    proc = run_cli(["bench", *args], timeout=60)
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_plot_without_matplotlib_is_one_line_exit_2(tmp_path: Path) -> None:
    # A real ImportError: a matplotlib that cannot be imported shadows any installed one.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "matplotlib.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = clean_env({"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])})
    proc = run_cli(["bench", "--plot", str(tmp_path / "bw.png")], timeout=60, env=env)
    assert proc.returncode == 2
    assert "--plot needs matplotlib" in proc.stderr and "pip install" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# -- the bandwidth check --------------------------------------------------------------------------

def test_bandwidth_check_in_ddpdoctor_check(tmp_path: Path) -> None:
    from ddpdoctor.checks import CHECK_IDS

    if "bandwidth" not in CHECK_IDS:
        pytest.skip("the bandwidth check is not registered in checks/__init__.py yet")
    out = tmp_path / "check.json"
    proc = run_cli(["check", "--nproc", "2", "--only", "bandwidth", "--min-busbw", "100000", "--json", str(out)],
                   timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "below --min-busbw" in proc.stdout
    findings = json.loads(out.read_text())["findings"]
    assert [f["summary"] for f in findings if f["status"] == "fail"] == [
        next(f["summary"] for f in findings if "below --min-busbw 100000 GB/s" in f["summary"])]
    # Run on each rank, combined on rank 0: one FAIL naming both ranks, every size measured and correct.
    [failed] = [f for f in findings if f["status"] == "fail"]
    assert failed["ranks"] == [0, 1] and "bench --pairs" in failed["remedy"]
    rows = failed["details"]["rows"]
    assert [r["bytes"] for r in rows] == [256 << 10, 1 << 20, 4 << 20] and all(r["wrong"] == 0 for r in rows)
    # Two ranks on one host: no model applies (loopback TCP), so nothing is "below expected" (issue 34).
    assert failed["details"]["expected"]["per_op"]["all_reduce"]["status"] == "none"
    assert not any("expected on" in f["summary"] for f in findings)


# -- across "hosts": network namespaces -----------------------------------------------------------


@pytest.mark.requires_netns
@pytest.mark.slow
def test_pairs_name_the_rate_limited_host_and_its_qdisc(tmp_path: Path) -> None:
    """Three hosts (network namespaces, tests/netns.py); nodeC's link is shaped with a tc tbf qdisc.

    One job, asserted for everything a user reads: --pairs names nodeC as the slow host; every figure is set
    against the 10000 Mb/s the veth and bridge report (1.25 GB/s, NCCL's speed / 8000), the shaped ones come out
    as a few percent of it with the tbf qdisc on nodeC named as the bottleneck, and the header groups ranks by host.
    """
    port = 29000 + os.getpid() % 1000
    out = tmp_path / "pairs.json"
    with NetnsHosts(3, subnet=f"10.{100 + os.getpid() % 100}") as hosts:
        hosts.rate_limit(2, "20mbit")
        outputs = torchrun_on_hosts(hosts, ("nodeA", "nodeB", "nodeC"), port,
                                    ["bench", "-b", "64K", "-e", "256K", "-f", "4", "-n", "3", "-w", "1", "--pairs",
                                     "--timeout", "60", "--json", str(out)])
    stdout = outputs[0][1]
    print(stdout)  # shown with -s: the report a user would read
    assert outputs[0][0] == 1, outputs  # a slow host is a problem found
    data = json.loads(out.read_text())
    assert data["slow_hosts"] == ["nodeC"], data["pairs"]
    assert {(p["host_a"], p["host_b"]) for p in data["pairs"]} == {("nodeA", "nodeB"), ("nodeA", "nodeC"),
                                                                    ("nodeB", "nodeC")}
    assert data["pairs"][0]["host_b"] == "nodeC"  # slowest first
    assert "SLOW HOST nodeC" in stdout and "slow host: nodeC" in stdout
    # Where each rank runs, grouped by host.
    assert "# hosts: nodeA: rank 0; nodeB: rank 1; nodeC: rank 2" in stdout
    assert data["hosts"] == {"nodeA": [0], "nodeB": [1], "nodeC": [2]}
    # The collective: a few percent of the 1.25 GB/s the interfaces report, the qdisc named first.
    whole = data["per_op"]["all_reduce"]["expected"]
    assert whole["expected_busbw_gbps"] == 1.25 and whole["status"] == "fail" and whole["pct"] < 10, whole
    assert whole["path"]["nominal"] and "10000 Mb/s" in whole["path"]["description"]
    first = whole["bottlenecks"][0]
    assert first["cause"] == "qdisc" and "tbf qdisc on dd0 of nodeC shapes the link to 20 Mbit/s" in first["evidence"]
    assert "# Bottleneck           : a tbf qdisc on dd0 of nodeC" in stdout
    # Each pair: nodeC's links below expectation for the same reason; the unshaped link is never failed.
    by_hosts = {(p["host_a"], p["host_b"]): p for p in data["pairs"]}
    for pair in (by_hosts[("nodeA", "nodeC")], by_hosts[("nodeB", "nodeC")]):
        assert pair["status"] == "fail" and pair["pct"] < 10 and pair["bottlenecks"][0]["cause"] == "qdisc", pair
    assert by_hosts[("nodeA", "nodeB")]["status"] in ("pass", "note"), by_hosts[("nodeA", "nodeB")]
    assert "ddpdoctor bench: FAIL: all_reduce: busbw" in stdout and "below --min-busbw-pct 50" in stdout


def test_an_infinite_step_factor_gives_just_the_first_size() -> None:
    from ddpdoctor.bench.analysis import size_sweep

    assert size_sweep(1024, 4096, float("inf")) == [1024]
    assert size_sweep(1024, 4096, 1e308) == [1024]
    assert size_sweep(1024, 4096, 2) == [1024, 2048, 4096]


def test_min_busbw_over_small_sizes_says_which_average_it_used_and_the_plot_is_written(tmp_path: Path) -> None:
    """No size reaches 1 MiB: the verdict averages all sizes and says so, in the FAIL line, in the footer (that
    average, the threshold, FAILED; not "n/a" with no verdict) and in the JSON (status and failures).
    The same run writes --plot (a failed verdict still gets its plot), where matplotlib is installed."""
    png = tmp_path / "bw.png"
    out = tmp_path / "r.json"
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") is not None else []
    proc = run_cli(["bench", "--nproc", "2", "-b", "64K", "-e", "256K", "-f", "4", "-n", "1", "-w", "1",
                    "--min-busbw", "100000", "--json", str(out), *plot], timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "n/a (no size >= 1 MiB" not in proc.stdout
    footer = next(line for line in proc.stdout.splitlines() if line.startswith("# Avg bus bandwidth"))
    assert footer.startswith("# Avg bus bandwidth    : ") and footer.endswith(
        " GB/s (over all sizes: none >= 1 MiB) against --min-busbw 100000 GB/s: FAILED"), footer
    fail = next(line for line in proc.stdout.splitlines() if line.startswith("ddpdoctor bench: FAIL:"))
    assert "(over all sizes: none >= 1 MiB) is below --min-busbw 100000 GB/s" in fail
    data = json.loads(out.read_text())
    assert data["status"] == "fail" and data["failures"] == [fail.removeprefix("ddpdoctor bench: FAIL: ")]
    assert data["per_op"]["all_reduce"]["min_busbw"]["over"] == "all_sizes"
    if plot:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
