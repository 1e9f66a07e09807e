"""`ddpdoctor bench`'s model: the numbers, exactly as nccl-tests defines them, and what counts as a problem.

This module is pure (no torch at import): option parsing (sizes like ``64M``), the size sweep, the
bandwidth formulas, the data classes (:class:`BenchConfig`, :class:`Row`), combining each rank's timings, and
the verdict; the pairwise link test is :mod:`ddpdoctor.bench.pairs`. The collectives run in
:mod:`ddpdoctor.bench.ops` and are measured by :mod:`ddpdoctor.bench.measure`; :mod:`ddpdoctor.bench.render`
shows the results; :mod:`ddpdoctor.bench.driver` orchestrates the ranks.

Bandwidth, as nccl-tests' doc/PERFORMANCE.md defines it (GB = 1e9 bytes):

- ``algbw = S / t`` where S is the bytes each rank contributes (all_reduce, broadcast, sendrecv) or that
  times the number of ranks (all_gather, reduce_scatter, all_to_all). The ``size`` column is the larger
  buffer of the operation, as nccl-tests prints it, so for every op ``algbw = size / t``.
- ``busbw = algbw * factor``: 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and
  all_to_all, 1 for broadcast and sendrecv. busbw is comparable with the hardware's link speed whatever
  the number of ranks; algbw is what the application sees.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddpdoctor.bench.pairs import PairAnalysis
from ddpdoctor.errors import DoctorError

MIB = 1 << 20

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class OpSpec:
    """One benchmarked operation: how its size maps to S and its nccl-tests bus factor."""

    name: str
    # all_gather, reduce_scatter, all_to_all: a row's size is the whole result, each rank gives size / n.
    scaled_by_nranks: bool
    # nccl-tests' redop/root columns ("none" for ops that do not reduce; -1 for ops without a root).
    redop: str
    root: int
    # The two buffer layouts nccl-tests times (src/common.cu: BenchTime for in_place 0, then 1) that
    # torch.distributed offers for this op: all_reduce and broadcast exist only in place (one tensor),
    # all_to_all_single and send/recv only with separate buffers. The other column is left blank, as
    # nccl-tests leaves a layout it does not run (writeBenchMarkLineNullBody).
    out_of_place: bool = True
    in_place: bool = True

    @property
    def reduces(self) -> bool:
        return self.redop != "none"

    def bus_factor(self, nranks: int) -> float:
        """busbw / algbw, from nccl-tests doc/PERFORMANCE.md."""
        if self.name == "all_reduce":
            return 2 * (nranks - 1) / nranks
        if self.name in ("all_gather", "reduce_scatter", "all_to_all"):
            return (nranks - 1) / nranks
        return 1.0

    @staticmethod
    def algbw_gbps(size: int, time_us: float) -> float:
        """algbw = size / t (nccl-tests' S x nranks for the scaled ops: row sizes are whole elements per rank)."""
        return size / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0

    def busbw_gbps(self, size: int, nranks: int, time_us: float) -> float:
        return self.algbw_gbps(size, time_us) * self.bus_factor(nranks)


OPS: dict[str, OpSpec] = {
    "all_reduce": OpSpec("all_reduce", False, "sum", -1, out_of_place=False),
    "all_gather": OpSpec("all_gather", True, "none", -1),
    "reduce_scatter": OpSpec("reduce_scatter", True, "sum", -1),
    "broadcast": OpSpec("broadcast", False, "none", 0, out_of_place=False),
    "all_to_all": OpSpec("all_to_all", True, "none", -1, in_place=False),
    "sendrecv": OpSpec("sendrecv", False, "none", -1, in_place=False),
}
# The nccl-tests binary of each op (its first word on a pasted nccl-tests command line).
NCCL_TESTS_BINARIES: dict[str, str] = {
    "all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
    "broadcast_perf": "broadcast", "alltoall_perf": "all_to_all", "sendrecv_perf": "sendrecv",
}
# nccl-tests binaries with no counterpart here, and why.
UNMEASURED_BINARIES: dict[str, str] = {
    "reduce_perf": "ncclReduce (DDP never calls reduce; torch.distributed.reduce is not measured)",
    "gather_perf": "gather (torch.distributed.gather is not measured)",
    "scatter_perf": "scatter (torch.distributed.scatter is not measured)",
    "hypercube_perf": "the hypercube exchange pattern",
    "alltoallv_perf": "all-to-all with per-rank sizes (a traffic matrix)",
}
OP_NAMES: tuple[str, ...] = tuple(OPS)

# nccl-tests' type names (what the table shows) -> torch dtype names, with the aliases users type.
DTYPES: dict[str, str] = {
    "float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64",
    "int8": "int8", "uint8": "uint8", "int32": "int32", "int64": "int64",
}
_DTYPE_ALIASES: dict[str, str] = {
    "float32": "float", "fp32": "float", "f32": "float", "float16": "half", "fp16": "half", "f16": "half",
    "bf16": "bfloat16", "float64": "double", "fp64": "double", "f64": "double", "int": "int32",
    "char": "int8", "uint": "uint8",
}
DTYPE_BYTES: dict[str, int] = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int8": 1, "uint8": 1,
                               "int32": 4, "int64": 8}


# A sweep with more sizes than this is refused (-i 1 from 1 to 1G would never end).
MAX_SWEEP_SIZES = 10_000

# Sizes beyond this are refused at parse time (1 PiB: more than any machine's memory), so absurd digits
# never reach arithmetic; sizes that merely exceed this machine's memory are refused by the memory check.
MAX_SIZE_BYTES = 1 << 50


def parse_size(text: str, flag: str = "size") -> int:
    """'64M' -> 67108864 (powers of 1024, as nccl-tests reads -b/-e); DoctorError on anything else."""
    from fractions import Fraction

    shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
    match = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not match:
        raise DoctorError(f"{flag} takes a size like 1024, 1K, 64M or 1G, got: {shown!r}")
    value = Fraction(match.group(1)) * _UNITS[match.group(2)]
    if value < 1 or value.denominator != 1:
        raise DoctorError(f"{flag} must be a whole number of bytes >= 1, got: {shown!r}")
    if value > MAX_SIZE_BYTES:
        raise DoctorError(f"{flag} {shown}: larger than any machine's memory (at most 1024T)")
    return int(value)


def bytes_per_rank(ops: Sequence[str], size: int, dtype: str, check: bool) -> int:
    """Peak memory one rank takes for the largest row: its buffers and the pattern/check temporaries.

    ``ops.OpRunner`` holds an input and an output of up to ``size`` bytes; building the input and the
    exact expected result (``ops.pattern``/``ops.reduced``) takes int32 (int64 past 2^31 elements) index
    tensors of one element per buffer element: a few at a time. Measured peaks (torch 2.13 CPU, 256 MiB,
    -c 1, RSS above an idle rank): float all_reduce 3.9 index tensors beside its buffer, int8 all_gather
    2.4 beside its two buffers; 5 (3 without the check) bounds both.
    """
    count = size // DTYPE_BYTES[dtype]
    index_bytes = 4 if count < (1 << 31) - 1 else 8
    temporaries = (5 if check else 3) * count * index_bytes
    buffers = 2 * size if any(op != "all_reduce" and op != "broadcast" for op in ops) else size
    return buffers + temporaries


def min_row_bytes(ops: Sequence[str], dtype: str, nranks: int) -> tuple[int, str]:
    """The smallest size every op can measure (one element; one per rank for the split ops), and why."""
    element = DTYPE_BYTES[dtype]
    split = [op for op in ops if OPS[op].scaled_by_nranks]
    if split and nranks > 1:
        return element * nranks, f"{split[0]} gives each of the {nranks} ranks a share of at least one {dtype} " \
            f"({element} byte{'s' if element != 1 else ''})"
    return element, f"one {dtype} is {element} byte{'s' if element != 1 else ''}"


# nccl-tests type names (src/common.cu, test_typenames) that PyTorch's process groups cannot run: refused
# with the reason rather than measured as something else.
UNSUPPORTED_DTYPES: dict[str, str] = {
    "uint32": "PyTorch's process groups have no uint32 collectives (c10d's NCCL type map in NCCLUtils.hpp has "
              "none, and gloo has none)",
    "uint64": "PyTorch's process groups have no uint64 collectives (c10d's NCCL type map in NCCLUtils.hpp has "
              "none, and gloo has none)",
    "f8e4m3": "float8 is not measured: PyTorch's NCCL process group refuses float8 reductions and gloo has no "
              "float8",
    "f8e5m2": "float8 is not measured: PyTorch's NCCL process group refuses float8 reductions and gloo has no "
              "float8",
}


def parse_dtype(text: str) -> str:
    """The nccl-tests type name for what the user typed (float, fp16, bf16, int8, ...)."""
    name = text.strip().lower()
    name = _DTYPE_ALIASES.get(name, name)
    if name in UNSUPPORTED_DTYPES:
        raise DoctorError(f"-d/--dtype {text.strip()}: {UNSUPPORTED_DTYPES[name]}")
    if name not in DTYPES:
        raise DoctorError(f"-d/--dtype must be one of {', '.join(DTYPES)} or all (nccl-tests' names; fp32, fp16, "
                          f"bf16... also work), got: {text!r}")
    return name


def parse_dtypes(text: str) -> list[str]:
    """``-d``: one type, a comma list, or ``all`` (every type, as nccl-tests' ``-d all``)."""
    if text.strip().lower() == "all":
        return list(DTYPES)
    names: list[str] = []
    for part in text.split(","):
        name = parse_dtype(part)
        if name not in names:
            names.append(name)
    return names


# nccl-tests' -o names (src/common.cu, test_opnames; "all" runs sum, prod, max, min, avg in that order) and
# the torch.distributed.ReduceOp member each maps to.
REDOPS: dict[str, str] = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN", "avg": "AVG"}
UNSUPPORTED_REDOPS: dict[str, str] = {
    "mulsum": "nccl-tests' mulsum is ncclRedOpCreatePreMulSum, which torch.distributed offers only through a "
              "private API; use sum",
}


def parse_redops(text: str) -> list[str]:
    """``-o``: one reduction op, a comma list, or ``all`` (sum, prod, max, min, avg: nccl-tests' order).

    Whether the backend can run each op on each type is found out by running it once before the sweep
    (gloo, for one, averages floating types but not integers); see :mod:`ddpdoctor.bench.driver`.
    """
    wanted = text.strip().lower()
    if wanted == "all":
        return list(REDOPS)
    ops: list[str] = []
    for part in wanted.split(","):
        name = part.strip()
        if name in UNSUPPORTED_REDOPS:
            raise DoctorError(f"-o/--redop {name}: {UNSUPPORTED_REDOPS[name]}")
        if name not in REDOPS:
            raise DoctorError(f"-o/--redop must be one of {', '.join(REDOPS)} or all (nccl-tests' names), got: "
                              f"{part.strip()!r}")
        if name not in ops:
            ops.append(name)
    return ops


# nccl-tests' -a (src/common.cu: "report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>").
AVERAGES: dict[int, str] = {0: "rank 0's", 1: "the ranks' average", 2: "the fastest rank's", 3: "the slowest rank's"}
# nccl-tests' -z (README "Test operation"): 0 non-blocking, 1 wait and barrier after each call, 2 wait after
# each call, 3 wait after each call and barrier, the barrier left out of the time.
BLOCKING: dict[int, str] = {0: "non-blocking", 1: "wait and barrier after each call",
                            2: "wait after each call, no barrier",
                            3: "wait and barrier after each call; time excludes the barrier"}


def parse_ops(text: str) -> list[str]:
    """'all' -> every op; 'all_reduce,broadcast' -> those (dashes and 'allreduce' accepted)."""
    wanted: list[str] = []
    for part in text.split(","):
        name = part.strip().lower().replace("-", "_")
        if not name:
            continue
        if name == "all":
            return list(OP_NAMES)
        name = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                "alltoall": "all_to_all", "send_recv": "sendrecv"}.get(name, name)
        if name not in OPS:
            raise DoctorError(f"--op must be one of {', '.join(OP_NAMES)} or all, got: {part.strip()!r}")
        if name not in wanted:
            wanted.append(name)
    if not wanted:
        raise DoctorError("--op is empty; give one of " + ", ".join(OP_NAMES) + " or all")
    return wanted


def size_sweep(min_bytes: int, max_bytes: int, step_factor: float, step_bytes: int | None = None) -> list[int]:
    """The sizes nccl-tests visits: min, min*f, ... up to max (max itself is not added if skipped); with
    ``step_bytes`` (nccl-tests' ``-i``) min, min+i, min+2i, ... instead."""
    if min_bytes > max_bytes:
        raise DoctorError(f"-b/--min-bytes ({human_bytes(min_bytes)}) is larger than -e/--max-bytes "
                          f"({human_bytes(max_bytes)})")
    if step_bytes is not None:
        if step_bytes < 1:
            raise DoctorError(f"-i/--stepbytes must be at least 1 byte, got: {step_bytes}")
        steps = (max_bytes - min_bytes) // step_bytes + 1
        if steps > MAX_SWEEP_SIZES:
            raise DoctorError(f"-i/--stepbytes {human_bytes(step_bytes)} from {human_bytes(min_bytes)} to "
                              f"{human_bytes(max_bytes)} is {steps} sizes; at most {MAX_SWEEP_SIZES} (use a larger -i, "
                              "or -f)")
        return list(range(min_bytes, max_bytes + 1, step_bytes))
    if not step_factor > 1 and min_bytes != max_bytes:
        raise DoctorError(f"-f/--step-factor must be greater than 1, got: {step_factor:g}")
    sizes = [min_bytes]
    while min_bytes != max_bytes:
        grown = sizes[-1] * step_factor  # compared as a float: -f inf or 1e308 has no int
        if grown > max_bytes:
            break
        nxt = max(int(grown), sizes[-1] + 1)
        if nxt > max_bytes:
            break
        sizes.append(nxt)
    return sizes


def row_count(size: int, dtype: str, op: str, nranks: int) -> int:
    """Elements in the row's (larger) buffer, rounded down so each rank's share is whole elements."""
    count = size // DTYPE_BYTES[dtype]
    if OPS[op].scaled_by_nranks:
        count -= count % nranks
    return count


def human_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class BenchConfig:
    """What the user asked for; every rank rebuilds it from the same command line."""

    ops: tuple[str, ...] = ("all_reduce",)
    sizes: tuple[int, ...] = (MIB,)
    iters: int = 20
    warmup: int = 5
    dtypes: tuple[str, ...] = ("float",)
    # nccl-tests' -c: checked calls per measured layout (each on fresh inputs; 0 = no check).
    check_iters: int = 1
    pairs: bool = False
    min_busbw_gbps: float | None = None
    json_path: str | None = None
    plot_path: str | None = None
    backend: str = "auto"
    timeout_s: float = 60.0
    op_label: str = "all_reduce"
    # nccl-tests' -o, -r, -a, -z, -C, -S, -N, -J.
    redops: tuple[str, ...] = ("sum",)
    root: int = 0
    average: int = 1
    blocking: int = 0
    cputime: bool = False
    timestamps: bool = False
    run_cycles: int = 1
    nccl_json_path: str | None = None
    # Where the threshold came from, for the verdict: "--min-busbw", or "90 % of NCCL_TESTS_MIN_BW=22.2".
    min_busbw_label: str = "--min-busbw"
    # The command line and step as given, for nccl-tests' JSON ("args", "config").
    argv: tuple[str, ...] = ()
    step_bytes: int | None = None
    step_factor: float = 2.0
    # Against the expected busbw of the path (bench.expect): FAIL below fail_pct %, WARN below warn_pct %.
    fail_pct: float = 50.0
    warn_pct: float = 80.0

    @property
    def dtype(self) -> str:
        """The first type: the one the pair test and the plot title use."""
        return self.dtypes[0]

    @property
    def check(self) -> bool:
        return self.check_iters > 0

    @property
    def pair_bytes(self) -> int:
        """Message size of the pairwise link test: the sweep's largest size."""
        return max(self.sizes)

    def redops_for(self, op: str) -> tuple[str, ...]:
        """The reduction ops a row of ``op`` runs with: ``-o``'s for reductions, "none" otherwise."""
        return self.redops if OPS[op].reduces else ("none",)


@dataclass
class Timing:
    """One layout (out-of-place or in-place) of one row, combined over the ranks."""

    time_us: float  # as -a says: the ranks' average (default), rank 0's, the fastest's or the slowest's
    max_time_us: float
    slowest_rank: int
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None when not checked (-c 0)

    def to_json(self) -> dict[str, Any]:
        return {"time_us": self.time_us, "max_time_us": self.max_time_us, "slowest_rank": self.slowest_rank,
                "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps, "wrong": self.wrong}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Timing | None:
        if data is None:
            return None
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


@dataclass
class Row:
    """One size of one op, combined over all ranks.

    The top-level numbers are the out-of-place layout's where torch.distributed has one, else the in-place
    layout's (all_reduce, broadcast); ``out_of_place`` and ``in_place`` hold each layout measured.
    """

    op: str
    bytes: int
    count: int
    dtype: str
    time_us: float
    max_time_us: float
    slowest_rank: int
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None when -c 0
    # The sweep's size before rounding to whole elements per rank (what -b/-e/-f asked for).
    requested_bytes: int = 0
    redop: str = "sum"
    root: int = -1
    out_of_place: Timing | None = None
    in_place: Timing | None = None
    timestamp: str = ""

    def to_json(self) -> dict[str, Any]:
        data = {"op": self.op, "bytes": self.bytes, "count": self.count, "dtype": self.dtype,
                "time_us": self.time_us, "max_time_us": self.max_time_us, "algbw_gbps": self.algbw_gbps,
                "busbw_gbps": self.busbw_gbps, "wrong": self.wrong, "slowest_rank": self.slowest_rank,
                "requested_bytes": self.requested_bytes, "redop": self.redop, "root": self.root,
                "out_of_place": self.out_of_place.to_json() if self.out_of_place else None,
                "in_place": self.in_place.to_json() if self.in_place else None}
        if self.timestamp:
            data["timestamp"] = self.timestamp
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Row:
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        for layout in ("out_of_place", "in_place"):
            if layout in fields:
                fields[layout] = Timing.from_json(fields[layout])
        return cls(**fields)

    def timings(self) -> list[Timing]:
        return [t for t in (self.out_of_place, self.in_place) if t is not None]


def combine_timing(op: str, size: int, times_us: Sequence[float], wrong: Sequence[int | None] | None,
                   average: int = 1) -> Timing:
    """Each rank's time for one layout of one size -> one figure, as nccl-tests' ``-a`` says (default 1: the
    ranks' average); the slowest rank and its time are kept whatever ``-a`` is."""
    nranks = len(times_us)
    slowest = max(range(nranks), key=lambda r: times_us[r])
    chosen = {0: times_us[0], 2: min(times_us), 3: times_us[slowest]}.get(average, sum(times_us) / nranks)
    spec = OPS[op]
    wrongs = None if wrong is None or any(w is None for w in wrong) else int(sum(w or 0 for w in wrong))
    return Timing(chosen, times_us[slowest], slowest, spec.algbw_gbps(size, chosen),
                  spec.busbw_gbps(size, nranks, chosen), wrongs)


def make_row(op: str, size: int, count: int, dtype: str, out_of_place: Timing | None, in_place: Timing | None,
             requested: int = 0, redop: str = "sum", root: int = -1, timestamp: str = "") -> Row:
    """A row from its measured layouts; the top-level numbers are the out-of-place layout's when there is one."""
    main = out_of_place or in_place
    assert main is not None, "a row measures at least one layout"
    return Row(op, size, count, dtype, main.time_us, main.max_time_us, main.slowest_rank, main.algbw_gbps,
               main.busbw_gbps, main.wrong, requested or size, redop, root, out_of_place, in_place, timestamp)


def combine_row(op: str, size: int, count: int, dtype: str, times_us: Sequence[float],
                wrong: Sequence[int] | None, requested: int = 0) -> Row:
    """Each rank's time for one size -> one row of the op's single layout (the ranks' average, -a 1)."""
    timing = combine_timing(op, size, times_us, wrong)
    layout = {"out_of_place": timing} if OPS[op].out_of_place else {"in_place": timing}
    return make_row(op, size, count, dtype, layout.get("out_of_place"), layout.get("in_place"), requested,
                    OPS[op].redop, OPS[op].root)


def _mean_busbw(rows: Sequence[Row]) -> float | None:
    """The mean busbw of ``rows``, every measured layout counted (nccl-tests averages out-of-place and
    in-place alike); None for no rows."""
    bws = [bw for r in rows for bw in ([t.busbw_gbps for t in r.timings()] or [r.busbw_gbps])]
    return sum(bws) / len(bws) if bws else None


def avg_busbw(rows: Sequence[Row]) -> float | None:
    """Average busbw over the sizes >= 1 MiB (small sizes measure latency, not bandwidth), every measured
    layout counted (nccl-tests averages out-of-place and in-place alike).

    The requested size counts: 1 MiB of all_gather on 3 ranks is 1048572 bytes, still a 1 MiB row.
    """
    return _mean_busbw([r for r in rows if max(r.bytes, r.requested_bytes) >= MIB])


@dataclass(frozen=True)
class MinBusbwCheck:
    """One op's average busbw against ``--min-busbw`` (or 90 % of ``NCCL_TESTS_MIN_BW``).

    The one place that decides what is compared, so that the exit code, the ``FAIL:`` line, the table's
    footer and the JSON all name the same figure: the average over the sizes >= 1 MiB, or, in a sweep with
    none that large, over every size (a threshold given is never silently skipped).
    """

    measured_gbps: float
    all_sizes: bool  # True: no size >= 1 MiB in the sweep, so every size was averaged
    threshold_gbps: float
    threshold_label: str  # "--min-busbw 100 GB/s", or "90 GB/s (90 % of NCCL_TESTS_MIN_BW=100, as nccl-tests)"

    @property
    def passed(self) -> bool:
        return self.measured_gbps >= self.threshold_gbps

    @property
    def over(self) -> str:
        return "over all sizes: none >= 1 MiB" if self.all_sizes else "sizes >= 1 MiB"

    def to_json(self) -> dict[str, Any]:
        return {"measured_busbw_gbps": self.measured_gbps, "over": "all_sizes" if self.all_sizes else "sizes_ge_1mib",
                "threshold_gbps": self.threshold_gbps, "status": "pass" if self.passed else "fail"}


def threshold_label(config: BenchConfig) -> str:
    """How the absolute threshold is named in the verdicts: the option, or where the environment set it."""
    assert config.min_busbw_gbps is not None
    if config.min_busbw_label == "--min-busbw":
        return f"--min-busbw {config.min_busbw_gbps:g} GB/s"
    return f"{config.min_busbw_gbps:g} GB/s ({config.min_busbw_label})"


def min_busbw_check(config: BenchConfig, op_rows: Sequence[Row]) -> MinBusbwCheck | None:
    """``op_rows`` (one op's rows) against the absolute threshold; None without a threshold or rows."""
    if config.min_busbw_gbps is None:
        return None
    avg = avg_busbw(op_rows)
    measured = avg if avg is not None else _mean_busbw(op_rows)
    if measured is None:
        return None
    return MinBusbwCheck(measured, avg is None, config.min_busbw_gbps, threshold_label(config))


# -- verdict -----------------------------------------------------------------------------------------


def fmt_bw(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 or value == 0 else f"{value:.4f}"


def wrong_total(row: Row) -> int:
    """Wrong elements in every layout of the row."""
    return sum(t.wrong or 0 for t in row.timings()) if row.timings() else (row.wrong or 0)


def problems(config: BenchConfig, rows: Sequence[Row], analysis: PairAnalysis | None,
             below_expected: Sequence[str] = ()) -> list[str]:
    """What makes the run exit 1: wrong values, busbw under --min-busbw (or NCCL_TESTS_MIN_BW), a slow host,
    a figure below --min-busbw-pct of what its path should give (``below_expected``, from bench.expect)."""
    found: list[str] = []
    for op in config.ops:
        op_rows = [r for r in rows if r.op == op]
        wrong = sum(wrong_total(r) for r in op_rows)
        if wrong:
            bad = list(dict.fromkeys(human_bytes(r.bytes) for r in op_rows if wrong_total(r)))
            found.append(f"{op}: {wrong} wrong values (at {', '.join(bad)}): data is corrupted in transit; "
                         "check NCCL_PROTO/NCCL_ALGO overrides, NIC offloads and GPU memory errors")
        floor = min_busbw_check(config, op_rows)
        if floor is not None and not floor.passed:
            over = f" ({floor.over})" if floor.all_sizes else ""
            found.append(f"{op}: average busbw {fmt_bw(floor.measured_gbps)} GB/s{over} is below "
                         f"{floor.threshold_label}")
    if analysis is not None and analysis.slow_hosts:
        found.append(f"slow host{'s' if len(analysis.slow_hosts) > 1 else ''}: {', '.join(analysis.slow_hosts)}")
    return found + list(below_expected)
