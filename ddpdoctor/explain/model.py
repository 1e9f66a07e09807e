"""What the scan found: one bounded ``Diagnosis`` per signature, its evidence, and the result of a run.

Besides its lines, a diagnosis keeps what the ranking needs as evidence: whether any of its lines was an
error (``fatal``) rather than a warning printed on the way, and the first line on each rank (``RankEvent``:
input order, time stamp, and for an exception its type, message and the user's own frame).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.explain.knowledge import Signature

MAX_EVIDENCE = 5
MAX_EVIDENCE_CHARS = 400
MAX_RANKS = 65536  # a bound on memory per diagnosis, above the largest jobs in practice
MAX_DETAIL_VALUES = 8
MAX_DETAIL_CHARS = 200


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text}


@dataclass(frozen=True)
class RankEvent:
    """The first line of a diagnosis on one rank (or on an unknown rank): when it came, and for a Python
    exception what it was and where in the user's code (``frame``: ``path:line in function``, the innermost
    frame of its traceback outside torch, site-packages and the standard library)."""

    seq: tuple[int, int]  # (input index, line number): input order
    time: tuple[int, ...] | None
    exception: str | None = None
    message: str | None = None
    frame: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"exception": self.exception, "message": self.message, "frame": self.frame}


@dataclass
class Diagnosis:
    """Everything ddpdoctor learned about one signature across all inputs; bounded in size.

    ``caused_by``, ``first_rank`` and ``first_rank_by`` are set by the ranking (:mod:`.ranking`).
    """

    signature: Signature
    count: int = 0
    ranks: set[int] = field(default_factory=set)
    evidence: list[Evidence] = field(default_factory=list)
    details: dict[str, list[str]] = field(default_factory=dict)
    first_seq: tuple[int, int] = (0, 0)
    first_time: tuple[int, ...] | None = None
    # Any matching line was an error, not a warning or an info line printed on the way (see lines.quiet_level).
    fatal: bool = False
    rank_events: dict[int | None, RankEvent] = field(default_factory=dict)
    caused_by: str | None = None
    first_rank: int | None = None
    first_rank_by: str | None = None
    # What the diagnosis's own values say, each quoting its line (see .hints); shown with the notes.
    hints: list[str] = field(default_factory=list)
    _evidence_keys: set[tuple[int, int | None]] = field(default_factory=set)

    @property
    def id(self) -> str:
        return self.signature.id

    def add(self, ev: Evidence, rank: int | None, pattern_index: int, groups: dict[str, str],
            seq: tuple[int, int], when: tuple[int, ...] | None, fatal: bool = True,
            event: RankEvent | None = None) -> None:
        if self.count == 0:
            self.first_seq, self.first_time = seq, when
        elif when is not None and (self.first_time is None or when < self.first_time):
            # The earliest time stamp of any of its lines (one-file-per-rank logs: another rank's file may hold
            # the earlier line, whatever the order of the inputs).
            self.first_time = when
        self.count += 1
        self.fatal = self.fatal or fatal
        if rank is not None and len(self.ranks) < MAX_RANKS:
            self.ranks.add(rank)
        known = self.rank_events.get(rank)
        if known is None and len(self.rank_events) < MAX_RANKS:
            self.rank_events[rank] = event or RankEvent(seq, when)
        elif known is not None and known.exception is None and event is not None and event.exception is not None:
            # Still the first line's place and time (the ranking's), now with the exception and frame found later.
            self.rank_events[rank] = RankEvent(known.seq, known.time, event.exception, event.message, event.frame)
        # One evidence line per (pattern, rank): the report shows each kind of line and each rank once.
        key = (pattern_index, rank)
        if len(self.evidence) < MAX_EVIDENCE and key not in self._evidence_keys:
            self._evidence_keys.add(key)
            self.evidence.append(ev)
        for name, value in groups.items():
            values = self.details.setdefault(name, [])
            value = value.strip()[:MAX_DETAIL_CHARS]
            if value and value not in values and len(values) < MAX_DETAIL_VALUES:
                values.append(value)

    @property
    def notes(self) -> list[str]:
        """What the extracted details mean (the signature's ``notes`` table), in the order they were seen."""
        out: list[str] = []
        for name, table in self.signature.notes.items():
            for value in self.details.get(name, ()):
                note = table.get(value)
                if note and note not in out:
                    out.append(note)
        out.extend(h for h in self.hints if h not in out)
        return out

    @property
    def level(self) -> str:
        """``note`` (a hint), ``error`` (some line was an error) or ``warning`` (only warnings, info lines)."""
        return "note" if self.signature.is_note else "error" if self.fatal else "warning"

    @property
    def first_event(self) -> RankEvent | None:
        """The first line on the rank that failed first (see :mod:`.ranking`), else the first line of all."""
        if self.first_rank is not None and self.first_rank in self.rank_events:
            return self.rank_events[self.first_rank]
        return min(self.rank_events.values(), key=lambda e: e.seq, default=None)

    def to_json(self) -> dict[str, Any]:
        sig = self.signature
        first = self.first_event
        return {"id": sig.id, "title": sig.title, "role": sig.role, "level": self.level,
                "caused_by": self.caused_by, "ranks": sorted(self.ranks),
                "first_rank": self.first_rank, "first_rank_by": self.first_rank_by,
                "exception": first.to_json() if first is not None and first.exception else None,
                "count": self.count, "details": self.details,
                "evidence": [e.to_json() for e in self.evidence],
                "cause": sig.cause, "remedy": sig.remedy, "command": sig.command, "notes": self.notes}


@dataclass
class ExplainResult:
    diagnoses: list[Diagnosis]
    files: list[str]
    lines_scanned: int
    bytes_scanned: int
    # Lines holding a keyword that were longer than MAX_MATCH_CHARS bytes: matched on their two ends only.
    lines_windowed: int = 0

    @property
    def failures(self) -> list[Diagnosis]:
        """The diagnoses that are failures (not notes): what exit code 1 stands for."""
        return [d for d in self.diagnoses if not d.signature.is_note]

    @property
    def problems(self) -> list[Diagnosis]:
        """Failures that no other diagnosis explains: the root causes, first first."""
        return [d for d in self.failures if d.caused_by is None]

    @property
    def notes(self) -> list[Diagnosis]:
        return [d for d in self.diagnoses if d.signature.is_note]

    def to_json(self) -> dict[str, Any]:
        return {"diagnoses": [d.to_json() for d in self.diagnoses], "files": self.files,
                "lines_scanned": self.lines_scanned, "bytes_scanned": self.bytes_scanned,
                "lines_windowed": self.lines_windowed}
