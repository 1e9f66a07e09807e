"""The one way every command writes a list of ranks: ``0-3,5`` (runs of consecutive ranks become ranges)."""

from __future__ import annotations

from collections.abc import Iterable


def format_rank_list(ranks: Iterable[int]) -> str:
    """0,1,2,3,5 -> '0-3,5'; duplicates and order do not matter."""
    parts: list[str] = []
    start = prev = None
    for rank in sorted(set(ranks)):
        if start is not None and prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if start != prev else f"{start}")
        start = prev = rank
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(parts)


def rank_phrase(ranks: Iterable[int]) -> str:
    """'rank 3' or 'ranks 0-3,6': a rank list as it reads in a sentence."""
    ordered = sorted(set(ranks))
    return ("rank " if len(ordered) == 1 else "ranks ") + format_rank_list(ordered)
