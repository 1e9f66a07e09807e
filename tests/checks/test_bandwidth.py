"""`bandwidth`: one rank measures nothing; cores shared with other processes are said, not blamed on links.

Real processes throughout: the CLI self-launching its ranks, and CPU hogs (busy-looping Python
processes) as the "other processes" a shared machine runs. The judgement of crowded placements is also
checked on plain data, as the ranks gather it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ddpdoctor.bench import PairResult, Row
from ddpdoctor.checks.bandwidth import ONE_RANK, _judge, crowding
from ddpdoctor.env.load import other_runnable, parse_task_stat, runnable_threads
from ddpdoctor.findings import FAIL
from tests.support import clean_env, run_cli

CPUS = sorted(os.sched_getaffinity(0))
HOG = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def hogs(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` processes spinning on this process's CPUs (each ends by itself after 2 minutes)."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    try:
        time.sleep(0.5)  # started and spinning
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_one_rank_is_not_a_bandwidth_test() -> None:
    res = run_cli(["check", "--nproc", "1", "--only", "bandwidth", "--min-busbw", "5", "--json", "-"],
                  env=clean_env(), timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    [bandwidth] = [f for f in report["findings"] if f["check"] == "bandwidth"]
    assert bandwidth["status"] == "skip" and bandwidth["ranks"] == [0]
    assert bandwidth["summary"] == ONE_RANK and bandwidth["summary"].startswith("nothing crosses a link with one rank")
    assert "busbw" not in json.dumps(report["findings"])  # no "0.00 GB/s over 1 ranks"
    assert report["status"] == "skip"


def test_task_stat_lines_give_state_and_last_cpu() -> None:
    tid = os.listdir(f"/proc/{os.getpid()}/task")[0]
    state, cpu = parse_task_stat(Path(f"/proc/{os.getpid()}/task/{tid}/stat").read_text()) or ("", -1)
    assert state in "RSDTtIZ" and cpu in range(os.cpu_count() or 1)
    # A comm with spaces and parentheses (a thread may name itself so): the fields after the last ')'.
    fields = " ".join(["R"] + ["0"] * 35 + ["3"] + ["0"] * 10)
    assert parse_task_stat(f"4242 (py (worker) 1) {fields}") == ("R", 3)
    assert parse_task_stat("4242 (truncated") is None


def test_a_spinning_process_is_counted_unless_it_is_ours() -> None:
    with hogs(1) as (hog,):
        everyone_else = {int(p) for p in os.listdir("/proc") if p.isdigit()} - {hog.pid}
        assert all(runnable_threads(CPUS, everyone_else) == 1 for _ in range(5))  # only the hog is looked at
        assert runnable_threads(CPUS, everyone_else | {hog.pid}) == 0
        assert other_runnable(CPUS, set(), samples=5) >= 1.0


def test_other_processes_make_a_host_crowded_and_are_named() -> None:
    placements = {r: {"host": "vm", "cpus": [0, 1], "device": "cpu", "others": others}
                  for r, others in ((0, 2.4), (1, 3.0))}
    [entry] = crowding(placements)
    assert entry["others"] == 3 and entry["cores"] == 2 and entry["ranks"] == [0, 1]
    assert crowding({r: dict(p, others=0.0) for r, p in placements.items()}) == []  # 2 ranks on 2 idle cores
    row = Row(op="all_reduce", bytes=1 << 20, count=1 << 18, dtype="float", time_us=5000.0, max_time_us=5200.0,
              slowest_rank=1, algbw_gbps=0.21, busbw_gbps=0.21, wrong=0)
    [fail, *_] = _judge([row], [], 2, [0, 1], {}, 10.0, [entry])
    assert fail.status == FAIL and "below --min-busbw 10 GB/s while the cores were shared" in fail.summary
    assert "2 ranks and 3 runnable threads of other processes (not this job's) share 2 CPU cores on vm" in fail.summary
    assert fail.remedy.startswith("rerun when nothing else runs on those cores") and "bench --pairs" in fail.remedy


@pytest.mark.slow
def test_real_min_busbw_fail_on_cores_busy_with_other_processes_says_so() -> None:
    """The issue's scenario made deterministic: two ranks on this machine's cores while other processes spin.
    One spinning process fewer than the cores is enough to crowd them (2 ranks + n - 1 > n), and leaves the
    ranks a core's worth of time more than a hog per core did."""
    with hogs(max(1, len(CPUS) - 1)):
        res = run_cli(["check", "--nproc", "2", "--only", "bandwidth", "--min-busbw", "1000", "--timeout", "120",
                       "--json", "-"], env=clean_env(), timeout=400)
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(res.stdout)
    [fail] = [f for f in report["findings"] if f["check"] == "bandwidth" and f["status"] == "fail"]
    assert "while the cores were shared" in fail["summary"], fail["summary"]
    assert "runnable thread" in fail["summary"] and "of other processes (not this job's)" in fail["summary"]
    assert fail["remedy"].startswith("rerun when nothing else runs on those cores")


def test_below_expectation_is_one_fail_with_the_bottleneck_and_its_remedy() -> None:
    """The judgement on gathered data: two hosts on 25 Gb/s NICs, one shaped by a tbf qdisc (the facts a rank
    reads with env.links, written out here); the collective is one FAIL, its pair folded under it."""
    def facts(qdisc: float | None) -> dict[str, object]:
        return {"backend": "gloo", "interface": {"name": "eth0", "speed_mbps": 25000, "operstate": "up",
                                                 "virtual": False, "qdiscs": [{"kind": "tbf", "rate_bytes_per_s": qdisc}]
                                                 if qdisc else []},
                "ib_ports": [], "env": {}, "cpu_numa_nodes": [0], "gpu": None}
    row = Row("all_reduce", 4 << 20, 1 << 20, "float", 40000.0, 41000.0, 1, 0.1, 0.2, 0)
    pair = PairResult(0, 1, "a", "b", 0.12, 8000.0, [0.12])
    found = _judge([row], [pair], 2, [0, 1], {}, None, [], facts={0: facts(None), 1: facts(125e6)},
                   hosts={0: "a", 1: "b"})
    [fail] = [f for f in found if f.status == FAIL]
    assert "6.4 % of the 3.12 GB/s expected on Ethernet eth0 at 25000 Mb/s on a, b" in fail.summary
    assert "bottleneck: a tbf qdisc on eth0 of b shapes the link to 1 Gbit/s (0.125 GB/s)" in fail.summary
    assert fail.remedy.startswith("remove or raise the shaping qdisc")
    assert not [f for f in found if f.summary.startswith("link rank")]  # one cause, one finding
    # Within the margin: a WARN; above it: the pass line says how far it got.
    near = Row("all_reduce", 4 << 20, 1 << 20, "float", 1.0, 1.0, 1, 2.0, 2.0, 0)
    [warn] = [f for f in _judge([near], [], 2, [0, 1], {}, None, [], facts={0: facts(None), 1: facts(None)},
                                hosts={0: "a", 1: "b"}) if f.status == "warn"]
    assert "64 % of the 3.12 GB/s expected" in warn.summary and "below --warn-busbw-pct 80" in warn.summary
    assert "no bottleneck found in the facts" in warn.summary
    fine = Row("all_reduce", 4 << 20, 1 << 20, "float", 1.0, 1.0, 1, 3.0, 3.0, 0)
    [ok] = _judge([fine], [], 2, [0, 1], {}, None, [], facts={0: facts(None), 1: facts(None)},
                  hosts={0: "a", 1: "b"})
    assert ok.status == "pass" and "is 96 % of the 3.12 GB/s expected" in ok.summary
