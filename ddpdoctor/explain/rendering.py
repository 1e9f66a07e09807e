"""The human report of an ``ExplainResult``: a pure function of the data.

Root causes are numbered, first first; what each one explains (its consequences, ``caused_by``) is listed
under it, indented, not as a rival problem; notes (hints, not failures) come last under their own heading.
"""

from __future__ import annotations

import re

from ddpdoctor.explain.model import Diagnosis, ExplainResult
from ddpdoctor.explain.scanner import MAX_MATCH_CHARS
from ddpdoctor.ranks import format_rank_list

# The catch-all: its title says nothing the user can act on, so its headline is the exception itself.
FALLBACK_ID = "python-exception"


def _plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else (words or word + 's')}"


def headline(d: Diagnosis) -> str:
    """The numbered line's text: the title, or for the catch-all what the first rank raised and where."""
    first = d.first_event
    lagging = sorted({int(r) for text in d.details.get("lagging_ranks", []) for r in re.findall(r"\d+", text)})
    if lagging:  # the desync report's and monitored_barrier's named ranks: the ranks to look at, not the reporter's
        return f"{d.signature.title}: {'rank' if len(lagging) == 1 else 'ranks'} {format_rank_list(lagging)}"
    if d.id != FALLBACK_ID or first is None or not first.exception:
        return d.signature.title
    # Reported as a note, the catch-all is a log with no sign of a distributed job (Signature.for_one_process).
    alone = d.signature.is_note
    who = "This process" if alone else f"Rank {d.first_rank}" if d.first_rank is not None else "A rank"
    text = f"{who} raised {first.exception}"
    if first.message:
        text += f": {first.message}"
    if first.frame:
        text += f"  (at {first.frame})"
    if alone:
        text += "; no sign of a distributed job in the log"
    return text


def _first_line(d: Diagnosis) -> str | None:
    """Which rank failed first, and by what evidence, when there is a choice or an exception to name."""
    first = d.first_event
    if d.first_rank is None or first is None or d.signature.is_note:
        return None
    parts = [f"rank {d.first_rank}"]
    if len(d.ranks) > 1:
        parts[0] += f" (by {d.first_rank_by})"
    if first.exception and d.id != FALLBACK_ID:
        parts.append(f"raised {first.exception}")
    if first.frame and d.id != FALLBACK_ID:
        parts.append(f"at {first.frame}")
    if len(parts) == 1 and len(d.ranks) <= 1:
        return None
    return ", ".join(parts)


def _block(d: Diagnosis, number: str) -> list[str]:
    sig = d.signature
    ranks = format_rank_list(list(d.ranks)) if d.ranks else "unknown"
    out = [f"{number} {headline(d)}  [{sig.id}]"]
    level = "" if d.level != "warning" else "   (seen in warnings only)"
    out.append(f"   ranks: {ranks}   lines: {d.count}{level}")
    first = _first_line(d)
    if first:
        out.append(f"   first: {first}")
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
    return out


def _consequences(head: Diagnosis, result: ExplainResult) -> list[str]:
    """The diagnoses ``head`` explains, directly or through another, each with its first evidence line."""
    by_cause: dict[str, list[Diagnosis]] = {}
    for d in result.diagnoses:
        if d.caused_by is not None:
            by_cause.setdefault(d.caused_by, []).append(d)
    out: list[str] = []

    def walk(d: Diagnosis, depth: int) -> None:
        for c in by_cause.get(d.id, ()):
            ranks = format_rank_list(list(c.ranks)) if c.ranks else "unknown"
            pad = "     " + "  " * depth
            out.append(f"{pad}- {headline(c)}  [{c.id}]  ranks: {ranks}   lines: {c.count}")
            if c.evidence:
                ev = c.evidence[0]
                out.append(f"{pad}    {ev.file}:{ev.line}: {ev.text}")
            walk(c, depth + 1)

    walk(head, 0)
    if out:
        out.insert(0, "   consequences (explained by the above, not separate problems):")
    return out


def render_text(result: ExplainResult) -> str:
    """The human report: one numbered block per root cause, its consequences under it, notes last."""
    nfiles = len(result.files)
    lines = result.lines_scanned
    where = f"{nfiles} input{'s' if nfiles != 1 else ''}, {lines:,} line{'s' if lines != 1 else ''}"
    windowed = ""
    if result.lines_windowed:
        n = result.lines_windowed
        windowed = (f"note: {n:,} line{'s' if n != 1 else ''} longer than {MAX_MATCH_CHARS:,} bytes "
                    f"{'was' if n == 1 else 'were'} matched on {'its' if n == 1 else 'their'} first and last "
                    f"{MAX_MATCH_CHARS:,} bytes only (what lies between was not searched).\n")
    if not result.diagnoses:
        return f"ddpdoctor explain: no known DDP/NCCL/torchrun error found ({where}).\n" + windowed
    problems, notes = result.problems, result.notes
    folded = len(result.failures) - len(problems)
    if problems:
        under = "it" if len(problems) == 1 else "its cause"
        more = (f"; 1 more diagnosis is shown under {under} as a consequence" if folded == 1 else
                f"; {folded} more diagnoses are shown under {'it' if len(problems) == 1 else 'their causes'} "
                f"as consequences" if folded else "")
        head = f"ddpdoctor explain: {_plural(len(problems), 'known problem')} found ({where}); root cause first{more}."
    else:
        head = f"ddpdoctor explain: no failure found ({where}); {_plural(len(notes), 'note')} below."
    out = [head, ""]
    for i, d in enumerate(problems, 1):
        out.extend(_block(d, f"{i}."))
        out.extend(_consequences(d, result))
        out.append("")
    if notes:
        out.append("Notes (hints, not failures):")
        out.append("")
        for i, d in enumerate(notes, 1):
            out.extend(_block(d, f"n{i}."))
            out.append("")
    return "\n".join(out) + windowed
