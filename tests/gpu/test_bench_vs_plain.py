"""bench's row against a plain all_reduce loop on NCCL, in one process (issue 29 item 5).

Runs ``benchmarks/bench_vs_raw.py`` on one GPU: ``measure_row`` (what ``ddpdoctor bench`` prints) and a plain
``dist.all_reduce`` loop timed between two CUDA events (nccl-tests' way), interleaved, several rounds per size.
The ratio is printed for the log (scripts/gpu-tests.sh keeps it under $OUT), not asserted: tests never assert
speed. What is asserted is what a reader of that log relies on: every size measured, both timings positive,
and the bench's results verified (the script asserts #wrong == 0 on every row).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, clean_env

pytestmark = pytest.mark.requires_cuda


def test_bench_row_against_a_plain_loop_on_nccl_prints_the_ratio_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    script = Path(REPO) / "benchmarks" / "bench_vs_raw.py"
    proc = subprocess.run([sys.executable, str(script), "--backend", "nccl", "--nproc", "1", "--rounds", "5",
                           "--max-mib", "256"], capture_output=True, text=True, timeout=280,
                          env=clean_env({"CUDA_VISIBLE_DEVICES": "0"}))
    with capsys.disabled():
        print("\n" + proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 rank(s), nccl" in proc.stdout
    rows = re.findall(r"^\s+(\d+) MiB\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+)x$", proc.stdout, re.M)
    assert [int(r[0]) for r in rows] == [1, 4, 16, 64, 256]
    assert all(float(bench) > 0 and float(plain) > 0 for _, bench, plain, _, _ in rows)
