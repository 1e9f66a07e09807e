"""The stacks of a job as text and as the documented JSON, and that JSON read back (``stacks merge``).

Pure functions over :mod:`ddpdoctor.stacks.model`; no processes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ddpdoctor import __version__
from ddpdoctor.errors import DoctorError
from ddpdoctor.stacks.model import Frame, JobReport, ProcessStacks, ThreadStack, format_ranks, rank_order


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
        by_error: dict[str, list[ProcessStacks]] = {}
        for proc in report.failed:  # one line per distinct reason: 8 ranks denied by ptrace is one problem
            by_error.setdefault(proc.error or "no Python threads", []).append(proc)
        for error, procs in by_error.items():
            who = ", ".join(f"{p.label} (pid {p.pid} on {p.host})" if p.rank is not None
                            else f"pid {p.pid} on {p.host}" for p in procs)
            lines.append(f"  {who}: no stack: {error}")
        if report.missing_ranks:
            lines.append(f"  {format_ranks(_fake(report.missing_ranks))} not found: not running on the "
                         "host(s) looked at (exited, or on a node whose JSON was not merged)")
        for group in report.groups:
            rep = group.representative
            lines.append("")
            lines.append(f"  {format_ranks(group.members)} ({_count(len(group.members))}): "
                         f"{group.position.describe()}")
            lines.append("    " + ", ".join(f"{p.label}=pid {p.pid}@{p.host}" for p in group.members))
            main = rep.main_thread()
            threads = [t for t in [main] if t is not None]
            if all_threads:
                threads += [t for t in rep.threads if t is not main]
            for thread in threads:
                lines.append(f"    thread {thread.name or thread.thread_id}"
                             f"{' (main)' if thread.main else ''} of {rep.label}, innermost first:")
                lines.extend(f"      {frame.where()}" for frame in thread.frames)
            hidden = len(rep.threads) - len(threads)
            if hidden > 0:
                lines.append(f"    ({hidden} other thread(s) not shown; --all-threads shows them)")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


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
        "jobs": [{"job": r.job, "world_size": r.world_size, "summary": r.summary(),
                  "outliers": [p.rank for p in r.outliers], "missing_ranks": r.missing_ranks,
                  "failed": [{"pid": p.pid, "rank": p.rank, "host": p.host, "error": p.error}
                             for p in r.failed]} for r in reports],
    }


def _optional_int(entry: Mapping[str, Any], key: str) -> int | None:
    """A rank-like field of a --json process: absent/null, or an integer (a string there is a bad file)."""
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} is {value!r}, not an integer")
    return value


def _optional_str(entry: Mapping[str, Any], key: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} is {value!r}, not a string")
    return value


def processes_from_json(doc: Any, origin: str) -> list[ProcessStacks]:
    """Parse the ``processes`` of a ``--json`` file; a wrong file is a usage error naming the file."""
    try:
        out = []
        for p in doc["processes"]:
            threads = [ThreadStack(int(t["thread_id"]), str(t["name"]), bool(t["main"]),
                                   [Frame(str(f["function"]), str(f["file"]), int(f["line"]))
                                    for f in t["frames"]])
                       for t in p["threads"]]
            out.append(ProcessStacks(pid=int(p["pid"]), host=str(p["host"]), rank=_optional_int(p, "rank"),
                                     local_rank=_optional_int(p, "local_rank"),
                                     world_size=_optional_int(p, "world_size"),
                                     local_world_size=_optional_int(p, "local_world_size"),
                                     job=_optional_str(p, "job"), cmdline=str(p.get("cmdline") or ""),
                                     threads=threads, error=_optional_str(p, "error")))
        return out
    except (KeyError, TypeError, ValueError) as exc:
        raise DoctorError(f"{origin} is not a `ddpdoctor stacks --json` file (missing or bad field: {exc}); "
                          "write one per node with `ddpdoctor stacks --json PATH`") from exc


def load_json_files(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[ProcessStacks], str]:
    """Read several nodes' files; the same (host, pid) seen twice is kept once."""
    import json

    seen: dict[tuple[str, int], ProcessStacks] = {}
    sources = set()
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError as exc:
            raise DoctorError(f"{path}: no such file; pass the files written by `ddpdoctor stacks --json`") from exc
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise DoctorError(f"{path}: not readable JSON ({exc}); was the file cut short?") from exc
        if not isinstance(doc, dict):
            raise DoctorError(f"{path} is not a `ddpdoctor stacks --json` file (top level is not an object)")
        sources.add(str(doc.get("source", "py-spy")))
        for proc in processes_from_json(doc, str(path)):
            seen.setdefault((proc.host, proc.pid), proc)
    return list(seen.values()), "+".join(sorted(sources))
