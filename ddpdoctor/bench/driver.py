"""What every rank does in `ddpdoctor bench`: join, run the sweep and the pair test, rank 0 reports.

It reuses the runtime of ``ddpdoctor check`` (:class:`ddpdoctor.check.RankRun`) to reach the
control plane, meet the other ranks (their hosts group the pair test) and initialise the process group
under test with a deadline; then every rank runs the same sequence of collectives. Each collective is
bounded by the process group's timeout (``--timeout``), so a dead peer ends the run instead of hanging.
Only rank 0 prints; like ``check``, its exit code carries the result and the other ranks exit 0.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ddpdoctor.bench.analysis import BenchConfig, PairAnalysis, Row, analyse_pairs, human_bytes, problems
from ddpdoctor.bench.measure import measure_pairs, measure_row
from ddpdoctor.bench.render import (
    progress_line,
    render_pairs,
    result_json,
    table_footer,
    table_header,
    table_row,
    write_plot,
)
from ddpdoctor.check import CheckOptions
from ddpdoctor.errors import EXIT_OK, EXIT_PROBLEM, short_error
from ddpdoctor.runtime.launcher import LaunchInfo


class _Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal (never in logs or pipes)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled and sys.stderr.isatty()

    def show(self, label: str) -> None:
        if self.enabled:
            sys.stderr.write(progress_line(self.done, self.total, label))
            sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 120 + "\r")
            sys.stderr.flush()


def _out_of_memory(exc: BaseException) -> bool:
    """An allocation that failed: Python's MemoryError, torch.OutOfMemoryError (CUDA), or the CPU
    allocator's RuntimeError "DefaultCPUAllocator: can't allocate memory" (c10/core/impl/alloc_cpu.cpp)."""
    text = str(exc)
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in text or "out of memory" in text.lower())


def run_bench(info: LaunchInfo, config: BenchConfig) -> int:
    """The whole bench on one rank; returns the exit code (the caller leaves with os._exit)."""
    from ddpdoctor.check import RankRun, RunConfig
    from ddpdoctor.outputs import emit_json, json_to_stdout
    from ddpdoctor.runtime.selflaunch import write_result_file

    run = RankRun(info, RunConfig(checks=[], backend=config.backend, process_group=True,
                                  options=CheckOptions(timeout_s=config.timeout_s)))
    if not run.join():
        return EXIT_PROBLEM
    pg_problem = run.pg_problem
    lead = info.rank == 0
    # `--json -`: the JSON document is rank 0's whole stdout, so the table is not printed.
    json_only = json_to_stdout(config.json_path)
    out: Callable[[str], None] = (lambda s: print(s, flush=True)) if lead and not json_only else (lambda s: None)
    if pg_problem is not None:
        if lead:
            detail = "; ".join(f"{f.summary} ({f.remedy})" for f in run.runtime_findings)
            print(f"ddpdoctor bench: cannot run: {pg_problem}" + (f": {detail}" if detail else ""),
                  file=sys.stderr, flush=True)
            write_result_file(EXIT_PROBLEM)
        return EXIT_PROBLEM if lead else EXIT_OK
    import torch

    device = torch.device(run.device)
    hosts = {r: p.host for r, p in run.peers.items()}
    nranks = info.world_size
    n_hosts = len(set(hosts.values()))
    progress = _Progress(len(config.ops) * len(config.sizes) + (1 if config.pairs else 0), lead)
    rows: list[Row] = []
    analysis: PairAnalysis | None = None
    step = ""
    try:
        for op in config.ops:
            op_rows: list[Row] = []
            out(table_header(op, nranks, run.backend, n_hosts, config.iters, config.warmup))
            for size in config.sizes:
                step = f"{op} at {human_bytes(size)}"
                progress.show(step)
                row = measure_row(op, size, config.dtype, config.iters, config.warmup, config.check, device)
                progress.done += 1
                progress.clear()
                op_rows.append(row)
                out(table_row(row))
            out(table_footer(op_rows) + "\n")
            rows.extend(op_rows)
        if config.pairs:
            step = "the pairwise sendrecv test"
            progress.show(step)
            analysis = analyse_pairs(measure_pairs(hosts, config.pair_bytes, config.dtype, config.iters,
                                                   config.warmup, device))
            progress.clear()
            out(render_pairs(analysis, config.pair_bytes))
    except Exception as exc:  # a collective failed or timed out: that is the result, named by its step
        progress.clear()
        first = short_error(exc)
        if _out_of_memory(exc):
            print(f"ddpdoctor bench: rank {info.rank} on {run.me.host}: {step}: out of memory ({first}); give a "
                  "smaller -e/--max-bytes (or -c 0, which needs no buffers for the check)", file=sys.stderr, flush=True)
        else:
            print(f"ddpdoctor bench: rank {info.rank} on {run.me.host}: {step} failed: {first}. A peer died or a "
                  "link is blocked; check the other ranks' output, firewalls and NCCL_SOCKET_IFNAME/"
                  "GLOO_SOCKET_IFNAME", file=sys.stderr, flush=True)
        if lead:
            write_result_file(EXIT_PROBLEM)
        return EXIT_PROBLEM if lead else EXIT_OK
    if not lead:
        return EXIT_OK
    if config.json_path:
        emit_json(config.json_path, result_json(config, nranks, run.backend, rows, analysis), "bench")
    if config.plot_path:
        write_plot(config.plot_path, rows, f"ddpdoctor bench: {nranks} ranks, {run.backend}, {config.dtype}")
    found = problems(config, rows, analysis)
    for line in found:
        print(f"ddpdoctor bench: FAIL: {line}", file=sys.stderr if json_only else sys.stdout, flush=True)
    code = EXIT_PROBLEM if found else EXIT_OK
    write_result_file(code)
    return code
