"""The data every check produces and the report renders: findings and rank identities.

Plain dataclasses with ``to_json``/``from_json`` so they travel through the c10d store as JSON between
ranks, and so rendering can be tested without processes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS = "pass"
WARN = "warn"
FAIL = "fail"
SKIP = "skip"
ERROR = "error"

STATUSES = (PASS, WARN, FAIL, SKIP, ERROR)

# Order used to pick the overall status and to sort: worst first.
SEVERITY = {ERROR: 4, FAIL: 3, WARN: 2, SKIP: 1, PASS: 0}


@dataclass
class Finding:
    """One outcome of one check, on the ranks listed."""

    check: str
    status: str
    summary: str
    ranks: list[int] = field(default_factory=list)
    remedy: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    # Set on rank 0 when another finding explains this one (design.md, "one cause, one finding"): the
    # cause's check, summary and the rule that linked them (``ddpdoctor.check.causes``); None on a root.
    caused_by: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got: {self.status!r}")

    def to_json(self) -> dict[str, Any]:
        """The finding as JSON; ``caused_by`` only when set (``check``'s report writes it on every finding)."""
        data = asdict(self)
        if data["caused_by"] is None:
            del data["caused_by"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(
            check=str(data["check"]),
            status=str(data["status"]),
            summary=str(data["summary"]),
            ranks=[int(r) for r in data.get("ranks", [])],
            remedy=str(data.get("remedy", "")),
            details=dict(data.get("details", {})),
            caused_by=dict(data["caused_by"]) if isinstance(data.get("caused_by"), dict) else None,
        )

    @property
    def kind(self) -> str:
        """What this finding is about, machine-readably (``details["kind"]``): causal rules match on it."""
        return str(self.details.get("kind", ""))


@dataclass(frozen=True)
class RankInfo:
    """Who a rank is: enough to find it on the cluster (host and pid)."""

    rank: int
    local_rank: int
    host: str
    pid: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankInfo:
        return cls(
            rank=int(data["rank"]),
            local_rank=int(data.get("local_rank", -1)),
            host=str(data.get("host", "?")),
            pid=int(data.get("pid", -1)),
        )

    @property
    def tag(self) -> str:
        return f"[{self.host}:{self.local_rank}]"


def overall_status(findings: list[Finding]) -> str:
    """pass|warn|fail for the whole report; an error counts as a failure."""
    worst = max((SEVERITY[f.status] for f in findings), default=0)
    if worst >= SEVERITY[FAIL]:
        return FAIL
    if worst == SEVERITY[WARN]:
        return WARN
    return PASS
