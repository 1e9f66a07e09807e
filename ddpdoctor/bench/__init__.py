"""``ddpdoctor bench``: nccl-tests-style collective bandwidth on every rank; slow ranks, hosts and links named.

- :mod:`~ddpdoctor.bench.analysis`: the numbers as nccl-tests defines them (sizes, algbw/busbw, pair analysis).
- :mod:`~ddpdoctor.bench.ops`: the collectives, their timing, inputs whose exact result is known.
- :mod:`~ddpdoctor.bench.driver`: what every rank does in ``ddpdoctor bench``; rank 0 prints.

The ``bandwidth`` check measures with the same functions (:func:`measure_row`, :func:`measure_pairs`).
"""

from __future__ import annotations

from ddpdoctor.bench.analysis import (
    MIB,
    BenchConfig,
    PairResult,
    Row,
    analyse_pairs,
    avg_busbw,
    check_plot_available,
    human_bytes,
    parse_dtype,
    parse_ops,
    parse_size,
    size_sweep,
)
from ddpdoctor.bench.driver import measure_pairs, measure_row, run_bench

__all__ = ["MIB", "BenchConfig", "PairResult", "Row", "analyse_pairs", "avg_busbw", "check_plot_available",
           "human_bytes", "measure_pairs", "measure_row", "parse_dtype", "parse_ops", "parse_size", "run_bench",
           "size_sweep"]
