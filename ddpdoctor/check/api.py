"""What a check is: a pure unit that runs on every rank and returns findings.

A check never calls ``init_process_group``, never prints and never exits: the runtime gives it a
:class:`CheckContext` (who this rank is, the process group under test, the control-plane store, the
options) and turns an exception or an overrun of its deadline into an ``error`` finding. When findings
must be compared across ranks (env vars, GPU UUIDs), the check also provides ``combine``, which rank 0
calls with every rank's findings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.findings import Finding, RankInfo


@dataclass(frozen=True)
class CheckOptions:
    """The user's options that checks read (every rank builds the same from the same command line)."""

    timeout_s: float = 30.0
    checkpoint: str | None = None
    model: str | None = None
    batch: str | None = None
    input_shape: tuple[int, ...] | None = None
    min_busbw_gbps: float | None = None
    # bandwidth: FAIL / WARN below these percentages of the path's expected busbw (bench.expect).
    min_busbw_pct: float = 50.0
    warn_busbw_pct: float = 80.0
    verbose: bool = False


@dataclass
class CheckContext:
    """Everything a check may use on one rank."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host: str
    pid: int
    launcher: str
    backend: str
    device: str
    master_addr: str
    master_port: int
    # The process group under test (the default group), or None when it could not be initialised.
    process_group: Any
    # A c10d store private to this check (a PrefixStore on the control plane): for exchanging data
    # between ranks without trusting the process group under test.
    store: Any
    options: CheckOptions
    deadline: float = field(default_factory=lambda: time.monotonic() + 30.0)
    # Every rank that joined: rank -> host, local rank, pid (to name ranks in findings).
    peers: Mapping[int, RankInfo] = field(default_factory=dict)
    # When the user's command started (wall clock, ``ddpdoctor.runtime.clock``): "during this run" begins.
    started_epoch: float | None = None

    def remaining_s(self) -> float:
        """Seconds left before the runtime abandons this check."""
        return max(0.0, self.deadline - time.monotonic())

    def finding(self, status: str, summary: str, remedy: str = "", **details: Any) -> Finding:
        """A finding on this rank for the check that is running (the runtime fills in the id)."""
        return Finding(check="", status=status, summary=summary, ranks=[self.rank], remedy=remedy,
                       details=dict(details))


RunFn = Callable[[CheckContext], list[Finding]]
CombineFn = Callable[[Mapping[int, list[Finding]], Mapping[int, RankInfo]], list[Finding]]


@dataclass(frozen=True)
class Check:
    """A check's identity and entry points; each file in ``checks/`` defines one as ``CHECK``."""

    id: str
    title: str
    run: RunFn
    # Rank 0 merges every rank's findings with this; None means "collapse identical findings".
    combine: CombineFn | None = None
    # Needs the process group under test; skipped when it is not usable.
    needs_process_group: bool = False
    # Runs only on rank 0 (e.g. reading a checkpoint once).
    rank0_only: bool = False


def collapse(findings: list[Finding]) -> list[Finding]:
    """Merge findings that say the same thing (status, summary, remedy) into one listing all their ranks.

    Details that differ between ranks are kept per rank under ``details["per_rank"]``.
    """
    merged: dict[tuple[str, str, str, str], list[Finding]] = {}
    for finding in findings:
        merged.setdefault((finding.check, finding.status, finding.summary, finding.remedy), []).append(finding)
    result: list[Finding] = []
    for (check, status, summary, remedy), group in merged.items():
        ranks = sorted({r for f in group for r in f.ranks})
        detail_sets = [f.details for f in group]
        if all(d == detail_sets[0] for d in detail_sets):
            details = dict(detail_sets[0])
        else:
            details = {"per_rank": {str(r): f.details for f in group for r in f.ranks}}
            kinds = {f.kind for f in group}
            if len(kinds) == 1 and "" not in kinds:  # what the finding is about survives the merge
                details["kind"] = kinds.pop()
        result.append(Finding(check, status, summary, ranks, remedy, details))
    return result


def all_findings(findings_by_rank: Mapping[int, list[Finding]]) -> list[Finding]:
    """Every rank's findings in rank order: the input most ``combine`` functions start from."""
    return [f for rank in sorted(findings_by_rank) for f in findings_by_rank[rank]]
