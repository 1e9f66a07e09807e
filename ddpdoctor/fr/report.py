"""The ``fr`` verdict as text (failing groups first, each with its first divergence) and as JSON.

Pure functions of :class:`~ddpdoctor.fr.model.FrReport`; docs/fr.md documents both.
"""

from __future__ import annotations

from typing import Any

from ddpdoctor import __version__
from ddpdoctor.fr.model import FrReport
from ddpdoctor.ranks import format_rank_list, rank_phrase
from ddpdoctor.runtime.hosts import hosts_text


def render_text(report: FrReport) -> str:
    """The human report: what was read, who is missing, then every process group's verdict."""
    dumps = report.dumps
    formats = "/".join(sorted({d.format for d in dumps}))
    versions = "/".join(sorted({d.version for d in dumps}))
    frames = "" if any(d.has_frames for d in dumps) else "; no Python frames in these dumps (JSON dumps have none)"
    lines = [f"ddpdoctor fr: {len(dumps)} dump(s) from {rank_phrase(d.rank for d in dumps)} of {report.world_size} "
             f"({formats}, Flight Recorder {versions}){frames}"]
    if report.stacks_files:
        lines.append(f"  stacks from {', '.join(report.stacks_files)}")
    if len(report.hosts) > 1:
        lines.append(f"  hosts: {hosts_text(report.hosts)}")
    for bad in report.unreadable:
        lines.append(f"  rank {bad.rank}'s dump {bad.path} cannot be read: {bad.why}")
    damaged = {u.rank for u in report.unreadable}
    unwritten = [r for r in report.missing if r not in damaged]
    if unwritten:
        they = "it" if len(unwritten) == 1 else "they"
        lines.append(f"  no dump from {rank_phrase(unwritten)}: {they} died or could not write")
    if report.missing:
        lines.append("  (the verdict below uses the other ranks)")
    for group in report.groups:
        lines.append("")
        mark = "FAIL" if group.divergences else "ok"
        membership = "" if group.ranks_known else " [members inferred from the dumps]"
        lines.append(f"[{mark}] {group.label}{membership}")
        for divergence in group.divergences:
            lines.append(f"  {divergence.summary}")
            for rank, now in sorted(divergence.stacks.items()):
                lines.append(f"    rank {rank} {now.describe()}")
        if group.missing:
            lines.append(f"  no dump from member {rank_phrase(group.missing)}")
        if group.note:
            lines.append(f"  {group.note}")
    lines.append("")
    failing = [g for g in report.groups if g.divergences]
    if report.status == "fail":
        lines.append(f"Result: FAIL: {report.summary()}")
        if failing:
            lines.append("What to do: look at the diverging rank(s) at the line shown; a rank that never issued a "
                         "collective is stuck or busy elsewhere (`ddpdoctor stacks` on the live job shows where), "
                         "a mismatch is code that calls collectives in a rank-dependent order.")
        if report.missing:
            lines.append(f"Rank(s) {format_rank_list(report.missing)} left no readable dump: check their logs "
                         "(`ddpdoctor explain`) for a crash, OOM kill or segfault.")
    else:
        lines.append(f"Result: PASS: {report.summary()}")
    return "\n".join(lines) + "\n"


def to_json(report: FrReport) -> dict[str, Any]:
    """The documented ``--json`` document (docs/fr.md, "JSON output")."""
    return {
        "tool": "ddpdoctor",
        "version": __version__,
        "status": report.status,
        "summary": report.summary(),
        "world_size": report.world_size,
        "ranks": [d.rank for d in report.dumps],
        "missing_ranks": report.missing,
        "unreadable_dumps": [u.to_dict() for u in report.unreadable],
        "dumps": [d.to_dict() for d in report.dumps],
        "stacks_files": report.stacks_files,
        "hosts": report.hosts,
        "groups": [g.to_dict() for g in report.groups],
    }
