"""How ``ddpdoctor bench`` shows its numbers: nccl-tests' table, the pair list, the JSON, the plot.

Pure functions of the model in :mod:`ddpdoctor.bench.analysis` (no torch at import; matplotlib only when
plotting).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ddpdoctor.bench.analysis import (
    AVERAGES,
    BLOCKING,
    OPS,
    BenchConfig,
    MinBusbwCheck,
    Row,
    Timing,
    avg_busbw,
    fmt_bw,
    human_bytes,
    min_busbw_check,
    wrong_total,
)
from ddpdoctor.bench.expect import (
    Assessment,
    Thresholds,
    Verdict,
    fmt_gbps,
    fmt_pct,
    host_groups,
    host_groups_text,
)
from ddpdoctor.bench.pairs import PairAnalysis
from ddpdoctor.errors import DoctorError


def nccl_float(value: float, width: int) -> str:
    """A number in ``width`` characters the way nccl-tests prints its columns (util.cu getFloatStr):
    two decimals if they fit, else one, else none, else exponent notation."""
    for fmt in (f"{{:>{width}.2f}}", f"{{:>{width}.1f}}", f"{{:>{width}.0f}}"):
        text = fmt.format(value)
        if len(text) <= width:
            return text
    return (f"{{:>{width}.1e}}" if width >= 7 else f"{{:>{width}.0e}}").format(value)


def preamble(config: BenchConfig, devices: Sequence[tuple[int, int, str, str]]) -> str:
    """nccl-tests' run header (util.cu writeDeviceReport): the parameters, then one line per rank; with ranks
    on several hosts, where they run grouped by host ("# hosts: nodeA: ranks 0-1; nodeB: ranks 2-3").

    ``devices``: (rank, pid, host, device) for every rank. nccl-tests' nThread and nGpus are always 1 here
    (one rank per process, one device per rank); graph and unalign 0 (not implemented).
    """
    step = (f"{config.step_bytes}(bytes)" if config.step_bytes is not None else f"{config.step_factor:g}(factor)")
    lines = [f"# nThread 1 nGpus 1 minBytes {config.sizes[0]} maxBytes {config.sizes[-1]} step: {step} "
             f"warmup iters: {config.warmup} iters: {config.iters} agg iters: 1 validation: {config.check_iters} "
             "graph: 0 unalign: 0"]
    if config.blocking:
        lines.append(f"# Blocking Enabled: {BLOCKING[config.blocking]}")
    lines += ["#", "# Using devices"]
    lines += [f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {device}"
              for rank, pid, host, device in devices]
    hosts = {rank: host for rank, _, host, _ in devices}
    if len(set(hosts.values())) > 1:
        lines.append(f"# hosts: {host_groups_text(hosts)}")
    return "\n".join(lines)


def table_header(op: str, world_size: int, backend: str, hosts: int, iters: int, warmup: int,
                 cputime: bool = False, timestamps: bool = False, average: int = 1) -> str:
    """nccl-tests' table header (util.cu writeResultHeader): size, count, type, redop, root, then time,
    algbw, busbw and #wrong out-of-place and in-place; ddpdoctor adds the slowest rank and its time."""
    time = "cputime" if cputime else "time"
    spec = OPS[op]
    missing = [name for name, has in (("out-of-place", spec.out_of_place), ("in-place", spec.in_place)) if not has]
    title = (f"# ddpdoctor bench: {op}, {world_size} rank{'s' if world_size != 1 else ''} on {hosts} "
             f"host{'s' if hosts != 1 else ''}, backend {backend}, iters {iters}, warmup {warmup}")
    lines = [title]
    if missing:
        lines.append(f"# {missing[0]}: torch.distributed has no {missing[0]} {op} ({_ONE_LAYOUT[op]}); its columns "
                     "stay blank")
    if average != 1:
        lines.append(f"# time: {AVERAGES[average]} (-a {average}); max and slowest rank: the slowest rank's")
    ts_label, ts_unit = ("  timestamp", "  (local)") if timestamps else ("", "")
    lines += [
        f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}           out-of-place                       in-place",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {time:>7}  {'algbw':>6}  "
        f"{'busbw':>6}  {'#wrong':>6}  {time:>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}  {'max':>8}  "
        f"{'slowest':>7}{ts_label}",
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  "
        f"{'(GB/s)':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}  {'(us)':>8}  "
        f"{'rank':>7}{ts_unit}",
    ]
    return "\n".join(lines)


# Why an op has one layout only.
_ONE_LAYOUT = {"all_reduce": "dist.all_reduce works on one tensor", "broadcast": "dist.broadcast works on one tensor",
               "all_to_all": "all_to_all_single takes separate output and input",
               "sendrecv": "send and recv take separate buffers"}
_BLANK = " " * 33  # one layout's four columns, as nccl-tests leaves a layout it does not run


def _layout(t: Timing | None) -> str:
    if t is None:
        return _BLANK
    wrong = "N/A" if t.wrong is None else f"{t.wrong:g}"
    return f"  {nccl_float(t.time_us, 7)}  {nccl_float(t.algbw_gbps, 6)}  {nccl_float(t.busbw_gbps, 6)}  {wrong:>6}"


def nccl_count(r: Row, nranks: int) -> int:
    """The count column as nccl-tests prints it: the count it passes to NCCL, which for all_gather,
    reduce_scatter and all_to_all is each rank's share (``paramcount`` in their GetCollByteCount), while
    ``size`` is the whole buffer."""
    return r.count // nranks if OPS[r.op].scaled_by_nranks and nranks > 0 else r.count


def table_row(r: Row, nranks: int = 1) -> str:
    """One row in nccl-tests' layout (util.cu writeBenchmarkLinePreamble/Body); the slowest rank of the row's
    main layout (out-of-place where there is one) and its time at the end."""
    out_of_place, in_place = r.out_of_place, r.in_place
    if out_of_place is None and in_place is None:  # a row from an older JSON: its one layout
        main = Timing(r.time_us, r.max_time_us, r.slowest_rank, r.algbw_gbps, r.busbw_gbps, r.wrong)
        out_of_place, in_place = (main, None) if OPS[r.op].out_of_place else (None, main)
    main_t = out_of_place or in_place
    assert main_t is not None
    line = (f"{r.bytes:>12}  {nccl_count(r, nranks):>12}  {r.dtype:>8}  {r.redop:>6}  {r.root:>6}"
            f"{_layout(out_of_place)}{_layout(in_place)}  {nccl_float(main_t.max_time_us, 8)}  {main_t.slowest_rank:>7}")
    return line + (f"  {r.timestamp}" if r.timestamp else "")


def table_footer(rows: Sequence[Row], floor: MinBusbwCheck | None = None) -> str:
    """nccl-tests' footer (util.cu writeResultFooter); the average busbw counts only sizes >= 1 MiB.

    With a threshold (``floor``, from :func:`ddpdoctor.bench.analysis.min_busbw_check`, the same verdict
    that sets the exit code) the line shows the figure compared, over which sizes, the threshold, and ends
    in OK or FAILED as nccl-tests' does; a sweep with no size >= 1 MiB is then judged on every size, and
    the footer says so rather than "n/a"."""
    wrong = sum(wrong_total(r) for r in rows)
    checked = any(w is not None for r in rows for w in ([t.wrong for t in r.timings()] or [r.wrong]))
    lines = [f"# {'Out of bounds values':<20} : {wrong} {'OK' if wrong == 0 else 'FAILED'}"
             if checked else f"# {'Out of bounds values':<20} : not checked (-c 0)"]
    avg = avg_busbw(rows)
    if floor is not None:
        lines.append(f"# {'Avg bus bandwidth':<20} : {fmt_bw(floor.measured_gbps)} GB/s ({floor.over}) against "
                     f"{floor.threshold_label}: {'OK' if floor.passed else 'FAILED'}")
    elif avg is not None:
        lines.append(f"# {'Avg bus bandwidth':<20} : {fmt_bw(avg)} GB/s (sizes >= 1 MiB)")
    else:
        lines.append(f"# {'Avg bus bandwidth':<20} : n/a (no size >= 1 MiB in the sweep)")
    return "\n".join(lines)


_STATUS_WORD = {"pass": "as expected", "warn": "WARN", "fail": "FAIL", "note": "not judged", "none": ""}


def render_expectation(v: Verdict, thresholds: Thresholds, label: str = "peak busbw") -> str:
    """The '# expected' lines under an op's table: measured, expected, percentage, path and source, and the
    bottleneck with its evidence when the figure is below its expectation."""
    if v.path.expected_gbps is None:
        return f"# {'Expected busbw':<20} : no model applies: {v.path.why}"
    verdict = _STATUS_WORD[v.status]
    if v.status == "fail":
        verdict += f" (below {thresholds.fail_pct:g} %)"
    elif v.status == "warn":
        verdict += f" (below {thresholds.warn_pct:g} %)"
    elif v.status == "note":
        verdict += " (a virtual interface's nominal speed, and no fact shows what limits it)"
    lines = [f"# {'Expected busbw':<20} : {fmt_gbps(v.path.expected_gbps)} GB/s on {v.path.description} "
             f"[{v.path.source}]",
             f"# {label.capitalize():<20} : {fmt_gbps(v.measured_gbps)} GB/s = {fmt_pct(v.pct)} % of expected: {verdict}"]
    if v.status in ("warn", "fail", "note"):
        cause = v.cause()
        lines.append(f"# {'Bottleneck':<20} : {cause}" if cause else
                     f"# {'Bottleneck':<20} : none found in the facts (NIC/IB speed and state, qdiscs, PCIe "
                     "training, P2P, NUMA, other processes)")
    return "\n".join(lines)


def hosts_json(hosts: Mapping[int, str]) -> dict[str, list[int]]:
    """{"nodeA": [0, 1], "nodeB": [2, 3]} in order of first rank, as check's, stacks' and fr's JSON say it."""
    return host_groups(hosts)


def render_pairs(analysis: PairAnalysis, size: int, assessment: Assessment | None = None) -> str:
    """The pairwise sendrecv results, slowest first, each with its expected figure and percentage where a model
    applies, and what they point at."""
    lines = [f"# pairwise sendrecv, {human_bytes(size)} each way, slowest first",
             f"#{'rank a':>7} {'rank b':>7} {'host a':>16} {'host b':>16} {'busbw(GB/s)':>12} {'time(us)':>10}"
             + (f" {'expected':>9} {'%':>5}  path" if assessment is not None else "")]
    slow = {(p.a, p.b) for p in analysis.slow_links}
    for p in analysis.pairs:
        mark = "  <- slow" if (p.a, p.b) in slow or {p.host_a, p.host_b} & set(analysis.slow_hosts) else ""
        extra = ""
        v = assessment.pairs.get((p.a, p.b)) if assessment is not None else None
        if v is not None:
            if v.path.expected_gbps is None:
                extra = f" {'-':>9} {'-':>5}  no model: {v.path.description}"
            else:
                extra = (f" {fmt_bw(v.path.expected_gbps):>9} {fmt_pct(v.pct):>5}  {v.path.description}"
                         + (f"  <- {_STATUS_WORD[v.status]}" if v.status in ("warn", "fail") else
                            "  (nominal: not judged)" if v.status == "note" else ""))
        lines.append(f"{p.a:>8} {p.b:>7} {p.host_a:>16} {p.host_b:>16} {fmt_bw(p.busbw_gbps):>12} "
                     f"{p.time_us:>10.1f}{extra}{mark}")
    if assessment is not None:
        for (a, b), v in sorted(assessment.pairs.items()):
            if v.status in ("warn", "fail") and v.cause():
                lines.append(f"# BELOW EXPECTED rank {a} <-> rank {b}: {fmt_pct(v.pct)} % of "
                             f"{fmt_bw(v.path.expected_gbps or 0)} GB/s; bottleneck: {v.cause()}")
    if analysis.slow_hosts:
        for host in analysis.slow_hosts:
            lines.append(f"# SLOW HOST {host}: its best link reaches {fmt_bw(analysis.host_best_gbps[host])} "
                         f"GB/s, other hosts {fmt_bw(analysis.typical_host_gbps())} GB/s: check its NIC, cable, switch port and "
                         "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME")
    for p in analysis.slow_links:
        where = "within host " + p.host_a if p.host_a == p.host_b else f"between {p.host_a} and {p.host_b}"
        lines.append(f"# SLOW LINK rank {p.a} <-> rank {p.b} ({where}): {fmt_bw(p.busbw_gbps)} GB/s")
    if not analysis.slow_hosts and not analysis.slow_links:
        lines.append("# no slow host or link found")
    return "\n".join(lines)


def run_status(failures: Sequence[str], analysis: PairAnalysis | None, assessment: Assessment | None) -> str:
    """The run's overall status, as the design's JSON contract spells it for ``check``: ``fail`` when
    anything makes the exit code 1 (``failures``, from :func:`ddpdoctor.bench.analysis.problems`), ``warn``
    for what is printed but exits 0 (a figure below ``--warn-busbw-pct`` of its expectation, a slow link),
    else ``pass``."""
    if failures:
        return "fail"
    verdicts = list(assessment.per_op.values()) + list(assessment.pairs.values()) if assessment is not None else []
    if any(v.status == "warn" for v in verdicts) or (analysis is not None and analysis.slow_links):
        return "warn"
    return "pass"


def result_json(config: BenchConfig, world_size: int, backend: str, rows: Sequence[Row],
                analysis: PairAnalysis | None, assessment: Assessment | None = None,
                failures: Sequence[str] = ()) -> dict[str, Any]:
    """The --json document (docs/bench.md: "ddpdoctor bench --json").

    ``failures`` are the lines printed as ``ddpdoctor bench: FAIL: ...`` (exit 1): the document carries
    them and the status, so a script reading only the JSON sees the verdict the exit code gave."""
    per_op: dict[str, dict[str, Any]] = {}
    for op in config.ops:
        op_rows = [r for r in rows if r.op == op]
        floor = min_busbw_check(config, op_rows)
        per_op[op] = {"avg_busbw_gbps": avg_busbw(op_rows), "min_busbw": floor.to_json() if floor else None}
    data: dict[str, Any] = {
        "status": run_status(failures, analysis, assessment), "failures": list(failures),
        "op": config.op_label, "world_size": world_size, "backend": backend, "dtype": config.dtype,
        "dtypes": list(config.dtypes), "redops": list(config.redops), "iters": config.iters,
        "warmup": config.warmup, "check_iters": config.check_iters, "average": config.average,
        "blocking": config.blocking, "cputime": config.cputime,
        "min_busbw": None if config.min_busbw_gbps is None else
        {"threshold_gbps": config.min_busbw_gbps, "source": config.min_busbw_label},
        "rows": [r.to_json() for r in rows], "avg_busbw_gbps": avg_busbw(rows),
        "per_op": per_op,
    }
    if analysis is not None:
        data["pair_bytes"] = config.pair_bytes
        data["pairs"] = [p.to_json() for p in analysis.pairs]
        data["slow_hosts"] = list(analysis.slow_hosts)
        data["slow_links"] = [p.to_json() for p in analysis.slow_links]
    if assessment is not None:
        data["hosts"] = hosts_json(assessment.hosts)
        data["expectation"] = assessment.to_json()
        for op, verdict in assessment.per_op.items():
            if op in data["per_op"]:
                data["per_op"][op]["expected"] = verdict.to_json()
        if analysis is not None:
            for pair in data["pairs"]:
                v = assessment.pairs.get((pair["a"], pair["b"]))
                if v is not None:
                    pair.update(expected_busbw_gbps=v.path.expected_gbps,
                                pct=None if v.pct is None else round(v.pct, 1), status=v.status,
                                path=v.path.to_json(), bottlenecks=[e.to_json() for e in v.causes()])
    return data


# nccl-tests' JSON file version (util.cu JSON_FILE_VERSION) whose layout nccl_tests_json follows.
NCCL_TESTS_JSON_VERSION = 1


def nccl_tests_json(config: BenchConfig, rows: Sequence[Row], devices: Sequence[tuple[int, int, str, str]],
                    start_time: str, end_time: str, environ: Mapping[str, str], nccl_version: int | None) -> dict[str, Any]:
    """The document nccl-tests writes with ``-J FILE.json`` (util.cu jsonOutputInit, writeDeviceReport,
    writeBenchmarkLine*, writeResultFooter), so tools that read nccl-tests' JSON read ours.

    Two differences, on purpose: ``env`` lists only the NCCL_*, TORCH_*, GLOO_*, CUDA_* and MASTER_*
    variables (nccl-tests dumps the whole environment, secrets included), and ``root`` is the rank as
    nccl-tests formats it ("%6i", a string). Times are in microseconds, bandwidths in GB/s, as there.
    """
    results = []
    for r in rows:
        entry: dict[str, Any] = {"size": r.bytes, "count": nccl_count(r, len(devices)), "type": r.dtype,
                                 "redop": r.redop,
                                 "root": f"{r.root:6d}"}
        for key, timing in (("out_of_place", r.out_of_place), ("in_place", r.in_place)):
            entry[key] = None if timing is None else {
                "cpu_time" if config.cputime else "time": timing.time_us, "alg_bw": timing.algbw_gbps,
                "bus_bw": timing.busbw_gbps, "nwrong": None if timing.wrong is None else float(timing.wrong)}
        entry["actual_iterations"] = config.iters
        entry["experiment_name"] = r.op
        results.append(entry)
    wrong = sum(wrong_total(r) for r in rows)
    bws = [t.busbw_gbps for r in rows for t in r.timings()]
    avg = sum(bws) / len(bws) if bws else 0.0
    okay: Any = "unchecked" if config.min_busbw_gbps is None else avg >= config.min_busbw_gbps
    step = {"step_bytes": config.step_bytes} if config.step_bytes is not None else {"step_factor": config.step_factor}
    return {
        "version": NCCL_TESTS_JSON_VERSION, "start_time": start_time, "args": ["ddpdoctor", *config.argv],
        "env": [f"{k}={v}" for k, v in sorted(environ.items())
                if k.startswith(("NCCL_", "TORCH_", "GLOO_", "CUDA_", "MASTER_"))],
        "nccl_version": nccl_version,
        "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": config.sizes[0], "maximum_bytes": config.sizes[-1],
                   **step, "warmup_iters": config.warmup, "iterations": config.iters, "aggregated_iterations": 1,
                   "validation": config.check_iters, "graph": 0, "blocking_collectives": str(bool(config.blocking)).lower(),
                   "per_iter_timing": "false", "per_iter_skip": 0, "parallel_init": "false"},
        "devices": [{"rank": rank, "group": 0, "pid": pid, "hostname": host, "device": -1 if device == "cpu"
                     else int(device.rsplit(":", 1)[-1] or 0), "device_hex": "", "device_info": device}
                    for rank, pid, host, device in devices],
        "results": results,
        # nccl-tests averages every row and layout (no 1 MiB floor), as here.
        "out_of_bounds": {"count": wrong, "okay": "true" if wrong == 0 else "false"},
        "average_bus_bandwidth": {"bandwidth": avg, "okay": okay if okay == "unchecked" else str(okay).lower()},
        "errors": [],
        "end_time": end_time,
    }


def check_plot_available() -> None:
    """DoctorError (exit 2) before any rank starts when --plot cannot work."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise DoctorError("--plot needs matplotlib, which is not installed: "
                          "pip install 'ddpdoctor[plot]' (or pip install matplotlib)") from None


def write_plot(path: str, rows: Sequence[Row], title: str) -> None:
    """busbw against size, log-2 size axis, one line per op; PNG, SVG or PDF as the name ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for op in dict.fromkeys(r.op for r in rows):
        op_rows = [r for r in rows if r.op == op]
        ax.plot([r.bytes for r in op_rows], [r.busbw_gbps for r in op_rows], marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    from ddpdoctor import outputs

    # The extension names the format; the metadata make the file recognisably ours, so that a later run
    # may replace it and nothing else (ddpdoctor.outputs).
    fmt = os.path.splitext(path)[1].lower().lstrip(".")
    mark = {"Software": outputs.PLOT_MARK} if fmt == "png" else {"Creator": outputs.PLOT_MARK}
    try:
        with outputs.atomic_output(outputs.resolve("--plot", path, outputs.PLOT)) as handle:
            fig.savefig(handle, format=fmt, metadata=mark)
    finally:
        plt.close(fig)


def progress_line(done: int, total: int, label: str, width: int = 30) -> str:
    filled = math.floor(width * done / total) if total else width
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label}"[:120]
