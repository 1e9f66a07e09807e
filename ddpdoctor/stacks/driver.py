"""``ddpdoctor stacks`` and ``ddpdoctor stacks merge`` as functions of their options (typer parses them in
:mod:`ddpdoctor.commands.stacks`): find the ranks, read their stacks, print the report, return the exit code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ddpdoctor.errors import EXIT_OK, EXIT_PROBLEM, DoctorError
from ddpdoctor.outputs import Plan, emit_json, json_to_stdout
from ddpdoctor.ras import RasVerdict
from ddpdoctor.runtime.hosts import ranks_by_host
from ddpdoctor.stacks.model import JobReport, ProcessStacks, analyze
from ddpdoctor.stacks.remote import FETCH_S
from ddpdoctor.stacks.report import load_json_files, render_text, to_json

PathArg = str | os.PathLike[str]
# The JSON documents' "command" (the output policy's kind, ddpdoctor.outputs): one host's capture, or a merge.
CAPTURE_KIND = "stacks"
MERGE_KIND = "stacks merge"

@dataclass
class StacksOptions:
    """The options of ``ddpdoctor stacks`` (defaults as in its ``--help``)."""

    pid: list[int] = field(default_factory=list)
    job: str | None = None
    native: bool = False
    all_threads: bool = False
    json_path: str | None = None  # a file, or "-" for stdout
    signal_mode: bool = False
    stack_dir: str | None = None
    timeout: float = 30.0
    ras: bool = True  # also ask NCCL's RAS service (NCCL_RAS_ADDR set, or the default port answering)
    locals_level: int = 0  # py-spy --locals, repeated (py-spy's -ll shows more)
    nonblocking: bool = False  # py-spy --nonblocking: read without pausing the ranks


def run(opts: StacksOptions) -> int:
    """Find the ranks, read their stacks, print the grouped report; the exit code (0 agree, 1 not)."""
    plan = Plan("stacks")
    plan.reads("--stack-dir", opts.stack_dir)
    plan.json("--json", opts.json_path)
    if opts.signal_mode:
        for flag, given in (("--native", opts.native), ("--locals", opts.locals_level > 0),
                            ("--nonblocking", opts.nonblocking)):
            if given:
                raise DoctorError(f"{flag} needs py-spy; --signal dumps only Python frames (drop one of them)")
        from ddpdoctor.stacks.signal_dumps import collect

        return finish(collect(opts.pid, opts.job, opts.stack_dir, opts.timeout), "signal", opts.json_path,
                      opts.all_threads)
    if opts.native and opts.nonblocking:
        # py-spy 0.3/0.4 (src/config.rs): "Can't get native stack traces with the --nonblocking option"; every
        # rank then read as "no stack: py-spy failed" and the run exited 1, as if the ranks disagreed.
        raise DoctorError("--native cannot be combined with --nonblocking: py-spy reads C/C++ frames only from a "
                          "paused process (drop one of them)")
    from ddpdoctor.stacks.engine import discover, dump_all

    cands = discover(opts.pid, opts.job)
    if not cands:
        where = f" of job {opts.job}" if opts.job else ""
        raise DoctorError(f"no DDP rank processes{where} found on this machine (looked for RANK/LOCAL_RANK "
                          "with TORCHELASTIC_RUN_ID or SLURM step ids, and children of torchrun); pass "
                          "--pid PID, or run as the job's user or root to read other users' processes")
    processes = dump_all(cands, native=opts.native, timeout=opts.timeout, locals_level=opts.locals_level,
                         nonblocking=opts.nonblocking)
    others = reach_other_hosts(processes, min(opts.timeout, FETCH_S))
    return finish(processes, "py-spy", opts.json_path, opts.all_threads, ras=_ask_ras() if opts.ras else None,
                  others=others)


def reach_other_hosts(processes: list[ProcessStacks], timeout: float) -> dict[str | None, dict[str, Any]]:
    """For each job seen here whose other ranks run on other hosts: ask the job's store for their PyTorch
    debug servers and read their stacks (and every rank's Flight Recorder entries) over HTTP; the ranks
    read are appended to ``processes``. Per job: what was done, for the report
    (:func:`ddpdoctor.stacks.report.other_hosts_lines`)."""
    from ddpdoctor.stacks import remote
    from ddpdoctor.stacks.rendezvous import read_store

    found: dict[str | None, dict[str, Any]] = {}
    for report in analyze(processes):
        if not report.elsewhere:
            continue
        here = sorted({p.host for g in report.groups for p in g.members} | {p.host for p in report.failed})
        info: dict[str, Any] = {"ranks": report.elsewhere, "here": here, "store": None, "fetched": [],
                                "hosts": {}, "flight_recorder": None, "flight_recorder_summary": None,
                                "why_not": None}
        found[report.job] = info
        members = [p for g in report.groups for p in g.members] + report.failed
        address = next((p.store for p in members if p.store), None)
        if address is None:
            info["why_not"] = "the ranks here do not say where the job's store is (no MASTER_ADDR/MASTER_PORT)"
            continue
        host, _, port = address.rpartition(":")
        view = read_store(host, int(port)) if port.isdigit() else None
        info["store"] = address
        if view is None or not view.reachable:
            info["why_not"] = f"the job's store at {address} could not be read ({view.error if view else 'bad port'})"
            continue
        # Where they run, from their gloo address records (gloo jobs), before anything is fetched.
        info["hosts"] = ranks_by_host((r, h) for r, h in view.hosts.items() if r in report.elsewhere)
        wanted = {rank: url for rank, url in view.debug.items() if rank in report.elsewhere}
        if not wanted:
            info["why_not"] = ("the job runs no PyTorch debug servers (torch.distributed.debug.start_debug_server "
                               "registers none in its store)")
            continue
        answers = remote.fetch_all(wanted, "dump_traceback", timeout)
        for rank, url in wanted.items():
            proc = remote.remote_process(rank, url, answers[rank], report.world_size, report.job)
            processes.append(proc)
            if proc.error is None:
                info["fetched"].append(rank)
        info["hosts"] = ranks_by_host([*((r, h) for r, h in view.hosts.items() if r in report.elsewhere),
                                       *((rank, remote.host_of(url)) for rank, url in wanted.items())])
        info["flight_recorder"], info["flight_recorder_summary"] = remote.flight_recorder(
            view.debug, report.world_size, timeout)
    return found


RAS_DEADLINE_S = 1.0  # stacks is run on a hung job: RAS may be slow or hung too, and must not cost the report


def _ask_ras() -> RasVerdict | None:
    """NCCL's own view of the job (which processes it lost), once, within :data:`RAS_DEADLINE_S`; None
    when no RAS service answers (not an NCCL >= 2.24 job on this host)."""
    from ddpdoctor.ras import probe

    return probe(deadline_s=RAS_DEADLINE_S)


def merge(files: Sequence[PathArg], all_threads: bool = False, json_path: str | None = None) -> int:
    """Group the stacks of several nodes' ``--json`` files as one job."""
    # A merge is its own kind of document ("stacks merge"): it replaces an earlier merge, never a host's
    # capture (`stacks merge --json nodeA.json nodeB.json` would otherwise overwrite nodeA's stacks).
    plan = Plan(MERGE_KIND)
    for path in files:
        plan.reads("FILES", path)
    plan.json("--json", json_path)
    processes, source = load_json_files(files)
    return finish(processes, source, json_path, all_threads, kind=MERGE_KIND)


def finish(processes: list[ProcessStacks], source: str, json_path: str | None, all_threads: bool,
           ras: RasVerdict | None = None, kind: str = CAPTURE_KIND,
           others: dict[str | None, dict[str, Any]] | None = None) -> int:
    """Group, then print the report and write ``--json PATH`` (``-``: the JSON on stdout instead of the
    report); exit 1 when the ranks disagree or could not all be seen, or RAS names dead/unresponsive ranks."""
    from ddpdoctor.ras import render_text as ras_text
    from ddpdoctor.ras import to_json as ras_json

    reports = analyze(processes)
    if source == "py-spy":
        for report in reports:
            report.rendezvous = rendezvous_of(report)
            report.other_hosts = (others or {}).get(report.job)
    ras_problem = ras is not None and bool(ras.dead_ranks or ras.unresponsive_ranks or ras.dead_processes
                                           or ras.unresponsive_processes)
    code = EXIT_PROBLEM if any(r.problem for r in reports) or ras_problem else EXIT_OK
    out = _stdout()
    if json_path is not None:
        doc = to_json(processes, reports, source)
        if ras is not None:
            doc["ras"] = ras_json(ras)
        if json_to_stdout(json_path):
            emit_json(json_path, doc, kind)
            return code
        try:  # first: the file is there even if stdout is a pipe that closes early
            emit_json(json_path, doc, kind)
        except OSError as exc:
            raise DoctorError(f"cannot write --json {json_path}: {exc.strerror or exc}") from exc
    out.write(render_text(reports, all_threads=all_threads, source=source))
    if ras is not None:
        out.write("\n" + ras_text(ras))
    if json_path is not None:
        out.write(f"wrote {json_path}\n")
    out.flush()
    return code


def rendezvous_of(report: JobReport) -> dict[str, Any] | None:
    """For a job whose ranks wait in ``init_process_group``: who never arrived, from the ranks found here and
    the job's own store (:mod:`ddpdoctor.stacks.rendezvous`); None otherwise."""
    from ddpdoctor.stacks.rendezvous import never_arrived, read_store, store_text

    waiting = report.in_rendezvous()
    if not waiting or report.world_size is None:
        return None
    address = next((p.store for p in waiting if p.store), None)
    rank0_hosts = not any(p.agent_store for p in waiting)
    view = None
    if address is not None:
        host, _, port = address.rpartition(":")
        if port.isdigit():
            view = read_store(host, int(port))
    seen = {p.rank for g in report.groups for p in g.members if p.rank is not None}
    missing = never_arrived(report.world_size, seen, view, rank0_hosts)
    # Looking at one node of several, ranks of the other nodes are absent by design: only the store speaks.
    if not report.missing_ranks and view is None:
        missing = []
    return {"waiting": sorted(p.rank for p in waiting if p.rank is not None), "never_arrived": missing,
            "store": view.to_json() if view is not None else None,
            "store_said": store_text(view, rank0_hosts) if view is not None else None}


def _stdout() -> TextIO:
    """stdout that prints any file or function name: an ASCII-only terminal setting gets escapes instead
    of a UnicodeEncodeError, and a closed stdout (``>&-``) swallows output."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")
    return sys.stdout
