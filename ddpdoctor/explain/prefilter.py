"""The prefilter: which lines of a block can hold a known message, found at C speed over the whole block.

Only the lines it admits are decoded and matched in Python; a healthy noisy log must send it (almost) none.
See ``docs/internals/explain-kb.md`` ("How the scan stays fast").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

# How often each byte that may lead an anchor occurs in a healthy, noisy log, per 10,000 bytes: measured on
# the line families of ``benchmarks/explain_throughput.py`` (glog heartbeat lines, trainer lines, NCCL INFO,
# HF-Trainer dicts, the realistic mix). Bytes not listed (lower case, digits, space, ":") are too common:
# a keyword made only of them ("NCCL error") is searched from its first byte, and a test refuses that.
LEAD_BYTE_FREQUENCY: dict[int, float] = {
    **dict.fromkeys(b"!#$&+;?@JQXZ^q~", 0.0), ord("V"): 0.4, ord("K"): 1.0, ord("B"): 3.0, ord("Y"): 3.2,
    ord("z"): 4.1, ord("x"): 7.3, ord("H"): 8.0, ord("A"): 9.7, ord("j"): 11.0, ord("%"): 11.5, ord("S"): 12.0,
    ord("W"): 13.2, ord("w"): 14.5, ord("="): 19.5, ord("T"): 24.2, ord("F"): 31.9,
    ord("v"): 35.8, ord("D"): 37.0, ord("M"): 38.5, ord("E"): 42.1,
}  # "O", "L", "G", "I", "P", "N", "C", "R", "U", "(", ")", "y" are on every NCCL / ProcessGroupNCCL line: never leads
ANCHOR_LEAD_BYTES = frozenset(LEAD_BYTE_FREQUENCY)
PREFERRED_ANCHOR_BYTES = 10
MIN_ANCHOR_BYTES = 4  # a shorter anchor ("x" + two bytes) would admit many lines
# An anchor is cut to this length: the inventory's templates give keywords of hundreds of bytes, and 16 bytes
# from a rare byte on are distinctive enough; longer anchors only make the trie deeper and its compilation slower
# (all keywords of the knowledge base and the templates: 0.22 s to compile at 16, 0.54 s at 32, on the dev VM).
MAX_ANCHOR_BYTES = 16
# The byte every chosen lead byte is folded to (see ``Prefilter``); a \x01 already in a log is a harmless hit.
FOLDED_LEAD = 1
# What follows a lead byte on every line of a healthy family, and starts no anchor: the regex turns it away right
# after the lead byte instead of walking the trie's alternatives for it (~0.1 us each: NCCL_DEBUG=INFO's "via" of
# "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC" took half of an NCCL INFO log's prefilter pass; ProcessGroupNCCL's
# "heart beat monitor thread joined."). A sequence some anchor starts with (or that starts an anchor) is left out
# by ``_build_prefilter``, so a keyword added later is never lost to it, only slower on that family.
HEALTHY_AFTER_LEAD: tuple[bytes, ...] = (b"ia ", b"oined.")


def prefilter_anchors(keywords: Iterable[str]) -> dict[str, bytes]:
    """For each keyword, the suffix of it the prefilter searches for: it starts with an anchor lead byte.

    Any line holding a keyword holds its anchor, so the prefilter never drops a line a signature could
    match. All anchors are searched in one pass (see ``Prefilter``) that enters its trie at every occurrence
    of any chosen lead byte, so each keyword is searched from its rarest usable byte (``LEAD_BYTE_FREQUENCY``);
    a growing knowledge base adds lead bytes, never passes. A keyword with no usable position keeps its
    first byte (correct, just slower if that byte is common).
    """
    leads: dict[str, dict[int, bytes]] = {}  # keyword -> usable lead byte -> longest anchor from it
    for k in set(keywords):
        kb = k.encode("utf-8")
        options: dict[int, bytes] = {}
        for i, byte in enumerate(kb):
            if byte in ANCHOR_LEAD_BYTES and len(kb) - i >= min(MIN_ANCHOR_BYTES, len(kb)) and byte not in options:
                options[byte] = kb[i:i + MAX_ANCHOR_BYTES]
        leads[k] = options or ({kb[0]: kb} if kb else {})
    chosen: dict[str, bytes] = {}
    for k, options in leads.items():
        # Anchors of at least PREFERRED_ANCHOR_BYTES where the keyword has one ("work" of "Timeout at NCCL
        # work" admitted every "workers" line); of those the rarest lead byte, then the longest anchor.
        long = {b: a for b, a in options.items() if len(a) >= PREFERRED_ANCHOR_BYTES} or options
        if long:
            best = min(long, key=lambda b: (LEAD_BYTE_FREQUENCY.get(b, 500.0), -len(long[b]), b))
            chosen[k] = long[best]
    return chosen


@dataclass(frozen=True)
class Prefilter:
    """Every anchor found in one pass over a block, whatever the number of keywords.

    ``re`` scans for a pattern's leading literal byte in a tight C loop and enters the rest of the pattern
    only where the byte occurs; one pass per distinct lead byte cost ~1 ms/MB each (the old design: six
    passes, and every new lead byte a seventh). Here the block is first folded (``bytes.translate``, one C
    pass at GB/s) so that every chosen lead byte becomes ``FOLDED_LEAD``; one regex, ``\x01`` followed by a
    trie of the folded anchors' rests, then finds every anchor in a single pass. Its cost grows with how
    often the chosen lead bytes occur in the log, not with the size of the knowledge base.
    """

    table: bytes
    regex: re.Pattern[bytes]

    def fold(self, block: bytearray, size: int) -> bytearray:
        """``block`` with every lead byte folded, at least its first ``size`` bytes (searched up to ``size``).

        A small input folds only its bytes: folding the scanner's whole 5 MB buffer for it cost 17 ms a scan
        (the tests' thousands of small scans). A full block folds the whole buffer: copying out the part in
        use first cost more than folding the unused tail (16 % of a heartbeat-log scan)."""
        return block.translate(self.table) if 2 * size >= len(block) else block[:size].translate(self.table)

    def search(self, folded: bytearray, pos: int, end: int) -> re.Match[bytes] | None:
        return self.regex.search(folded, pos, end)


def build_prefilter(keywords: Iterable[str]) -> Prefilter:
    """The ``Prefilter`` for ``keywords``: their anchors (``prefilter_anchors``) folded and put in one trie.

    Built once per set of keywords and process: every input of a run (and every scan in the tests) shares it.
    """
    return _build_prefilter(frozenset(keywords))


@cache
def _build_prefilter(keywords: frozenset[str]) -> Prefilter:
    anchors = set(prefilter_anchors(keywords).values())
    leads = bytes(sorted({a[0] for a in anchors}))
    table = bytes.maketrans(leads, bytes([FOLDED_LEAD]) * len(leads))
    rests = {a.translate(table)[1:] for a in anchors}
    if b"" in rests:  # a bare lead byte matches everything the longer keywords would
        pattern = re.escape(bytes([FOLDED_LEAD]))
    else:
        # One class test of the byte after the lead byte before the trie's alternatives: most lead bytes of a
        # healthy log are followed by a byte no anchor has there ("INFO", "CUMEM", "via" on NCCL INFO lines).
        second = b"".join(re.escape(bytes([r[0]])) for r in sorted({r[:1] for r in rests}))
        veto = [v.translate(table) for v in HEALTHY_AFTER_LEAD]
        veto = [v for v in veto if not any(r.startswith(v) or v.startswith(r) for r in rests)]
        not_healthy = b"(?!" + b"|".join(re.escape(v) for v in veto) + b")" if veto else b""
        pattern = re.escape(bytes([FOLDED_LEAD])) + b"(?=[" + second + b"])" + not_healthy + _anchor_trie(rests)
    return Prefilter(table, re.compile(pattern))


def _anchor_trie(rests: set[bytes], depth: int = 0, plain: bool = False) -> bytes:
    """A regex for any of ``rests`` whole, or for a proper prefix of one followed by the line end.

    The second form is an anchor the terminal cut: a terminal wraps a long line at its width wherever the
    width falls, also inside a keyword, and the line holding the anchor's first part must still be a hit or
    the message is lost (issue 15; ``Scanner._rejoin`` then joins the pieces). At least two bytes must follow
    the lead byte before such a cut, and one of the bytes so far must be an ordinary one (``plain``): a bare
    capital at a line end is everywhere (NCCL's ``Init COMPLETE`` made ten times the hits on a noisy log), and
    with lead bytes folded together (``Prefilter``) the ``ETE`` of ``COMPLETE`` is three lead bytes in a row,
    which the many anchors of the inventory's templates (``EADDRINUSE``, ``MPI_``...) start with too.
    """
    children: dict[int, set[bytes]] = {}
    for rest in rests:
        children.setdefault(rest[0], set()).add(rest[1:])
    # A rest that ends at a child is matched whole there; longer rests through it contain it.
    branches = [re.escape(bytes([byte])) + (b"" if b"" in tails else _anchor_trie(
        tails, depth=depth + 1, plain=plain or byte != FOLDED_LEAD)) for byte, tails in sorted(children.items())]
    if depth >= 2 and plain:
        branches.append(rb"\r\n|\n")
    return b"(?:" + b"|".join(branches) + b")"
