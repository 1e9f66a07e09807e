"""Throughput and memory of `ddpdoctor explain` on a large generated log (target: >= 100 MB/s, flat RSS).

Usage: python tests/perf/explain_throughput.py [SIZE_MB] (default 1024). Writes a realistic multi-rank log
(training step lines, NCCL INFO chatter, Python traceback frames, a few real error lines spread through it)
into a temporary directory, scans it with the same engine the CLI uses, and prints MB/s, peak RSS before
and after, and what was found. It prints numbers; it does not assert timings (machines differ).
"""

from __future__ import annotations

import os
import random
import resource
import sys
import tempfile
import time

from ddpdoctor.explain import Scanner

# Real texts (see tests/test_explain.py for where each comes from), sprinkled so the matcher does real work.
_ERRORS = [
    "[rank3]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) "
    "ran for 600081 milliseconds before timing out.",
    "[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
    "closed by peer [127.0.0.1]:36999. This is typically caused by a remote worker crashing.",
    "[rank2]: RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
    "This error indicates that your module has parameters that were not used in producing loss.",
    "[rank2]: Parameter indices which did not receive grad for rank 2: 362 363 364 365",
]


def _noise_line(i: int, rng: random.Random) -> str:
    k = i % 10
    if k < 6:
        return (f"[rank{i % 8}]:[2026-11-22 01:39:{i % 60:02d}] step {i} loss {rng.random():.5f} lr 3.0e-4 "
                f"grad_norm {rng.random():.3f} throughput 1234.5 tokens/s\n")
    if k < 9:
        return (f"node-a:{1000 + i % 8}:{2000 + i % 8} [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : "
                f"{i % 8}[{i % 8}] -> {(i + 1) % 8}[{(i + 1) % 8}] via P2P/CUMEM/read\n")
    return f'  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line {i % 2000}, in _call_impl\n'


def generate(path: str, size_bytes: int) -> int:
    """Write about ``size_bytes`` of log to ``path`` in 4 MB pieces (flat memory here too)."""
    rng = random.Random(0)
    piece = "".join(_noise_line(i, rng) for i in range(40000)).encode()
    written = 0
    n = 0
    with open(path, "wb") as fh:
        while written < size_bytes:
            fh.write(piece)
            written += len(piece)
            n += 1
            if n % 25 == 0:  # a few real errors every ~100 MB
                fh.write(("\n".join(_ERRORS) + "\n").encode())
    return written


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    size_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-explain-perf-") as tmp:
        path = os.path.join(tmp, "train.log")
        t0 = time.perf_counter()
        size = generate(path, size_mb * 1_000_000)
        print(f"generated {size / 1e6:,.0f} MB in {time.perf_counter() - t0:.1f} s: {path}")
        scanner = Scanner()
        rss_before = peak_rss_mb()
        t0 = time.perf_counter()
        with open(path, "rb") as fh:
            scanner.scan(path, fh)
        elapsed = time.perf_counter() - t0
        result = scanner.result()
        rss_after = peak_rss_mb()
    print(f"scanned {scanner.bytes_scanned / 1e6:,.0f} MB, {scanner.lines_scanned:,} lines in {elapsed:.2f} s: "
          f"{scanner.bytes_scanned / 1e6 / elapsed:,.0f} MB/s (target >= 100 MB/s)")
    print(f"peak RSS: {rss_before:,.0f} MB before the scan, {rss_after:,.0f} MB after "
          f"(growth {rss_after - rss_before:,.0f} MB for a {size / 1e6:,.0f} MB file)")
    for d in result.diagnoses:
        print(f"  found {d.id}: {d.count} lines, ranks {sorted(d.ranks)}")


if __name__ == "__main__":
    main()
