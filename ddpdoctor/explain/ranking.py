"""Root cause first: the order of the diagnoses, by evidence."""

from __future__ import annotations

from ddpdoctor.explain.knowledge import ROLE_ORDER
from ddpdoctor.explain.model import Diagnosis


def order_diagnoses(found: dict[str, Diagnosis], distributed: bool) -> list[Diagnosis]:
    diags = [d for d in found.values() if not any(s in found for s in d.signature.suppressed_by)
             and (distributed or not d.signature.needs_distributed)]
    ordered: list[Diagnosis] = []
    for role in ROLE_ORDER:
        group = [d for d in diags if d.signature.role == role]
        # Timestamps order lines across files (rank0.log vs rank1.log) when every diagnosis has one;
        # otherwise input order (file, then line) is the best evidence of what came first.
        times = [d.first_time for d in group]
        if group and all(t is not None for t in times):
            group.sort(key=lambda d: (-d.signature.precedence, d.first_time, d.first_seq))
        else:
            group.sort(key=lambda d: (-d.signature.precedence, d.first_seq))
        ordered.extend(group)
    return ordered
