"""What rank 0 knows at the end of a ``check`` run, and its JSON contract (design.md, "Contracts").

Root cause first: ranks that never reported and failures come before warnings and passes, in the order the
checks ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpdoctor import __version__
from ddpdoctor.check.causes import cause_of, fold
from ddpdoctor.findings import ERROR, FAIL, PASS, SKIP, WARN, Finding, RankInfo, overall_status
from ddpdoctor.runtime.hosts import ranks_by_host

# Failures first (they are what the user came for), then warnings, passes, and skips last.
_DISPLAY_ORDER = {FAIL: 0, ERROR: 0, WARN: 1, PASS: 2, SKIP: 3}
MAX_TAGGED = 4


@dataclass
class Report:
    """Everything rank 0 knows at the end of a run."""

    world_size: int
    backend: str
    launcher: str
    ranks: list[RankInfo]
    findings: list[Finding]
    check_order: list[str] = field(default_factory=list)
    # Rank 0's own run, from its start to the report.
    elapsed_s: float = 0.0
    # Seconds per phase (connect, rendezvous, init_process_group, check:<id>, collect), slowest rank's.
    phases_s: dict[str, float] = field(default_factory=dict)
    # What the user waited: from the command they typed (``runtime.clock``) to the report; 0 when unknown.
    wall_s: float = 0.0

    @property
    def checks_s(self) -> float:
        """Seconds the checks themselves took (each check's slowest rank), the rest being start-up and waits."""
        return sum(v for k, v in self.phases_s.items() if k.startswith("check:"))

    @property
    def status(self) -> str:
        """pass|warn|fail, or skip when every finding is a skip: nothing was checked, which is no pass."""
        if self.findings and all(f.status == SKIP for f in self.findings):
            return SKIP
        return overall_status(self.findings)

    def _sorted(self) -> list[Finding]:
        """Unreported ranks, then failures by check order, then warnings, passes and skips."""
        order = {check: i for i, check in enumerate(self.check_order)}

        def key(item: tuple[int, Finding]) -> tuple[int, int, int, int]:
            index, finding = item
            unreported = 0 if finding.details.get("unreported") else 1
            return (_DISPLAY_ORDER[finding.status], unreported, order.get(finding.check, len(order)), index)

        return [f for _, f in sorted(enumerate(self.findings), key=key)]

    def fold(self) -> Report:
        """Mark the findings another finding explains (``caused_by``, see :mod:`ddpdoctor.check.causes`)."""
        fold(self._sorted(), self.backend)
        return self

    def ordered(self) -> list[Finding]:
        """Root cause first: unreported ranks, then failures by check order, then the rest; each finding
        another one explains comes right after its cause."""
        flat = self._sorted()
        causes = {id(f): cause_of(f, flat) for f in flat if f.caused_by is not None}
        out: list[Finding] = []
        for finding in flat:
            if causes.get(id(finding)) is not None:
                continue
            out.append(finding)
            out.extend(f for f in flat if causes.get(id(f)) is finding)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": "ddpdoctor",
            "version": __version__,
            "status": self.status,
            "world_size": self.world_size,
            "backend": self.backend,
            "launcher": self.launcher,
            "elapsed_s": round(self.elapsed_s, 3),
            "wall_s": round(self.wall_s, 3),
            "checks_s": round(self.checks_s, 3),
            "phases_s": dict(self.phases_s),
            "ranks": [r.to_json() for r in sorted(self.ranks, key=lambda r: r.rank)],
            # host -> its ranks, as the report's "hosts:" line says it (ddpdoctor.runtime.hosts)
            "hosts": ranks_by_host((r.rank, r.host) for r in self.ranks),
            "findings": _findings_json(self.ordered()),
        }


def _findings_json(ordered: list[Finding]) -> list[dict[str, Any]]:
    """The findings in report order; ``caused_by`` also gives the index of the cause in this list."""
    index = {id(f): i for i, f in enumerate(ordered)}
    out = []
    for finding in ordered:
        data = finding.to_json()
        cause = cause_of(finding, ordered)
        data["caused_by"] = ({**data["caused_by"], "index": index[id(cause)]}
                             if data.get("caused_by") is not None and cause is not None else None)
        out.append(data)
    return out
