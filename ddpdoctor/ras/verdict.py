"""What RAS's status means for the job: which global ranks are dead, unresponsive or behind.

RAS numbers ranks per communicator. PyTorch's default process group is the job's largest communicator and
its ranks are the global ranks, so the largest communicator's (host, pid) -> rank table maps every other
communicator's ranks to global ones; where that fails the communicator rank is reported as such.
A mismatch of operation counts alone is only a warning: NCCL's docs call it normal while collectives
run ("as long as the counts increase across repeated queries"); dead or unresponsive ranks are problems.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.errors import DoctorError
from ddpdoctor.ranks import format_rank_list, rank_phrase
from ddpdoctor.ras.client import DEFAULT_ADDR, RasError, RasTimeout, RasUnavailable, query, ras_addr_from_env
from ddpdoctor.ras.parse import RasCommunicator, RasStatus, parse_reply

OK, WARN, PROBLEM = "ok", "warn", "problem"


@dataclass
class RasVerdict:
    """The verdict, JSON-able through :func:`to_json`."""

    addr: str
    status: str  # ok | warn | problem
    nccl_version: str | None = None
    format: str = ""
    elapsed_s: float = 0.0
    dead_ranks: list[int] = field(default_factory=list)
    unresponsive_ranks: list[int] = field(default_factory=list)
    dead_processes: list[dict[str, Any]] = field(default_factory=list)
    unresponsive_processes: list[dict[str, Any]] = field(default_factory=list)
    communicators: list[dict[str, Any]] = field(default_factory=list)
    timeouts: int = 0
    error: str = ""  # the query failed (timeout mid-reply, protocol error): what happened


def _world(status: RasStatus) -> RasCommunicator | None:
    sized = [c for c in status.communicators if c.size]
    return max(sized, key=lambda c: c.size or 0) if sized else None


def judge(status: RasStatus, addr: str = DEFAULT_ADDR, elapsed_s: float = 0.0) -> RasVerdict:
    """Pure: a parsed status in, the verdict out."""
    world = _world(status)
    table: dict[tuple[str | None, int | None], int] = {}
    if world is not None:
        for r in world.ranks:
            table[(r.host, r.pid)] = r.rank
        for m in world.missing:
            table[(m.host, m.pid)] = m.rank

    def global_rank(comm: RasCommunicator, rank: int, host: str | None, pid: int | None) -> int | None:
        if comm is world or (world is None and status.format == "text"):
            return rank  # the text format has no sizes: its ranks are taken as they are printed
        return table.get((host, pid)) if pid is not None else None

    dead: set[int] = set()
    unresponsive: set[int] = set()
    dead_procs: dict[tuple[str | None, int | None], dict[str, Any]] = {}
    unresp_procs: dict[tuple[str | None, int | None], dict[str, Any]] = {}
    comms: list[dict[str, Any]] = []
    for comm in status.communicators:
        missing = []
        for m in comm.missing:
            g = global_rank(comm, m.rank, m.host, m.pid)
            missing.append({"comm_rank": m.rank, "rank": g, "host": m.host, "pid": m.pid,
                            "dead": m.dead, "unresponsive": m.unresponsive and not m.dead})
            target, procs = (dead, dead_procs) if m.dead else (unresponsive, unresp_procs)
            if g is not None:
                target.add(g)
            if m.pid is not None:
                procs.setdefault((m.host, m.pid), {"host": m.host, "pid": m.pid, "ranks": []})
                if g is not None:
                    procs[(m.host, m.pid)]["ranks"].append(g)
        comms.append({"hash": comm.hash, "label": comm.label, "size": comm.size,
                      "ranks_answered": len(comm.ranks), "missing": missing,
                      "op_counts": _op_counts(comm, lambda r, h, p, c=comm: global_rank(c, r, h, p)),
                      "errors": comm.errors})
    for proc in status.dead_processes:
        dead_procs.setdefault((proc.host, proc.pid), {"host": proc.host, "pid": proc.pid, "ranks": []})
    for proc in status.unresponsive_processes:
        unresp_procs.setdefault((proc.host, proc.pid), {"host": proc.host, "pid": proc.pid, "ranks": []})
    unresponsive -= dead
    for key in set(unresp_procs) & set(dead_procs):
        del unresp_procs[key]
    problem = dead or unresponsive or dead_procs or unresp_procs or status.dead_count or status.unresponsive_count
    behind = any(c["op_counts"].get(op, {}).get("behind") for c in comms for op in c["op_counts"])
    return RasVerdict(
        addr=addr, status=PROBLEM if problem else (WARN if behind else OK), nccl_version=status.nccl_version,
        format=status.format, elapsed_s=elapsed_s, dead_ranks=sorted(dead), unresponsive_ranks=sorted(unresponsive),
        dead_processes=_sorted(dead_procs), unresponsive_processes=_sorted(unresp_procs), communicators=comms,
        timeouts=status.timeouts)


def _sorted(procs: dict[tuple[str | None, int | None], dict[str, Any]]) -> list[dict[str, Any]]:
    out = [dict(p, ranks=sorted(set(p["ranks"]))) for p in procs.values()]
    return sorted(out, key=lambda p: (str(p["host"]), p["pid"] or 0))


def _op_counts(comm: RasCommunicator, to_global: Any) -> dict[str, dict[str, Any]]:
    """operation -> {"max": n, "by_count": {n: [ranks]}, "behind": [ranks below the max]} (global ranks
    where known, else communicator ranks)."""
    groups: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in comm.ranks:
        g = to_global(r.rank, r.host, r.pid)
        for op, n in r.counts.items():
            groups[op][n].append(r.rank if g is None else g)
    for op, by in comm.count_groups.items():  # text output: only the ranks it printed
        for n, ranks in by.items():
            groups[op][n].extend(ranks)
    out: dict[str, dict[str, Any]] = {}
    for op, by in groups.items():
        top = max(by)
        sizes = comm.count_sizes.get(op, {})
        out[op] = {"max": top, "by_count": {str(n): sorted(set(rs)) for n, rs in sorted(by.items())},
                   "ranks_at_count": {str(n): sizes.get(n, len(set(rs))) for n, rs in sorted(by.items())},
                   "behind": sorted({r for n, rs in by.items() if n < top for r in rs})}
    return out


def render_text(v: RasVerdict) -> str:
    """The verdict for a terminal; the first line says whether anything is wrong."""
    head = f"NCCL RAS at {v.addr}" + (f" (NCCL {v.nccl_version}, {v.format})" if v.nccl_version else "")
    if v.error:
        return (v.error if v.error.startswith("NCCL RAS at") else f"{head}: {v.error}") + "\n"
    lines = []
    if v.status == OK:
        lines.append(f"{head}: every rank answered; no dead or unresponsive process")
    elif v.status == WARN:
        lines.append(f"{head}: every rank answered, but operation counts differ (normal while collectives "
                     "run; a problem if they stay the same across queries)")
    else:
        lines.append(f"{head}: PROBLEM")
    for label, ranks, procs in (("dead (RAS gave up on them)", v.dead_ranks, v.dead_processes),
                                ("unresponsive", v.unresponsive_ranks, v.unresponsive_processes)):
        if ranks or procs:
            who = rank_phrase(ranks) if ranks else "processes"
            where = ", ".join(f"pid {p['pid']} on {p['host']}" for p in procs)
            lines.append(f"  {who} {label}" + (f": {where}" if where else ""))
    for c in v.communicators:
        name = f"{c['label']} ({c['hash']}" if c["label"] else f"{c['hash']} ("
        name += f"{', ' if c['label'] else ''}{c['size']} ranks)" if c["size"] else (")" if c["label"] else "")
        name = name.replace(" ()", "")
        for op, counts in sorted(c["op_counts"].items()):
            if len(counts["by_count"]) > 1:
                parts = [f"{rank_phrase(rs) if rs else str(counts['ranks_at_count'][n]) + ' ranks'} at {n}"
                         for n, rs in sorted(counts["by_count"].items(), key=lambda kv: -int(kv[0]))]
                lines.append(f"  communicator {name} {op}: " + "; ".join(parts))
            elif counts["max"]:
                lines.append(f"  communicator {name} {op}: all at operation {counts['max']}")
    if v.timeouts:
        lines.append(f"  RAS hit {v.timeouts} timeouts while gathering data (a process is slow or gone)")
    if v.status == PROBLEM:
        lines.append("  What to do: look at the named processes first (ddpdoctor stacks --pid PID on their "
                     "host; dmesg for Xid errors); RAS declares a process dead after 60 s without contact")
    return "\n".join(lines) + "\n"


def to_json(v: RasVerdict) -> dict[str, Any]:
    """The ``--json`` document of ``ddpdoctor ras`` (and the ``ras`` key of ``stacks``)."""
    return {"addr": v.addr, "status": v.status, "nccl_version": v.nccl_version, "format": v.format,
            "elapsed_s": round(v.elapsed_s, 3), "dead_ranks": v.dead_ranks,
            "dead_ranks_text": format_rank_list(v.dead_ranks) if v.dead_ranks else "",
            "unresponsive_ranks": v.unresponsive_ranks, "dead_processes": v.dead_processes,
            "unresponsive_processes": v.unresponsive_processes, "communicators": v.communicators,
            "timeouts": v.timeouts, "error": v.error}


def ask(addr: str, deadline_s: float, fmt: str = "json", verbose: bool = False) -> RasVerdict:
    """Query and judge; a service that times out or breaks the protocol is a verdict with ``error`` set
    (status ``problem``). :class:`RasUnavailable` (nothing listening) propagates."""
    try:
        reply = query(addr, deadline_s=deadline_s, fmt=fmt, verbose=verbose)
    except RasUnavailable:
        raise
    except RasTimeout as exc:
        got = f" after {len(exc.partial)} bytes of its reply" if exc.partial else ""
        return RasVerdict(addr=addr, status=PROBLEM, error=f"{exc}{got}; the NCCL process serving RAS may be "
                          "hung (some NCCL versions also stall under frequent polling); retry once later")
    except RasError as exc:
        return RasVerdict(addr=addr, status=PROBLEM, error=str(exc))
    return judge(parse_reply(reply.body, reply.format), addr, reply.elapsed_s)


def probe(environ: dict[str, str] | None = None, deadline_s: float = 1.0) -> RasVerdict | None:
    """For other commands (``stacks``): ask RAS once, within ``deadline_s``, when ``NCCL_RAS_ADDR`` is set
    or the default port answers; None when no RAS service is there. Never raises for RAS's sake."""
    env = os.environ if environ is None else environ
    addr = ras_addr_from_env(dict(env))
    try:
        return ask(addr, deadline_s)
    except RasUnavailable as exc:
        if env.get("NCCL_RAS_ADDR", "").strip():
            return RasVerdict(addr=addr, status=WARN, error=str(exc))
        return None
    except (DoctorError, OSError, ValueError) as exc:  # a RAS failure must never cost the caller's report
        return RasVerdict(addr=addr, status=WARN, error=f"could not read NCCL RAS: {exc}")
