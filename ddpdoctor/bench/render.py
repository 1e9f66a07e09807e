"""How ``ddpdoctor bench`` shows its numbers: nccl-tests' table, the pair list, the JSON, the plot.

Pure functions of the model in :mod:`ddpdoctor.bench.analysis` (no torch at import; matplotlib only when
plotting).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from ddpdoctor.bench.analysis import OPS, BenchConfig, PairAnalysis, Row, avg_busbw, fmt_bw, human_bytes
from ddpdoctor.errors import DoctorError


def table_header(op: str, world_size: int, backend: str, hosts: int, iters: int, warmup: int) -> str:
    """nccl-tests' header: size, count, type, redop, root, time, algbw, busbw, #wrong (+ max, slowest)."""
    return "\n".join([
        f"# ddpdoctor bench: {op}, {world_size} rank{'s' if world_size != 1 else ''} on {hosts} "
        f"host{'s' if hosts != 1 else ''}, backend {backend}, iters {iters}, warmup {warmup}",
        f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>8} "
        f"{'busbw':>8} {'#wrong':>7} {'max':>10} {'slowest':>8}",
        f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>8} "
        f"{'(GB/s)':>8} {'':>7} {'(us)':>10} {'rank':>8}",
    ])


def table_row(r: Row) -> str:
    spec = OPS[r.op]
    wrong = "N/A" if r.wrong is None else str(r.wrong)
    return (f"{r.bytes:>12} {r.count:>12} {r.dtype:>8} {spec.redop:>6} {spec.root:>5} {r.time_us:>10.1f} "
            f"{fmt_bw(r.algbw_gbps):>8} {fmt_bw(r.busbw_gbps):>8} {wrong:>7} {r.max_time_us:>10.1f} "
            f"{r.slowest_rank:>8}")


def table_footer(rows: Sequence[Row]) -> str:
    """nccl-tests' footer; the average busbw counts only sizes >= 1 MiB."""
    wrong_total = sum(r.wrong or 0 for r in rows)
    checked = any(r.wrong is not None for r in rows)
    lines = [f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}"
             if checked else "# Out of bounds values : not checked (-c 0)"]
    avg = avg_busbw(rows)
    lines.append(f"# Avg bus bandwidth    : {fmt_bw(avg)} GB/s (sizes >= 1 MiB)" if avg is not None
                 else "# Avg bus bandwidth    : n/a (no size >= 1 MiB in the sweep)")
    return "\n".join(lines)


def render_pairs(analysis: PairAnalysis, size: int) -> str:
    """The pairwise sendrecv results, slowest first, and what they point at."""
    lines = [f"# pairwise sendrecv, {human_bytes(size)} each way, slowest first",
             f"#{'rank a':>7} {'rank b':>7} {'host a':>16} {'host b':>16} {'busbw(GB/s)':>12} {'time(us)':>10}"]
    slow = {(p.a, p.b) for p in analysis.slow_links}
    for p in analysis.pairs:
        mark = "  <- slow" if (p.a, p.b) in slow or {p.host_a, p.host_b} & set(analysis.slow_hosts) else ""
        lines.append(f"{p.a:>8} {p.b:>7} {p.host_a:>16} {p.host_b:>16} {fmt_bw(p.busbw_gbps):>12} "
                     f"{p.time_us:>10.1f}{mark}")
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


def result_json(config: BenchConfig, world_size: int, backend: str, rows: Sequence[Row],
                analysis: PairAnalysis | None) -> dict[str, Any]:
    """The --json document (README: "ddpdoctor bench --json")."""
    data: dict[str, Any] = {
        "op": config.op_label, "world_size": world_size, "backend": backend, "dtype": config.dtype,
        "iters": config.iters, "warmup": config.warmup,
        "rows": [r.to_json() for r in rows], "avg_busbw_gbps": avg_busbw(rows),
        "per_op": {op: {"avg_busbw_gbps": avg_busbw([r for r in rows if r.op == op])}
                   for op in config.ops},
    }
    if analysis is not None:
        data["pair_bytes"] = config.pair_bytes
        data["pairs"] = [p.to_json() for p in analysis.pairs]
        data["slow_hosts"] = list(analysis.slow_hosts)
        data["slow_links"] = [p.to_json() for p in analysis.slow_links]
    return data


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
