"""Scan speed of `ddpdoctor explain` on each common family of healthy log lines, and on a mix (issue 26).

Usage: python benchmarks/explain_families.py [SIZE_MB] (default 25 MB per family, 4 x that for the mix).

The families are the ones issue 26 measured (14 MB/s on glog heartbeat lines before its prefilter work):

* ``heartbeat``: PyTorch's glog lines from ProcessGroupNCCL (``[rank3]:[I501 ... ProcessGroupNCCL.cpp:1538]
  [PG ID 0 PG GUID 0(default_pg) Rank 3] ProcessGroupNCCL heart beat monitor thread joined.``);
* ``trainer``: a trainer's logging lines (``2024-05-01 10:00:12,345 - INFO - train.py:212 - epoch 3 step ...``);
* ``nccl-info``: ``NCCL_DEBUG=INFO`` channel lines;
* ``hf-dict``: the HF Trainer's metric dicts (``{'loss': 1.0001, 'grad_norm': 0.51, ...}``);
* ``mix``: the four interleaved.

Each log is scanned by the engine the CLI uses, alternately, as shipped and with the message inventory's
templates switched off (best of ``RUNS`` each, in MB per second of CPU time: see ``rate``) (the knowledge base's own keywords only), so the cost of the template matcher
(issue 26: recognising the messages the sources print) is a ratio measured here, not a guess; ``grep -c -F`` of
the usual error words over the same file is printed as the plain way. It prints numbers and asserts nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from ddpdoctor.explain import Scanner
from ddpdoctor.explain.prefilter import build_prefilter
from ddpdoctor.explain.templates import TemplateMatcher


def heartbeat(i: int) -> str:
    r = i % 8
    return (f"[rank{r}]:[I501 10:00:00.{i % 1000000:06d}659 ProcessGroupNCCL.cpp:1538] [PG ID 0 PG GUID "
            f"0(default_pg) Rank {r}] ProcessGroupNCCL heart beat monitor thread joined.\n")


def trainer(i: int) -> str:
    return (f"2024-05-01 10:00:{i % 60:02d},{i % 1000:03d} - INFO - train.py:212 - epoch 3 step {i} loss "
            f"2.{i % 9999:04d} lr 3.0e-4 grad_norm 0.8{i % 10} tokens/s 123456\n")


def nccl_info(i: int) -> str:
    return (f"node-a:{1000 + i % 8}:{2000 + i % 8} [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : {i % 8}[{i % 8}] -> "
            f"{(i + 1) % 8}[{(i + 1) % 8}] via P2P/CUMEM/read\n")


def hf_dict(i: int) -> str:
    return f"{{'loss': 1.{i % 9999:04d}, 'grad_norm': 0.5{i % 10}, 'learning_rate': 1.9e-05, 'epoch': 0.{i % 100:02d}}}\n"


FAMILIES: dict[str, Callable[[int], str]] = {"heartbeat": heartbeat, "trainer": trainer, "nccl-info": nccl_info,
                                             "hf-dict": hf_dict}


def mix(i: int) -> str:
    return list(FAMILIES.values())[i % 4](i)


def write(path: str, line: Callable[[int], str], size: int) -> int:
    written, i = 0, 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < size:
            chunk = "".join(line(i + k) for k in range(10000))
            fh.write(chunk)
            written += len(chunk)
            i += 10000
    return written


def without_templates() -> Scanner:
    """The shipped scanner with the inventory's templates switched off: the knowledge base's keywords only."""
    scanner = Scanner()
    scanner._templates = TemplateMatcher(())
    scanner._prefilter = build_prefilter(k for s in scanner.kb for k in s.keywords)
    return scanner


def rate(path: str, make: Callable[[], Scanner]) -> tuple[float, list[str]]:
    """MB scanned per second of this process's CPU time: the scan is single-threaded and CPU-bound (the file
    is in the page cache), and on a machine other jobs share, wall time measures them too."""
    scanner = make()
    t0 = time.process_time()
    with open(path, "rb") as fh:
        scanner.scan(path, fh)
    elapsed = time.process_time() - t0
    return scanner.bytes_scanned / 1e6 / elapsed, [d.id for d in scanner.result().diagnoses]


def best_of(runs: int, path: str) -> tuple[float, float, list[str]]:
    """Best rate of each variant over ``runs`` alternating scans: on a shared machine a single scan can be
    slowed by a neighbour's job at any time; alternating keeps both variants under the same conditions."""
    shipped, before, found = 0.0, 0.0, []
    for _ in range(runs):
        r, found = rate(path, Scanner)
        shipped = max(shipped, r)
        before = max(before, rate(path, without_templates)[0])
    return shipped, before, found


def grep_rate(path: str, size: int) -> str:
    """GNU grep counting lines with the words a user would grep for (as benchmarks/explain_throughput.py)."""
    if not shutil.which("grep"):
        return "n/a"
    words = ("Error", "NCCL WARN", "Watchdog", "exitcode")
    t0 = time.perf_counter()
    subprocess.run(["grep", "-c", "-F", *(a for w in words for a in ("-e", w)), path], capture_output=True,
                   check=False, timeout=600, env={**os.environ, "LC_ALL": "C"})
    return f"{size / 1e6 / (time.perf_counter() - t0):,.0f} MB/s"


RUNS = 3


def main() -> None:
    size_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    Scanner(), without_templates()  # build (and cache) both prefilters before any timing
    print("MB/s of CPU time (grep: wall time)")
    print(f"{'family':10} {'MB':>5} {'explain':>10} {'no templates':>13} {'ratio':>6} {'grep -c -F':>11}  found")
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-explain-families-") as tmp:
        for name, line in [*FAMILIES.items(), ("mix", mix)]:
            path = os.path.join(tmp, f"{name}.log")
            size = write(path, line, size_mb * 1_000_000 * (4 if name == "mix" else 1))
            shipped, before, found = best_of(RUNS, path)
            print(f"{name:10} {size / 1e6:5.0f} {shipped:6,.0f} MB/s {before:8,.0f} MB/s {shipped / before:6.2f} "
                  f"{grep_rate(path, size):>11}  {found or '-'}")
            os.unlink(path)


if __name__ == "__main__":
    main()
