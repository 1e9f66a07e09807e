"""`check` on a crowded machine: no false alarms from noise, and a really throttled rank still named.

Real processes: `ddpdoctor check` self-launches 8 gloo ranks on this (2-core) machine, and a 4-rank
torchrun job has one rank throttled for real by tests/faults/rank_fault.py (SIGSTOP/SIGCONT duty cycle,
the effect of a CFS CPU quota).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, clean_env, free_port, run_cli, torchrun_cmd

pytestmark = pytest.mark.slow

CORES = len(os.sched_getaffinity(0))


# 8 ranks, not 16: on 2 cores (CI) 8 ranks already take turns, and links look slow at first and are not
# blamed (5 links at 8 ranks, 19 at 16, on the 2-core development VM beside another test run), which is the
# case under test; 8 ranks took 30 s there, 16 took 40 s.
@pytest.mark.skipif(CORES >= 8, reason="8 ranks are not crowded on a machine with 8 or more cores")
def test_eight_ranks_on_few_cores_blame_no_link_and_name_the_crowding() -> None:
    proc = run_cli(["check", "--nproc", "8", "--only", "bandwidth", "--json", "-"], timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    bandwidth = [f for f in report["findings"] if f["check"] == "bandwidth"]
    summaries = [f["summary"] for f in bandwidth]
    assert not any(" is slow" in s for s in summaries), summaries
    crowded = [f for f in bandwidth if "CPU core" in f["summary"]]
    assert len(crowded) == 1, summaries
    # Other processes' runnable threads on those cores (other test runs here) are counted and named too.
    assert re.match(rf"8 ranks( and \d+ runnable threads? of other processes \(not this job's\))? share {CORES} "
                    "CPU core", crowded[0]["summary"]), crowded[0]["summary"]
    # A warning when some pair looked slow at first (it then says it was not blamed), else a note on the pass.
    assert crowded[0]["ranks"] == list(range(8)) and crowded[0]["status"] in ("warn", "pass")
    assert report["status"] in ("warn", "pass")
    # The JSON keeps the repeats of every pair that was measured again.
    measured = next(f for f in bandwidth if f["status"] == "pass" and "busbw" in f["summary"])
    assert all("samples_gbps" in p for p in measured["details"]["pairs"])


def test_a_throttled_rank_is_still_named_among_four(tmp_path: Path) -> None:
    """Up to three tries. On two cores shared by four ranks a try may honestly end in "contention" with nobody
    blamed (the run's own noise too large to judge, or another test worker's ranks beside this job); no try may
    ever blame another rank, and one of them must name rank 3 (1 of 6 tries alone, and one whole suite of five,
    ended in contention before the undecided pairs were measured again; one suite in three still did after)."""
    named: list[dict[str, Any]] = []
    for attempt in range(3):
        report = tmp_path / f"report{attempt}.json"
        cmd = [*torchrun_cmd(), "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), "--monitor-interval", "0.1",
               str(REPO / "tests" / "faults" / "rank_fault.py"), "throttle", "3", "--",
               "check", "--only", "bandwidth", "--timeout", "60", "--json", str(report)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=clean_env(), cwd=tmp_path)
        assert report.exists(), proc.stderr[-3000:]
        data = json.loads(report.read_text())
        slow = [f for f in data["findings"] if f["check"] == "bandwidth" and f["status"] == "warn"
                and " is slow" in f["summary"]]
        assert all(f["ranks"] == [3] for f in slow), [f["summary"] for f in slow]  # never another rank
        if slow:
            named = slow
            break
    assert [f["ranks"] for f in named] == [[3]], [f["summary"] for f in data["findings"]]
    assert named[0]["summary"].startswith("rank 3 ")
    # Named after being measured again: its pairs carry more than one sample.
    pairs = named[0]["details"]["pairs"]
    assert any(len(p["samples_gbps"]) > 1 for p in pairs if 3 in (p["a"], p["b"]))
