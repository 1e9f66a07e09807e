"""``ddpdoctor bench``: nccl-tests-style collective bandwidth on every rank; slow ranks, hosts and links named.

- :mod:`~ddpdoctor.bench.analysis`: the model: the numbers as nccl-tests defines them (sizes, algbw/busbw),
  its data classes and the verdict.
- :mod:`~ddpdoctor.bench.pairs`: the link test's plan (which pairs exchange in which round) and its analysis
  (slow hosts, ranks and links, by a margin the run's own noise sets).
- :mod:`~ddpdoctor.bench.ops`: the collectives, their timing, inputs whose exact result is known.
- :mod:`~ddpdoctor.bench.measure`: one size of one op, and the pairwise link test, measured on every rank.
- :mod:`~ddpdoctor.bench.render`: the nccl-tests table, the pair list, the JSON documents (ours and
  nccl-tests' ``-J``), the plot.
- :mod:`~ddpdoctor.bench.nccl_tests`: a pasted nccl-tests command line: its binary name, the flags ddpdoctor
  does not implement (a note or a refusal with the reason), ``NCCL_TESTS_MIN_BW``.
- :mod:`~ddpdoctor.bench.driver`: what every rank does in ``ddpdoctor bench``; rank 0 prints.

The ``bandwidth`` check measures with the same functions (:func:`measure_row`, :func:`measure_pairs`).
No torch at import.
"""

from __future__ import annotations

from ddpdoctor.bench.analysis import (
    AVERAGES,
    BLOCKING,
    DTYPE_BYTES,
    MIB,
    BenchConfig,
    Row,
    Timing,
    avg_busbw,
    bytes_per_rank,
    human_bytes,
    min_row_bytes,
    parse_dtype,
    parse_dtypes,
    parse_ops,
    parse_redops,
    parse_size,
    size_sweep,
)
from ddpdoctor.bench.driver import run_bench
from ddpdoctor.bench.expect import (
    Evidence,
    LinkPath,
    Thresholds,
    Verdict,
    assess,
    crowding,
    failure_text,
    fmt_pct,
    host_device_evidence,
    host_device_path,
    judge,
    memory_spec,
    remedy,
    thresholds_from_options,
)
from ddpdoctor.bench.gpu_copy import device_memory, host_device
from ddpdoctor.bench.measure import gather, measure_pairs, measure_row
from ddpdoctor.bench.nccl_tests import FOREIGN_FLAGS, foreign_notes, min_busbw_from_env, op_from_binary
from ddpdoctor.bench.pairs import PairResult, analyse_pairs
from ddpdoctor.bench.render import check_plot_available

__all__ = [
    "AVERAGES",
    "BLOCKING",
    "DTYPE_BYTES",
    "FOREIGN_FLAGS",
    "MIB",
    "BenchConfig",
    "Evidence",
    "LinkPath",
    "PairResult",
    "Row",
    "Thresholds",
    "Timing",
    "Verdict",
    "analyse_pairs",
    "assess",
    "avg_busbw",
    "bytes_per_rank",
    "check_plot_available",
    "crowding",
    "device_memory",
    "failure_text",
    "fmt_pct",
    "foreign_notes",
    "gather",
    "host_device",
    "host_device_evidence",
    "host_device_path",
    "human_bytes",
    "judge",
    "measure_pairs",
    "measure_row",
    "memory_spec",
    "min_busbw_from_env",
    "min_row_bytes",
    "op_from_binary",
    "parse_dtype",
    "parse_dtypes",
    "parse_ops",
    "parse_redops",
    "parse_size",
    "remedy",
    "run_bench",
    "size_sweep",
    "thresholds_from_options",
]
