"""The human report of an ``ExplainResult``: a pure function of the data."""

from __future__ import annotations

from ddpdoctor.explain.model import ExplainResult
from ddpdoctor.explain.scanner import MAX_MATCH_CHARS
from ddpdoctor.ranks import format_rank_list


def render_text(result: ExplainResult) -> str:
    """The human report: one numbered block per diagnosis, root cause first."""
    nfiles = len(result.files)
    where = f"{nfiles} input{'s' if nfiles != 1 else ''}, {result.lines_scanned:,} lines"
    windowed = ""
    if result.lines_windowed:
        n = result.lines_windowed
        windowed = (f"note: {n:,} line{'s' if n != 1 else ''} longer than {MAX_MATCH_CHARS:,} bytes "
                    f"{'was' if n == 1 else 'were'} matched on {'its' if n == 1 else 'their'} first and last "
                    f"{MAX_MATCH_CHARS:,} bytes only (what lies between was not searched).\n")
    if not result.diagnoses:
        return f"ddpdoctor explain: no known DDP/NCCL/torchrun error found ({where}).\n" + windowed
    n = len(result.diagnoses)
    out = [f"ddpdoctor explain: {n} known problem{'s' if n != 1 else ''} found ({where}); root cause first.", ""]
    for i, d in enumerate(result.diagnoses, 1):
        sig = d.signature
        ranks = format_rank_list(list(d.ranks)) if d.ranks else "unknown"
        out.append(f"{i}. {sig.title}  [{sig.id}]")
        out.append(f"   ranks: {ranks}   lines: {d.count}")
        if d.details:
            out.append("   details: " + ", ".join(f"{k}={'/'.join(v)}" for k, v in d.details.items()))
        out.append("   evidence:")
        for ev in d.evidence:
            out.append(f"     {ev.file}:{ev.line}: {ev.text}")
        if d.count > len(d.evidence):
            out.append(f"     ... and {d.count - len(d.evidence)} more matching line(s)")
        out.extend(f"   note: {note}" for note in d.notes)
        out.append(f"   why:  {sig.cause}")
        out.append(f"   fix:  {sig.remedy}")
        out.append(f"   next: {sig.command}")
        out.append("")
    return "\n".join(out) + windowed
