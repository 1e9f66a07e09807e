"""``ddpdoctor bench``: nccl-tests-style collective bandwidth on every rank; slow ranks, hosts and links named.

- :mod:`~ddpdoctor.bench.analysis`: the model: the numbers as nccl-tests defines them (sizes, algbw/busbw),
  its data classes, the pair analysis and the verdict.
- :mod:`~ddpdoctor.bench.ops`: the collectives, their timing, inputs whose exact result is known.
- :mod:`~ddpdoctor.bench.measure`: one size of one op, and the pairwise link test, measured on every rank.
- :mod:`~ddpdoctor.bench.render`: the nccl-tests table, the pair list, the JSON document, the plot.
- :mod:`~ddpdoctor.bench.driver`: what every rank does in ``ddpdoctor bench``; rank 0 prints.

The ``bandwidth`` check measures with the same functions (:func:`measure_row`, :func:`measure_pairs`).
No torch at import.
"""

from __future__ import annotations

from ddpdoctor.bench.analysis import (
    MIB,
    BenchConfig,
    PairResult,
    Row,
    analyse_pairs,
    avg_busbw,
    bytes_per_rank,
    human_bytes,
    min_row_bytes,
    parse_dtype,
    parse_ops,
    parse_size,
    size_sweep,
)
from ddpdoctor.bench.driver import run_bench
from ddpdoctor.bench.measure import gather, measure_pairs, measure_row
from ddpdoctor.bench.render import check_plot_available

__all__ = ["MIB", "BenchConfig", "PairResult", "Row", "analyse_pairs", "avg_busbw", "bytes_per_rank",
           "check_plot_available", "gather", "human_bytes", "measure_pairs", "measure_row", "min_row_bytes", "parse_dtype", "parse_ops", "parse_size", "run_bench",
           "size_sweep"]
