"""What rank 0 knows at the end of a ``check`` run, and its JSON contract (design.md, "Contracts").

Root cause first: ranks that never reported and failures come before warnings and passes, in the order the
checks ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpdoctor import __version__
from ddpdoctor.findings import ERROR, FAIL, PASS, SKIP, WARN, Finding, RankInfo, overall_status

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
    elapsed_s: float = 0.0
    # Seconds per phase (connect, rendezvous, init_process_group, check:<id>, collect), slowest rank's.
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return overall_status(self.findings)

    def ordered(self) -> list[Finding]:
        """Root cause first: unreported ranks, then failures by check order, then the rest."""
        order = {check: i for i, check in enumerate(self.check_order)}

        def key(item: tuple[int, Finding]) -> tuple[int, int, int, int]:
            index, finding = item
            unreported = 0 if finding.details.get("unreported") else 1
            return (_DISPLAY_ORDER[finding.status], unreported, order.get(finding.check, len(order)), index)

        return [f for _, f in sorted(enumerate(self.findings), key=key)]

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": "ddpdoctor",
            "version": __version__,
            "status": self.status,
            "world_size": self.world_size,
            "backend": self.backend,
            "launcher": self.launcher,
            "elapsed_s": round(self.elapsed_s, 3),
            "phases_s": dict(self.phases_s),
            "ranks": [r.to_json() for r in sorted(self.ranks, key=lambda r: r.rank)],
            "findings": [f.to_json() for f in self.ordered()],
        }
