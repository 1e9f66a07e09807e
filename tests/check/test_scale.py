"""The control plane at 1,024 simulated ranks: rank 0's real rendezvous, collection and report.

The simulated ranks (ddpdoctor.check.simulate) speak the runner's store protocol key for key from a few
threads, without torch; rank 0 is the real RankRun with the real barrier/connectivity combine functions.
The 4,096-rank run and the timings are benchmarks/check_scale.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ddpdoctor.check.simulate import simulate
from ddpdoctor.checks import barrier, connectivity
from tests.support import REPO

CHECKS = [barrier.CHECK, connectivity.CHECK]

SCRIPT = """
import json, sys
from ddpdoctor.check.simulate import simulate
from ddpdoctor.checks import barrier, connectivity
res = simulate(1024, [barrier.CHECK, connectivity.CHECK], {5: "dead", 512: "silent", 1021: "late", 7: "slow"},
               timeout_s=0.8, measure_memory=False)
print(json.dumps({"text": res.text, "report": res.report.to_json(), "errors": res.notes,
                  "torch": "torch" in sys.modules}))
"""


def test_1024_ranks_three_bad_named_on_one_screen_without_torch() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["errors"] == [] and out["torch"] is False
    text, report = out["text"], out["report"]
    lines = text.splitlines()
    # One screen: a header that does not list 128 hosts, a few rows, the numbered remedies.
    assert len(lines) <= 40, text
    assert len(lines[0]) < 160, lines[0]
    assert "1024 ranks on 128 hosts (node0000 ... node0127)" in lines[0]
    assert report["status"] == "fail"
    never = [f for f in report["findings"] if "never joined" in f["summary"]]
    assert [f["ranks"] for f in never] == [[5, 1021]]
    silent = [f for f in report["findings"] if "went silent" in f["summary"]]
    assert [f["ranks"] for f in silent] == [[512]]
    assert "node0064" in silent[0]["summary"] and "'connectivity'" in silent[0]["summary"]
    # The slow rank (7) posted late but within the deadline: it is among the healthy, not named as bad.
    healthy = next(f for f in report["findings"] if f["check"] == "connectivity")
    assert healthy["status"] == "pass" and 7 in healthy["ranks"] and len(healthy["ranks"]) == 1021
    # Root cause first: the unreported ranks lead the table.
    assert report["findings"][0]["ranks"] == [5, 1021]


def test_many_silent_ranks_are_one_row_per_check_not_one_row_each() -> None:
    bad = {r: "silent" for r in range(100, 1024, 25)}  # 37 ranks on 37 hosts stop in the same check
    res = simulate(1024, CHECKS, bad, timeout_s=1.5, measure_memory=False)
    assert res.notes == []
    silent = [f for f in res.report.findings if "went silent" in f.summary]
    # One row per check the ranks stopped in (a healthy rank delayed past the deadline by a loaded CI
    # machine would get its own row, for its own last check).
    assert len(silent) == len({f.details["last_check"] for f in silent})
    row = next(f for f in silent if f.details["last_check"] == "connectivity")
    assert row.ranks == sorted(bad)
    assert "37 hosts" in row.summary and "'connectivity'" in row.summary
    assert len(res.text.splitlines()) <= 40
