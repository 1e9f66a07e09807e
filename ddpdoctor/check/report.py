"""Pure functions: the merged findings of a run (:class:`~ddpdoctor.check.model.Report`) -> one table.

Rendering depends only on data, so it is tested without processes. Root cause first: ranks that never
reported and failures come before warnings and passes, in the order the checks ran.
"""

from __future__ import annotations

import json

from tabulate import tabulate

from ddpdoctor.check.causes import cause_of
from ddpdoctor.check.model import MAX_TAGGED, Report
from ddpdoctor.findings import ERROR, FAIL, PASS, SKIP, WARN, Finding, RankInfo
from ddpdoctor.ranks import format_rank_list
from ddpdoctor.runtime.hosts import hosts_text, ranks_by_host

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
        # The one rank-list format (ranks.py) for the ranks without a tag (those that never reported), each
        # tagged rank with its [host:local_rank]: '1-3' and '0 [vm:0], 5 [node-b:1]', never '1 2 3'.
        untagged = [r for r in ranks if r not in peers]
        parts = [(r, f"{r} {peers[r].tag}") for r in sorted(set(ranks)) if r in peers]
        if untagged:
            parts.append((min(untagged), format_rank_list(untagged)))
        return ", ".join(text for _, text in sorted(parts))
    return short_rank_list(ranks, RANKS_WIDTH * 2)


def _row(finding: Finding, world_size: int, peers: dict[int, RankInfo], folded: bool) -> list[str]:
    """One table row; a finding its cause explains is indented under it, its status in lower case."""
    status = finding.status.upper() if finding.status in (FAIL, ERROR) and not folded else finding.status
    check = f"  -> {finding.check}" if folded else finding.check
    return [check, status, format_ranks(finding.ranks, world_size, peers), finding.summary]


def result_line(report: Report, ordered: list[Finding], folded: list[Finding]) -> str:
    """``Result: FAIL (1 fail, 3 pass; 2 more explained by the finding above them)``; a run that checked
    nothing says so instead of passing."""
    folded_ids = {id(f) for f in folded}
    roots = [f for f in ordered if id(f) not in folded_ids]
    counts = {s: sum(1 for f in roots if f.status == s) for s in (FAIL, ERROR, WARN, PASS, SKIP)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if folded:
        causes = {id(cause_of(f, ordered)) for f in folded}
        summary += f"; {len(folded)} more explained by the finding{'s' if len(causes) > 1 else ''} above them"
    if report.status == SKIP:
        skipped = ", ".join(dict.fromkeys(f.check for f in report.findings))
        return f"Result: SKIP: nothing was checked: every check run here skipped ({skipped}); see why above"
    return f"Result: {report.status.upper()} ({summary})"


def _took(report: Report) -> str:
    """'4.3 s (checks 1.1 s)': the time the user waited, and the part the checks took when it is a fraction."""
    wall = report.wall_s or report.elapsed_s
    checks = report.checks_s
    if 0.1 <= checks < 0.8 * wall:
        return f"{wall:.1f} s (checks {checks:.1f} s)"
    return f"{wall:.1f} s"


def hosts_line(hosts: dict[str, list[int]]) -> str:
    """'hosts: nodea: ranks 0-1; nodeb: ranks 2-3' (where each rank runs, for a job on several hosts)."""
    return f"hosts: {hosts_text(hosts)}"


def render_table(report: Report, verbose: bool = False) -> str:
    """The one screen a user reads: header, table, and what to do about every problem."""
    peers = {r.rank: r for r in report.ranks}
    hosts = sorted({r.host for r in report.ranks})
    # At scale the host list would fill the screen: the first and last name say the naming scheme.
    named = ", ".join(hosts) if len(hosts) <= MAX_HOSTS_NAMED else f"{hosts[0]} ... {hosts[-1]}"
    header = (f"ddpdoctor check: {report.world_size} rank{'s' if report.world_size != 1 else ''} on "
              f"{len(hosts)} host{'s' if len(hosts) != 1 else ''} ({named or '?'}), "
              f"backend {report.backend}, launcher {report.launcher}, {_took(report)}")
    ordered = report.ordered()
    folded = [f for f in ordered if cause_of(f, ordered) is not None]
    lines = [header]
    if len(hosts) > 1:
        lines.append(hosts_line(ranks_by_host((r.rank, r.host) for r in report.ranks)))
    folded_ids = {id(f) for f in folded}
    rows = [_row(f, report.world_size, peers, id(f) in folded_ids) for f in ordered]
    table = tabulate(rows, headers=["check", "status", "ranks", "summary"], tablefmt="simple",
                     maxcolwidths=[None, None, RANKS_WIDTH, 90])
    lines += ["", table]
    todo = [f for f in ordered if f.remedy and f.status in (FAIL, ERROR, WARN) and id(f) not in folded_ids]
    if todo:
        lines += ["", "What to do:"]
        for number, finding in enumerate(todo, 1):
            explained = sorted({f.check for f in folded if cause_of(f, ordered) is finding})
            also = f" (this also explains the {', '.join(explained)} finding{'s' if len(explained) > 1 else ''} " \
                   "under it)" if explained else ""
            lines.append(f"  {number}. [{finding.check}] {finding.remedy}{also}")
    if verbose:
        lines += ["", "Details:"]
        for finding in ordered:
            if finding.details:
                text = json.dumps(finding.details, indent=2, sort_keys=True, default=str)
                lines.append(f"  {finding.check} ({finding.status}, ranks {format_rank_list(finding.ranks)}):")
                lines += ["    " + line for line in text.splitlines()]
    lines += ["", result_line(report, ordered, folded)]
    return "\n".join(lines)
