"""Pure functions: the merged findings of a run (:class:`~ddpdoctor.check.model.Report`) -> one table.

Rendering depends only on data, so it is tested without processes. Root cause first: ranks that never
reported and failures come before warnings and passes, in the order the checks ran.
"""

from __future__ import annotations

import json

from tabulate import tabulate

from ddpdoctor.check.model import MAX_TAGGED, Report
from ddpdoctor.findings import ERROR, FAIL, PASS, SKIP, WARN, RankInfo
from ddpdoctor.ranks import format_rank_list

MAX_HOSTS_NAMED = 4
RANKS_WIDTH = 28  # the ranks column; a longer list wraps to at most two lines


def short_rank_list(ranks: list[int], width: int = 40) -> str:
    """The rank list if it fits ``width``, else its count and its start: the JSON keeps the whole list."""
    full = format_rank_list(ranks)
    if len(full) <= width:
        return full
    cut = full[: width - 8].rsplit(",", 1)[0]
    return f"{len(ranks)} ranks: {cut},..."


def format_ranks(ranks: list[int], world_size: int, peers: dict[int, RankInfo]) -> str:
    """'all (0-7)' when every rank agrees, else the ranks with [host:local_rank] tags for outliers."""
    if not ranks:
        return "-"
    if sorted(set(ranks)) == list(range(world_size)) and world_size > 1:
        return f"all ({format_rank_list(ranks)})"
    if len(ranks) <= MAX_TAGGED:
        return " ".join(f"{r} {peers[r].tag}" if r in peers else str(r) for r in sorted(ranks))
    return short_rank_list(ranks, RANKS_WIDTH * 2)


def render_table(report: Report, verbose: bool = False) -> str:
    """The one screen a user reads: header, table, and what to do about every problem."""
    peers = {r.rank: r for r in report.ranks}
    hosts = sorted({r.host for r in report.ranks})
    # At scale the host list would fill the screen: the first and last name say the naming scheme.
    named = ", ".join(hosts) if len(hosts) <= MAX_HOSTS_NAMED else f"{hosts[0]} ... {hosts[-1]}"
    header = (f"ddpdoctor check: {report.world_size} rank{'s' if report.world_size != 1 else ''} on "
              f"{len(hosts)} host{'s' if len(hosts) != 1 else ''} ({named or '?'}), "
              f"backend {report.backend}, launcher {report.launcher}, {report.elapsed_s:.1f} s")
    ordered = report.ordered()
    rows = [[f.check, f.status.upper() if f.status in (FAIL, ERROR) else f.status,
             format_ranks(f.ranks, report.world_size, peers), f.summary] for f in ordered]
    table = tabulate(rows, headers=["check", "status", "ranks", "summary"], tablefmt="simple",
                     maxcolwidths=[None, None, RANKS_WIDTH, 90])
    lines = [header, "", table]
    todo = [f for f in ordered if f.remedy and f.status in (FAIL, ERROR, WARN)]
    if todo:
        lines += ["", "What to do:"]
        for number, finding in enumerate(todo, 1):
            lines.append(f"  {number}. [{finding.check}] {finding.remedy}")
    if verbose:
        lines += ["", "Details:"]
        for finding in ordered:
            if finding.details:
                text = json.dumps(finding.details, indent=2, sort_keys=True, default=str)
                lines.append(f"  {finding.check} ({finding.status}, ranks {format_rank_list(finding.ranks)}):")
                lines += ["    " + line for line in text.splitlines()]
    counts = {s: sum(1 for f in report.findings if f.status == s) for s in (FAIL, ERROR, WARN, PASS, SKIP)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    lines += ["", f"Result: {report.status.upper()} ({summary})"]
    return "\n".join(lines)
