"""One cause, one finding: which finding explains which, and the folding of consequences under their cause.

A wrong ``NCCL_SOCKET_IFNAME`` makes the ``env`` check fail, the ``gpu`` check's preflight say the same,
and ``init_process_group`` fail, which skips every check that needs the process group. Reported flat,
that is three failures with three remedies for one mistake. Here each rule of :data:`RULES` names a cause
(a check id and the ``details["kind"]`` of its finding) and the findings it explains; :func:`fold` marks
every explained finding with ``caused_by`` (the cause's check, summary and the rule), and the report
puts it right under its cause, without a remedy of its own (design.md, "Rank 0 renders").

A rule may be limited to backends: a wrong ``GLOO_SOCKET_IFNAME`` explains nothing on NCCL. A finding is
folded under the first cause present, in report order (root cause first); a finding that is itself
folded explains nothing further, so chains end at one root. Pure: tested with recorded findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddpdoctor.findings import ERROR, FAIL, SKIP, WARN, Finding

# Kinds the runtime gives its own findings (``runner.py``): what happens to the process group under test.
PG_INIT_FAILED = "pg_init_failed"
PG_UNUSABLE = "pg_unusable"
CHECK_TIMEOUT = "check_timeout"
CHECK_RAISED = "check_raised"
COLLECTIVE_FAILED = "collective_failed"
NEVER_JOINED = "never_joined"
WENT_SILENT = "went_silent"

ANY_CHECK = "*"
BROKEN = frozenset({FAIL, ERROR})


@dataclass(frozen=True)
class Match:
    """Which findings a rule side covers: a check id (or ``*``), statuses, and kinds (empty: any kind)."""

    check: str
    statuses: frozenset[str] = BROKEN
    kinds: frozenset[str] = frozenset()

    def matches(self, finding: Finding) -> bool:
        return ((self.check == ANY_CHECK or finding.check == self.check) and finding.status in self.statuses
                and (not self.kinds or finding.kind in self.kinds))


@dataclass(frozen=True)
class Rule:
    """``cause`` explains every finding matched by one of ``explains`` (on the ``backends`` named)."""

    name: str
    cause: Match
    explains: tuple[Match, ...]
    backends: frozenset[str] = frozenset()  # empty: any backend

    def applies(self, backend: str) -> bool:
        return not self.backends or backend in self.backends


# What a process group that could not be formed or broke mid-run does to the checks that use it: the
# init failure (a runtime finding under ``connectivity``), a collective that failed or hung, and the
# checks skipped because the group was unusable. Measurements that finished (bandwidth below
# --min-busbw) are the checks' own results and are never folded.
PROCESS_GROUP_FAILURES: tuple[Match, ...] = (
    Match("connectivity", BROKEN | {SKIP}),
    Match(ANY_CHECK, frozenset({SKIP}), frozenset({PG_UNUSABLE})),
    Match(ANY_CHECK, BROKEN, frozenset({PG_INIT_FAILED, CHECK_TIMEOUT, CHECK_RAISED, COLLECTIVE_FAILED})),
)

_NCCL = frozenset({"nccl"})
_GLOO = frozenset({"gloo"})

# A GPU measurement (pcie_bandwidth, memory_bandwidth) that came out low while other ranks of this job or
# other processes used the GPU: a consequence of the sharing, warned about (checks/pcie_bandwidth.py).
_SHARED_BY_RANKS = tuple(Match(check, frozenset({WARN}), frozenset({"shared_gpu"}))
                         for check in ("pcie_bandwidth", "memory_bandwidth"))
_SHARED_BY_OTHERS = tuple(Match(check, frozenset({WARN}), frozenset({"other_processes"}))
                          for check in ("pcie_bandwidth", "memory_bandwidth"))

RULES: tuple[Rule, ...] = (
    # The same fact said twice: the gpu check's preflight also reads NCCL_SOCKET_IFNAME.
    Rule("nccl_socket_ifname_said_twice", Match("env", kinds=frozenset({"nccl_socket_ifname"})),
         (Match("gpu", BROKEN | {WARN}, frozenset({"nccl_socket_ifname"})),)),
    # NCCL finds no interface to bootstrap on ("Bootstrap : no socket interface found"): init fails.
    Rule("nccl_socket_ifname", Match("env", kinds=frozenset({"nccl_socket_ifname"})), PROCESS_GROUP_FAILURES,
         _NCCL),
    Rule("nccl_socket_ifname_preflight", Match("gpu", kinds=frozenset({"nccl_socket_ifname"})),
         PROCESS_GROUP_FAILURES, _NCCL),
    # gloo cannot make a device for a missing interface: init_process_group raises on that rank, the
    # others wait for it.
    Rule("gloo_socket_ifname", Match("env", kinds=frozenset({"gloo_socket_ifname"})), PROCESS_GROUP_FAILURES,
         _GLOO),
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected", ncclInvalidUsage); a rank on the
    # wrong device is the same forgotten set_device.
    Rule("duplicate_gpu", Match("gpu", kinds=frozenset({"duplicate_gpu"})),
         (*PROCESS_GROUP_FAILURES, Match("gpu", kinds=frozenset({"wrong_device"})), *_SHARED_BY_RANKS), _NCCL),
    Rule("more_ranks_than_gpus", Match("gpu", kinds=frozenset({"more_ranks_than_gpus"})),
         (*PROCESS_GROUP_FAILURES, *_SHARED_BY_RANKS), _NCCL),
    # Another process on the GPU (a leftover job, a notebook) slows the copies measured on it.
    Rule("other_processes", Match("gpu", frozenset({WARN}), frozenset({"other_processes"})), _SHARED_BY_OTHERS),
    Rule("ranks_without_gpu", Match("gpu", kinds=frozenset({"ranks_without_gpu"})), PROCESS_GROUP_FAILURES,
         _NCCL),
    # --backend nccl on a host without a GPU: no process group at all on that rank.
    Rule("backend_unusable", Match("connectivity", kinds=frozenset({"backend_unusable"})), PROCESS_GROUP_FAILURES),
    # A rank that never joined or went silent leaves the others without a process group, or stuck in
    # the collective it never entered.
    Rule("rank_missing", Match("barrier", kinds=frozenset({NEVER_JOINED, WENT_SILENT})), PROCESS_GROUP_FAILURES),
)


def fold(findings: Sequence[Finding], backend: str, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Mark every finding a present cause explains (``caused_by``); returns the findings, same order.

    ``findings`` should be in report order (root cause first): the first unfolded cause of a rule wins.
    """
    active = [rule for rule in rules if rule.applies(backend)]
    parent: dict[int, tuple[int, str]] = {}  # index -> (index of its cause, rule name)

    def root(index: int) -> int:
        seen = set()
        while index in parent and index not in seen:
            seen.add(index)
            index = parent[index][0]
        return index

    for i, finding in enumerate(findings):
        if finding.caused_by is not None:  # folded before (a report loaded from JSON)
            continue
        for rule in active:
            if not any(m.matches(finding) for m in rule.explains):
                continue
            found = next((j for j, c in enumerate(findings)
                          if j != i and j not in parent and rule.cause.matches(c) and root(j) != i), None)
            if found is not None:
                parent[i] = (found, rule.name)
                break
    for i, (j, rule_name) in parent.items():
        top = root(j)
        if top == i:  # a cycle cannot happen with the rules above; never fold a finding under itself
            continue
        cause = findings[top]
        findings[i].caused_by = {"check": cause.check, "summary": cause.summary, "rule": rule_name}
    return list(findings)


def cause_of(finding: Finding, findings: Sequence[Finding]) -> Finding | None:
    """The finding ``finding.caused_by`` names, among ``findings`` (None for a root or a lost cause)."""
    if finding.caused_by is None:
        return None
    return next((f for f in findings if f is not finding and f.caused_by is None
                 and f.check == finding.caused_by.get("check") and f.summary == finding.caused_by.get("summary")),
                None)
