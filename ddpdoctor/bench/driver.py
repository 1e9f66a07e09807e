"""What every rank does in `ddpdoctor bench`: join, run the sweep and the pair test, rank 0 reports.

It reuses the runtime of ``ddpdoctor check`` (:class:`ddpdoctor.check.RankRun`) to reach the
control plane, meet the other ranks (their hosts group the pair test) and initialise the process group
under test with a deadline; then every rank runs the same sequence of collectives. Each collective is
bounded by the process group's timeout (``--timeout``), so a dead peer ends the run instead of hanging.
Only rank 0 prints; like ``check``, its exit code carries the result and the other ranks exit 0.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ddpdoctor.bench.analysis import BenchConfig, Row, human_bytes, min_busbw_check, problems
from ddpdoctor.bench.expect import Assessment, Thresholds, assess, crowding
from ddpdoctor.bench.measure import measure_pairs, measure_row, probe_combinations
from ddpdoctor.bench.pairs import PairAnalysis, analyse_pairs
from ddpdoctor.bench.render import (
    nccl_tests_json,
    preamble,
    progress_line,
    render_expectation,
    render_pairs,
    result_json,
    table_footer,
    table_header,
    table_row,
    write_plot,
)
from ddpdoctor.check import CheckOptions
from ddpdoctor.errors import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, short_error
from ddpdoctor.runtime.launcher import LaunchInfo

if TYPE_CHECKING:
    from ddpdoctor.check import RankRun


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


def _now() -> str:
    """Local time as nccl-tests stamps its rows and JSON (util.cu TIME_STRING_FORMAT)."""
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S")


def _plan(config: BenchConfig, device: object) -> tuple[list[tuple[str, str, str]], dict[tuple[str, str, str], str]]:
    """Every (op, dtype, redop) asked for, in nccl-tests' order (type, then reduction), less those this
    backend refuses (found by running each once on the smallest buffer), and the refused ones with why."""
    wanted = [(op, dtype, redop) for op in config.ops for dtype in config.dtypes for redop in config.redops_for(op)]
    refused = probe_combinations(wanted, device, config.root)
    return [c for c in wanted if c not in refused], refused


def _devices(run: RankRun, device: object) -> list[tuple[int, int, str, str]]:
    """(rank, pid, host, device) of every rank, for nccl-tests' "Using devices" lines: ranks that self-bind
    by local rank, as ddpdoctor's runtime does (cuda:<local rank>) or the CPU."""
    kind = getattr(device, "type", str(device))
    return [(r, p.pid, p.host, "cpu" if kind == "cpu" else f"{kind}:{p.local_rank}") for r, p in sorted(run.peers.items())]


def _link_facts(run: RankRun, device: object,
                nccl_log: str | None = None) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """Every rank's link facts (bench.expect's input) and the hosts whose cores or GPUs are crowded.

    Every rank takes part in the gathers whatever happened locally: a rank whose facts could not be read
    sends the error, and the model says "no model" for its paths instead of guessing. On NCCL a first
    gather makes NCCL set up its communicator, so its NCCL_DEBUG=INFO lines (the network it chose) are
    in ``nccl_log`` before the facts are read.
    """
    from ddpdoctor.bench.measure import gather
    from ddpdoctor.env import gpu_of, parse_nccl_info, placement, rank_link_facts

    ours = {p.pid for p in run.peers.values() if p.host == run.me.host} | {os.getppid()}
    mine: dict[str, Any] = {}
    if nccl_log is not None and run.backend == "nccl":
        gather(None)
    try:
        place = placement(run.me.host, str(device), ours)
        mine = {"placement": place, "facts": rank_link_facts(run.backend, os.environ, place["cpus"],
                                                             gpu_of(str(device)), our_pids=ours)}
        if nccl_log is not None and run.backend == "nccl" and os.path.exists(nccl_log):
            with open(nccl_log, encoding="utf-8", errors="replace") as f:
                mine["facts"]["nccl"] = parse_nccl_info(f.read(1 << 20))
    except Exception as exc:  # a fact we could not read must not cost the measurement
        mine = {"error": short_error(exc)}
    everyone = gather(mine)
    facts = {r: m["facts"] for r, m in enumerate(everyone) if m.get("facts")}
    places = {r: m["placement"] for r, m in enumerate(everyone) if m.get("placement")}
    return facts, crowding(places)


def _nccl_version(backend: str) -> int | None:
    """NCCL's version code as nccl-tests records it (major*10000 + minor*100 + patch), None without NCCL."""
    if backend != "nccl":
        return None
    try:
        import torch

        major, minor, patch = (int(x) for x in torch.cuda.nccl.version()[:3])
    except Exception:  # a build without NCCL, or an odd version tuple: the field is informative only
        return None
    return major * 10000 + minor * 100 + patch


def _out_of_memory(exc: BaseException) -> bool:
    """An allocation that failed: Python's MemoryError, torch.OutOfMemoryError (CUDA), or the CPU
    allocator's RuntimeError "DefaultCPUAllocator: can't allocate memory" (c10/core/impl/alloc_cpu.cpp)."""
    text = str(exc)
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in text or "out of memory" in text.lower())


def run_bench(info: LaunchInfo, config: BenchConfig) -> int:
    """The whole bench on one rank; returns the exit code (the caller leaves with os._exit)."""
    from ddpdoctor.check import RankRun, RunConfig

    nccl_log = _capture_nccl_info(config.backend, info.rank)
    run = RankRun(info, RunConfig(checks=[], backend=config.backend, process_group=True,
                                  options=CheckOptions(timeout_s=config.timeout_s)))
    try:
        return _bench(run, info, config, nccl_log)
    finally:
        run.close()  # destroyed when healthy, aborted (NCCL) after a failed collective; bounded (issue 35)
        if nccl_log is not None:
            import shutil

            shutil.rmtree(os.path.dirname(nccl_log), ignore_errors=True)


def _capture_nccl_info(backend: str, rank: int) -> str | None:
    """Where NCCL will write its NCCL_DEBUG=INFO lines (the transports it chose), or None when not captured.

    Only when the user set no NCCL_DEBUG (NCCL then prints nothing at all: debug.cc's default level is NONE),
    so nothing the user asked to see is diverted. NCCL reads NCCL_DEBUG and NCCL_DEBUG_FILE when it first
    initialises, after this. The file is in a private (0700) folder of ours, removed at the end.
    """
    if backend == "gloo" or "NCCL_DEBUG" in os.environ or "NCCL_DEBUG_FILE" in os.environ:
        return None
    import torch

    if backend == "auto" and not torch.cuda.is_available():  # auto picks gloo: no NCCL to listen to
        return None
    import tempfile

    folder = tempfile.mkdtemp(prefix="ddpdoctor-nccl-")
    path = os.path.join(folder, f"rank{rank}.log")
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_FILE"] = path
    return path


def _bench(run: RankRun, info: LaunchInfo, config: BenchConfig, nccl_log: str | None = None) -> int:
    from ddpdoctor.outputs import emit_json, json_to_stdout
    from ddpdoctor.runtime.selflaunch import write_result_file

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
    start_time = _now()
    rows: list[Row] = []
    analysis: PairAnalysis | None = None
    step = "checking which types and reductions this backend runs"
    devices = _devices(run, device)
    progress = _Progress(0, lead)
    thresholds = Thresholds(config.fail_pct, config.warn_pct)
    assessment: Assessment | None = None
    try:
        step = "reading the links' facts"
        facts, crowded = _link_facts(run, device, nccl_log)
        step = "checking which types and reductions this backend runs"
        plan, skipped = _plan(config, device)
        if lead:
            for (op, dtype, redop), why in skipped.items():
                print(f"ddpdoctor bench: note: {run.backend} cannot run {op} with -d {dtype}"
                      + (f" -o {redop}" if redop != "none" else "") + f" ({why}); left out", file=sys.stderr, flush=True)
        if not plan:
            if lead:
                print(f"ddpdoctor bench: error: {run.backend} runs none of the asked op/type/reduction combinations "
                      "(see the notes above)", file=sys.stderr, flush=True)
                write_result_file(EXIT_USAGE)
            return EXIT_USAGE if lead else EXIT_OK
        out(preamble(config, devices))
        progress.total = len(plan) * len(config.sizes) * config.run_cycles + (1 if config.pairs else 0)
        for _cycle in range(config.run_cycles):
            for op in config.ops:
                combos = [(dtype, redop) for o, dtype, redop in plan if o == op]
                if not combos:
                    continue
                op_rows: list[Row] = []
                out("#\n" + table_header(op, nranks, run.backend, n_hosts, config.iters, config.warmup,
                                         config.cputime, config.timestamps, config.average))
                for dtype, redop in combos:
                    for size in config.sizes:
                        step = f"{op} at {human_bytes(size)}" + (f" ({dtype}, {redop})" if len(combos) > 1 else "")
                        progress.show(step)
                        row = measure_row(op, size, dtype, config.iters, config.warmup, config.check_iters, device,
                                          redop=redop, root=config.root, average=config.average,
                                          blocking=config.blocking, cputime=config.cputime,
                                          timestamp=_now if config.timestamps else None)
                        progress.done += 1
                        progress.clear()
                        op_rows.append(row)
                        out(table_row(row, nranks))
                out(table_footer(op_rows, min_busbw_check(config, op_rows)))
                if lead:
                    verdict = assess({op: op_rows}, [], facts, hosts, thresholds, crowded).per_op.get(op)
                    if verdict is not None:
                        out(render_expectation(verdict, thresholds))
                out("")
                rows.extend(op_rows)
        if config.pairs:
            step = "the pairwise sendrecv test"
            progress.show(step)
            analysis = analyse_pairs(measure_pairs(hosts, config.pair_bytes, config.dtype, config.iters,
                                                   config.warmup, device))
            progress.clear()
        if lead:
            assessment = assess({op: [r for r in rows if r.op == op] for op in config.ops},
                                analysis.pairs if analysis is not None else [], facts, hosts, thresholds, crowded)
        if analysis is not None:
            out(render_pairs(analysis, config.pair_bytes, assessment))
    except Exception as exc:  # a collective failed or timed out: that is the result, named by its step
        run.pg_problem = f"{step} failed"  # the group is not shut down as a healthy one (close())
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
    found = problems(config, rows, analysis, assessment.failures() if assessment is not None else ())
    if config.json_path:
        emit_json(config.json_path, result_json(config, nranks, run.backend, rows, analysis, assessment, found),
                  "bench")
    if config.nccl_json_path:
        from ddpdoctor.outputs import NCCL_TESTS_JSON, resolve, write_bytes

        # The NCCL_DEBUG/NCCL_DEBUG_FILE bench set to read NCCL's choices are ours, not the user's environment.
        environ = {k: v for k, v in os.environ.items()
                   if not (nccl_log is not None and k in ("NCCL_DEBUG", "NCCL_DEBUG_FILE"))}
        document = nccl_tests_json(config, rows, devices, start_time, _now(), environ, _nccl_version(run.backend))
        write_bytes(resolve("-J/--output_file", config.nccl_json_path, NCCL_TESTS_JSON),
                    (json.dumps(document, indent=2) + "\n").encode("utf-8"))
    if config.plot_path:
        write_plot(config.plot_path, rows, f"ddpdoctor bench: {nranks} ranks, {run.backend}, {config.dtype}")
    for line in found:
        print(f"ddpdoctor bench: FAIL: {line}", file=sys.stderr if json_only else sys.stdout, flush=True)
    code = EXIT_PROBLEM if found else EXIT_OK
    write_result_file(code)
    return code
