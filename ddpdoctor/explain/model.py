"""What the scan found: one bounded ``Diagnosis`` per signature, its evidence, and the result of a run."""

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


@dataclass
class Diagnosis:
    """Everything ddpdoctor learned about one signature across all inputs; bounded in size."""

    signature: Signature
    count: int = 0
    ranks: set[int] = field(default_factory=set)
    evidence: list[Evidence] = field(default_factory=list)
    details: dict[str, list[str]] = field(default_factory=dict)
    first_seq: tuple[int, int] = (0, 0)
    first_time: tuple[int, ...] | None = None
    _evidence_keys: set[tuple[int, int | None]] = field(default_factory=set)

    @property
    def id(self) -> str:
        return self.signature.id

    def add(self, ev: Evidence, rank: int | None, pattern_index: int, groups: dict[str, str],
            seq: tuple[int, int], when: tuple[int, ...] | None) -> None:
        if self.count == 0:
            self.first_seq, self.first_time = seq, when
        self.count += 1
        if rank is not None and len(self.ranks) < MAX_RANKS:
            self.ranks.add(rank)
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
        return out

    def to_json(self) -> dict[str, Any]:
        sig = self.signature
        return {"id": sig.id, "title": sig.title, "role": sig.role, "ranks": sorted(self.ranks),
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

    def to_json(self) -> dict[str, Any]:
        return {"diagnoses": [d.to_json() for d in self.diagnoses], "files": self.files,
                "lines_scanned": self.lines_scanned, "bytes_scanned": self.bytes_scanned,
                "lines_windowed": self.lines_windowed}
