"""The prefilter: which lines of a block can hold a known message, found at C speed over the whole block.

Only the lines it admits are decoded and matched in Python; a healthy noisy log must send it (almost) none.
See ``docs/internals/explain-kb.md`` ("How the scan stays fast").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Bytes a prefilter regex may start with. ``re`` scans for a pattern's leading literal byte in a tight C
# loop, at 1.5-3 GB/s here when the byte is as rare as a capital letter, but at under 300 MB/s for a byte
# as common as "e" or " " (it enters the matcher at every occurrence); a character-class start ("[xEN]")
# or one alternation of all keywords falls below 100 MB/s. So every keyword is searched from one of these
# bytes, and few distinct ones are used: each costs one pass over the block.
ANCHOR_LEAD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZjqxz")
MIN_ANCHOR_BYTES = 8  # an anchor shorter than this ("Error" of "OutOfMemoryError") would admit many lines


def prefilter_anchors(keywords: Iterable[str]) -> dict[str, bytes]:
    """For each keyword, the suffix of it the prefilter searches for: it starts with an anchor lead byte.

    Any line holding a keyword holds its anchor, so the prefilter never drops a line a signature could
    match. The lead bytes are chosen greedily, the one usable by most keywords first, so that few passes
    cover every keyword; each keyword then uses its longest suffix starting with its chosen byte. A keyword
    with no usable position keeps its first byte (correct, just slower if that byte is common).
    """
    leads: dict[str, dict[int, bytes]] = {}  # keyword -> usable lead byte -> longest anchor from it
    for k in set(keywords):
        kb = k.encode("utf-8")
        options: dict[int, bytes] = {}
        for i, byte in enumerate(kb):
            if byte in ANCHOR_LEAD_BYTES and len(kb) - i >= min(MIN_ANCHOR_BYTES, len(kb)) and byte not in options:
                options[byte] = kb[i:]
        leads[k] = options or ({kb[0]: kb} if kb else {})
    chosen: dict[str, bytes] = {}
    todo = {k for k, options in leads.items() if options}
    while todo:
        counts: dict[int, int] = {}
        for k in todo:
            for byte in leads[k]:
                counts[byte] = counts.get(byte, 0) + 1
        best = max(sorted(counts), key=lambda b: counts[b])
        for k in [k for k in todo if best in leads[k]]:
            chosen[k] = leads[k][best]
            todo.discard(k)
    return chosen


def build_prefilter(keywords: Iterable[str]) -> list[re.Pattern[bytes]]:
    """One regex per anchor lead byte: ``x(?:pected to (?:have finished reduction|mark ...)|itcode|...)``.

    ``re`` finds the leading literal byte in a tight C loop and tries the rest only there; one pass per
    distinct lead byte (see ``prefilter_anchors`` for how few there are). The rest is a trie (one branch per
    distinct next byte, see ``_anchor_trie``): a lead byte followed by ordinary text fails at its first byte.
    """
    groups: dict[bytes, set[bytes]] = {}
    for anchor in prefilter_anchors(keywords).values():
        groups.setdefault(anchor[:1], set()).add(anchor[1:])
    out = []
    for lead, rests in sorted(groups.items()):
        if b"" in rests:  # the bare lead byte matches everything the longer keywords would
            out.append(re.compile(re.escape(lead)))
        else:
            out.append(re.compile(re.escape(lead) + _anchor_trie(rests, root=True)))
    return out


def _anchor_trie(rests: set[bytes], root: bool = False) -> bytes:
    """A regex for any of ``rests`` whole, or for a proper prefix of one followed by the line end.

    The second form is an anchor the terminal cut: a terminal wraps a long line at its width wherever the
    width falls, also inside a keyword, and the line holding the anchor's first part must still be a hit or
    the message is lost (issue 15; ``Scanner._rejoin`` then joins the pieces). At least one byte must follow
    the lead byte before such a cut: a bare capital at a line end is everywhere (NCCL's ``Init COMPLETE``
    made ten times the hits on a noisy log).
    """
    children: dict[int, set[bytes]] = {}
    for rest in rests:
        children.setdefault(rest[0], set()).add(rest[1:])
    # A rest that ends at a child is matched whole there; longer rests through it contain it.
    branches = [re.escape(bytes([byte])) + (b"" if b"" in tails else _anchor_trie(tails))
                for byte, tails in sorted(children.items())]
    if not root:
        branches.append(rb"\r\n|\n")
    return b"(?:" + b"|".join(branches) + b")"
