"""The stacks of a job as text and as the documented JSON, and that JSON read back (``stacks merge``).

Pure functions over :mod:`ddpdoctor.stacks.model`; no processes.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ddpdoctor import __version__
from ddpdoctor.errors import DoctorError
from ddpdoctor.fileio import read_regular
from ddpdoctor.ranks import rank_phrase
from ddpdoctor.runtime.hosts import hosts_text, ranks_by_host
from ddpdoctor.safejson import UntrustedJSONError, loads_untrusted
from ddpdoctor.stacks.model import (
    MAX_WORLD_SIZE,
    Frame,
    JobReport,
    Local,
    ProcessStacks,
    ThreadStack,
    format_ranks,
    rank_order,
)


def render_text(reports: Sequence[JobReport], all_threads: bool = False, source: str = "py-spy") -> str:
    """The human report: per job, the verdict line, then each group with one representative stack."""
    lines: list[str] = []
    for report in reports:
        members = [p for g in report.groups for p in g.members] + report.failed
        hosts = sorted({p.host for p in members})
        lines.append(f"job {report.job or '(unknown)'}: {_count(len(members))} on {', '.join(hosts)}"
                     + (f", world size {report.world_size}" if report.world_size else "")
                     + f" (stacks by {source})")
        lines.append(f"  {report.summary()}")
        if len(hosts) > 1:
            lines.append(f"  hosts: {hosts_text(job_hosts(report))}")
        by_error: dict[str, list[ProcessStacks]] = {}
        for proc in report.failed:  # one line per distinct reason: 8 ranks denied by ptrace is one problem
            by_error.setdefault(proc.error or "no Python threads", []).append(proc)
        for error, procs in by_error.items():
            who = ", ".join(f"{p.label} ({p.address})" if p.address is not None
                            else f"{p.label} (pid {p.pid} on {p.host})" if p.rank is not None
                            else f"pid {p.pid} on {p.host}" for p in procs)
            lines.append(f"  {who}: no stack: {error}")
        rendezvous = report.rendezvous
        if rendezvous and rendezvous["never_arrived"]:
            lines.append(f"  rendezvous: {format_ranks(_fake(rendezvous['never_arrived']))} never arrived; "
                         f"{format_ranks(_fake(rendezvous['waiting']))} wait for {'it' if len(rendezvous['never_arrived']) == 1 else 'them'} in init_process_group"
                         + (f" ({rendezvous['store_said']})" if rendezvous.get("store_said") else ""))
        elif report.missing_ranks:
            lines.append(f"  {format_ranks(_fake(report.missing_ranks))} not found: not running on the "
                         "host(s) looked at (exited, or on a node whose JSON was not merged)")
        lines.extend(other_hosts_lines(report, source))
        for group in report.groups:
            rep = group.representative
            lines.append("")
            lines.append(f"  {format_ranks(group.members)} ({_count(len(group.members))}): "
                         f"{group.position.describe()}")
            lines.append("    " + ", ".join(p.where for p in group.members))
            main = rep.main_thread()
            threads = [t for t in [main] if t is not None]
            if all_threads:
                threads += [t for t in rep.threads if t is not main]
            for thread in threads:
                lines.append(f"    thread {thread.name or thread.thread_id}"
                             f"{' (main)' if thread.main else ''} of {rep.label}, innermost first:")
                for frame in thread.frames:
                    lines.append(f"      {frame.where()}")
                    lines.extend(f"          {_local_line(v)}" for v in frame.locals)
            hidden = len(rep.threads) - len(threads)
            if hidden > 0:
                lines.append(f"    ({hidden} other thread(s) not shown; --all-threads shows them)")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# py-spy already shortens long reprs; a line of the report stays readable beyond that.
MAX_LOCAL_CHARS = 160


def _local_line(local: Local) -> str:
    """``name = repr`` of one local (``--locals``), on one line: control characters escaped, long reprs cut."""
    text = local.repr if local.repr.isprintable() else "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in local.repr)
    if len(text) > MAX_LOCAL_CHARS:
        text = text[:MAX_LOCAL_CHARS - 3] + "..."
    return f"{local.name} = {text}" + ("  (argument)" if local.arg else "")


def other_hosts_commands(report: JobReport, source: str = "py-spy") -> list[str]:
    """What to run for the ranks on other hosts: ``stacks`` on each of them (``--signal`` as here), then
    ``stacks merge``."""
    job = (" --signal" if source == "signal" else "") + (f" --job {shlex.quote(report.job)}" if report.job else "")
    here = (report.other_hosts or {}).get("here") or sorted({p.host for g in report.groups for p in g.members})
    mine = f"{here[0] if len(here) == 1 else 'this-host'}.json"
    return [f'ddpdoctor stacks{job} --json "$(hostname).json"',
            f"ddpdoctor stacks merge {shlex.quote(mine)} OTHER-HOST.json ..."]


def other_hosts_lines(report: JobReport, source: str = "py-spy") -> list[str]:
    """The ranks that run on other hosts: read over HTTP (which host holds which), or how to read them."""
    info = report.other_hosts or {}
    lines: list[str] = []
    fetched = info.get("fetched") or []
    if fetched:
        where = hosts_text(info.get("hosts") or {})
        lines.append(f"  {rank_phrase(fetched)} on other hosts ({where}): stacks read over HTTP from PyTorch's "
                     f"debug servers (found in the job's store at {info.get('store')})")
    if info.get("flight_recorder_summary"):
        fr = info.get("flight_recorder") or {}
        lines.append(f"  Flight Recorder of {rank_phrase(fr.get('fetched_ranks') or [])} (over HTTP): "
                     f"{info['flight_recorder_summary']}")
    if report.elsewhere:
        why = f" ({info['why_not']})" if info.get("why_not") else ""
        named = {h: [r for r in ranks if r in report.elsewhere] for h, ranks in (info.get("hosts") or {}).items()}
        named = {h: ranks for h, ranks in named.items() if ranks}
        where = f" ({hosts_text(named)}, from the job's store)" if named else ""
        first, merge = other_hosts_commands(report, source)
        lines.append(f"  {rank_phrase(report.elsewhere)} run on other hosts{where}, not read from here{why}; on "
                     f"each of those hosts run:")
        lines.append(f"      {first}")
        lines.append(f"    and with this host's --json as well, merge the files: {merge}")
    return lines


def job_hosts(report: JobReport) -> dict[str, list[int]]:
    """host -> the ranks seen there (stacks taken or not), for "nodeB: ranks 2-3"."""
    members = [p for g in report.groups for p in g.members] + report.failed
    return ranks_by_host((p.rank, p.host) for p in members if p.rank is not None)


def _count(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def _fake(ranks: Sequence[int]) -> list[ProcessStacks]:
    return [ProcessStacks(pid=0, host="", rank=r) for r in ranks]


def to_json(processes: Sequence[ProcessStacks], reports: Sequence[JobReport], source: str,
            host: str | None = None) -> dict[str, Any]:
    """The documented ``--json`` document (docs/stacks.md, "JSON output")."""
    return {
        "tool": "ddpdoctor",
        "version": __version__,
        "host": host if host is not None else os.uname().nodename,
        "source": source,
        "processes": [p.to_dict() for p in sorted(processes, key=rank_order)],
        "groups": [g.to_dict() for r in reports for g in r.groups],
        "outliers": sorted({p.rank for r in reports for p in r.outliers if p.rank is not None}),
        "no_majority": any(r.tie for r in reports),
        "hosts": ranks_by_host((p.rank, p.host) for p in processes if p.rank is not None),
        "jobs": [{"job": r.job, "world_size": r.world_size, "summary": r.summary(), "hosts": job_hosts(r),
                  "outliers": [p.rank for p in r.outliers], "no_majority": r.tie,
                  "missing_ranks": r.missing_ranks,
                  "rendezvous": r.rendezvous,
                  "elsewhere": r.elsewhere,
                  "other_hosts": ({**(r.other_hosts or {}),
                                   "commands": other_hosts_commands(r, source) if r.elsewhere else []}
                                  if r.other_hosts is not None or r.elsewhere else None),
                  "failed": [{"pid": p.pid, "rank": p.rank, "host": p.host, "error": p.error}
                             for p in r.failed]} for r in reports],
    }


# A node's file holds its ranks' stacks: kilobytes to a few megabytes. Far more is not such a file.
MAX_FILE_BYTES = 256 * 2**20


def _int_field(entry: Mapping[str, Any], key: str, *, optional: bool, minimum: int = 0,
               maximum: int | None = None) -> int | None:
    """An integer field of a --json process: absent/null where ``optional``, else an integer in
    [``minimum``, ``maximum``] (a string, float or boolean there is a bad file, not something to guess)."""
    value = entry.get(key) if optional else entry[key]
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} is {value!r}, not an integer")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ValueError(f"{key} is {value}, not {bound}")
    return value


def _optional_str(entry: Mapping[str, Any], key: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} is {value!r}, not a string")
    return value


def _frame(f: Mapping[str, Any]) -> Frame:
    found = f.get("locals") or []
    if not isinstance(found, list):
        raise ValueError(f"locals is {found!r}, not a list")
    local_vars = tuple(Local(str(v["name"]), str(v["repr"]), bool(v.get("arg", False))) for v in found)
    return Frame(str(f["function"]), str(f["file"]), int(_int_field(f, "line", optional=False) or 0), local_vars)


def _process(p: Mapping[str, Any]) -> ProcessStacks:
    rank_like = {key: _int_field(p, key, optional=True, maximum=MAX_WORLD_SIZE)
                 for key in ("rank", "local_rank", "world_size", "local_world_size")}
    for key in ("world_size", "local_world_size"):
        if rank_like[key] == 0:
            raise ValueError(f"{key} is 0, not between 1 and {MAX_WORLD_SIZE}")
    threads = [ThreadStack(int(_int_field(t, "thread_id", optional=False) or 0), str(t["name"]),
                           bool(t["main"]), [_frame(f) for f in t["frames"]])
               for t in p["threads"]]
    address = _optional_str(p, "debug_server")
    # A rank read over HTTP has no pid (0); every other process has a real one.
    pid = int(_int_field(p, "pid", optional=False, minimum=0 if address else 1) or 0)
    return ProcessStacks(pid=pid, host=str(p["host"]), address=address,
                         rank=rank_like["rank"], local_rank=rank_like["local_rank"],
                         world_size=rank_like["world_size"], local_world_size=rank_like["local_world_size"],
                         job=_optional_str(p, "job"), cmdline=str(p.get("cmdline") or ""),
                         threads=threads, error=_optional_str(p, "error"))


def processes_from_json(doc: Any, origin: str) -> list[ProcessStacks]:
    """Parse the ``processes`` of a ``--json`` file; a wrong file is a usage error naming the file.

    Every number is checked, not coerced: pids are positive integers, ranks and world sizes integers up
    to :data:`~ddpdoctor.stacks.model.MAX_WORLD_SIZE` (a world size of ten million would make the report
    list ten million missing ranks).
    """
    try:
        return [_process(p) for p in doc["processes"]]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DoctorError(f"{origin} is not a `ddpdoctor stacks --json` file (missing or bad field: {exc}); "
                          "write one per node with `ddpdoctor stacks --json PATH`") from None


def load_json_files(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[ProcessStacks], str]:
    """Read several nodes' files; the same (host, pid) seen twice is kept once.

    Only regular files are opened (a FIFO would block the merge forever), and the JSON is read with
    :func:`ddpdoctor.safejson.loads_untrusted` (no NaN/Infinity, overflowing or 5,000-digit numbers).
    """
    seen: dict[tuple[str, int], ProcessStacks] = {}
    sources = set()
    for path in paths:
        try:
            doc = loads_untrusted(read_regular(path, MAX_FILE_BYTES))
        except FileNotFoundError:
            raise DoctorError(f"{path}: no such file; pass the files written by `ddpdoctor stacks --json`") from None
        except OSError as exc:
            raise DoctorError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        except UntrustedJSONError as exc:
            raise DoctorError(f"{path}: not readable JSON ({exc}); was the file cut short?") from None
        if not isinstance(doc, dict):
            raise DoctorError(f"{path} is not a `ddpdoctor stacks --json` file (top level is not an object)")
        sources.add(str(doc.get("source", "py-spy")))
        for proc in processes_from_json(doc, str(path)):
            # Ranks read over HTTP have pid 0: their rank tells them apart (the same rank twice is kept once).
            seen.setdefault((proc.host, proc.pid) if proc.address is None else (proc.host, -1 - (proc.rank or 0)), proc)
    return list(seen.values()), "+".join(sorted(sources))
