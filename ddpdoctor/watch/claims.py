"""Pure readings of what the ranks report, decided before any hang: contradicting ``init_process_group`` claims
(``claim_conflict``: a verdict at once, before the rendezvous fails on them) and the rank every other rank waits
for each step (``straggler``: a warning while the job runs)."""

from __future__ import annotations

import statistics
from typing import Any

# Straggler: every other rank waits at least this much longer per step (median of the last steps) than it.
STRAGGLER_MIN_US = 5000.0
STRAGGLER_MIN_SHARE = 0.15
STRAGGLER_MIN_STEPS = 8
STRAGGLER_CONFIRM = 3  # consecutive checks (one a second) before it is named while the job runs


def claim_conflict(claims: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first contradiction between init_process_group claims, or None.

    Each is fatal in torch, but late and misleading: a second process claiming rank 0 dies of
    ``EADDRINUSE`` when it tries to host the store on MASTER_PORT (it looks like a busy port), other
    contradictions wait in the rendezvous until its timeout (30 minutes by default).
    """
    def where(claim: dict[str, Any]) -> str:
        return f"pid {claim.get('pid')} at {claim.get('site')}"

    for claim in claims:
        rank, world = claim.get("rank"), claim.get("world_size")
        if rank is not None and world is not None and not 0 <= rank < world:
            return {"kind": "rank_outside_world", "claims": [claim],
                    "summary": f"rank {rank} is outside a world of {world} ranks ({where(claim)})",
                    "remedy": "ranks run from 0 to world_size-1: pass the process index as rank"}
    by_rank: dict[int, dict[str, Any]] = {}
    for claim in claims:
        rank = claim.get("rank")
        if rank is None:
            continue
        first = by_rank.setdefault(rank, claim)
        if first is not claim and first.get("pid") != claim.get("pid"):
            return {"kind": "duplicate_rank", "claims": [first, claim],
                    "summary": f"two processes claim rank {rank}: {where(first)} and {where(claim)}",
                    "remedy": "each process must pass its own rank to init_process_group (with mp.spawn: the "
                              "process index the function receives first), not a constant"}
    for key, label in (("world_size", "world sizes"), ("backend", "backends")):
        seen: dict[Any, dict[str, Any]] = {}
        for claim in claims:
            value = claim.get(key)
            if value is None or value == "default":
                continue
            seen.setdefault(value, claim)
        if len(seen) > 1:
            (a, first), (b, second) = list(seen.items())[:2]
            return {"kind": f"different_{key}", "claims": [first, second],
                    "summary": f"the processes disagree on {label}: {a} ({where(first)}) and {b} ({where(second)})",
                    "remedy": f"pass the same {key} to init_process_group on every process"}
    return None


def straggler(stats: dict[int, dict[str, Any] | None]) -> dict[str, Any] | None:
    """The rank every other rank waits for, from the ranks' per-step medians; None when there is none.

    A chronically late rank spends the least time in collectives (the others are already there) and
    every other rank waits about as long as it is late. Medians over the last steps make one slow step
    (a checkpoint, a cold cache) irrelevant.
    """
    usable = {r: s for r, s in stats.items() if s and s.get("window", 0) >= STRAGGLER_MIN_STEPS}
    if len(usable) < 2 or len(usable) < len(stats):
        return None
    slow = min(usable, key=lambda r: (usable[r]["wait_us"], r))
    excess = [usable[r]["wait_us"] - usable[slow]["wait_us"] for r in usable if r != slow]
    step_us = statistics.median(s["step_us"] for s in usable.values())
    if step_us <= 0 or min(excess) < max(STRAGGLER_MIN_US, STRAGGLER_MIN_SHARE * step_us):
        return None
    wait_us = statistics.median(excess)
    share = wait_us / step_us
    return {"rank": slow, "wait_us": round(wait_us, 1), "step_us": round(step_us, 1), "share": round(share, 3),
            "summary": f"rank {slow} is the straggler: the others wait {wait_us / 1000:.0f} ms per step for it "
                       f"({100 * share:.0f} % of the step)",
            "remedy": f"look at what rank {slow} does alone each step (its data shard or loader, a slower "
                      "host or GPU, extra logging or checkpointing on that rank)"}
