"""The streaming scanner: every input read in fixed-size blocks, keyword lines matched against the signatures.

A crashed job leaves thousands of lines from many ranks; the real cause is one of a few hundred known
messages. The scanner streams the input in fixed-size blocks, so memory stays flat for a 100 GB log:

* prefilter (:mod:`.prefilter`): the signatures' keywords are searched over a whole block at C speed, so a
  healthy but noisy log sends almost no line to the matcher;
* only lines holding a keyword are decoded (``errors="replace"``: binary garbage never crashes it) and
  run through the regexes of the signatures whose keywords they contain; the first matching signature wins;
* each diagnosis keeps bounded state (:mod:`.model`);
* no regex is ever handed more than ``MAX_MATCH_CHARS`` characters: a longer line is matched on its first
  and last ``MAX_MATCH_CHARS`` bytes only, and the report says so (issue 20: this bound is what keeps the
  scan linear on any input);
* a message the terminal wrapped over several lines is matched rejoined (see ``Scanner._rejoin``);
* besides the diagnoses it keeps what the ranking weighs as evidence (:class:`.ranking.Facts`): whether
  each line was an error or only a warning (``lines.quiet_level``), each diagnosis's first line per rank
  with its time and, for an exception, its type, message and the user's own frame; the rank torchrun's
  failure summary calls the first observed failure; and where each input ends (:mod:`.phases`: inside a
  rendezvous, the store barrier, NCCL's init, with nothing after it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import partial
from typing import IO, Any

from ddpdoctor.explain.frames import cut_traceback
from ddpdoctor.explain.hints import TIMEOUT_IDS, add_hints, last_progress_lines
from ddpdoctor.explain.knowledge import Signature, load_kb, prefilter_keyword
from ddpdoctor.explain.lines import (
    DIST_CONTEXT,
    EXCEPTION_LINE,
    GLUED_EXCEPTION,
    LINE_PREFIX_RANK,
    MAX_GLUED_NAME_CHARS,
    MIN_WRAP_CHARS,
    MIN_WRAPPED_LINES,
    NCCL_RANK,
    PG_RANK,
    SEVERAL_WRITERS,
    SIGTERM_LIKE,
    SPAWN_HEADER,
    SRUN_LABEL,
    SUMMARY_ENTRY,
    SUMMARY_RANK,
    SUMMARY_TIME,
    embedded_lines,
    from_the_web,
    has_dist_sign,
    interleaved_tracebacks,
    newlines,
    one_writer,
    quiet_level,
    rank_int,
    signal_name,
    strip_paste,
    terminal_unwrapped,
    timestamp,
    unflatten,
    user_frame,
    wraps_onto,
)
from ddpdoctor.explain.model import (
    MAX_DETAIL_CHARS,
    MAX_EVIDENCE_CHARS,
    Diagnosis,
    Evidence,
    ExplainResult,
    RankEvent,
)
from ddpdoctor.explain.native import verbs_crash
from ddpdoctor.explain.phases import TAIL_BYTES, where_input_ends
from ddpdoctor.explain.prefilter import build_prefilter, prefilter_anchors
from ddpdoctor.explain.ranking import Facts, order_diagnoses
from ddpdoctor.explain.sources import (
    MAX_RAISE_LINES,
    RAISE_KEYWORDS,
    RAISE_START,
    REPR_KEYWORDS,
    raise_message,
    repr_type_known,
)
from ddpdoctor.explain.templates import Template, matcher_for

CHUNK_BYTES = 4 << 20  # read size: large enough for C-speed scans, small enough for flat memory
MAX_LINE_BYTES = 1 << 20  # a "line" longer than this (binary data, no newlines) is scanned as it is
# How much of an input's start is searched for a sign of a distributed job (lines.has_dist_sign): its ~35 literals
# are each searched to the end of what is given, and over a whole 4 MB first block with none of them (a trainer's
# log) that was 80-90 ms, a seventh of a 200 MB scan; start-up lines are in the first MiB.
DIST_SIGN_BYTES = 1 << 20
# A cut last line that a terminal wrapped (Scanner._match_cut_line): the lines above it looked at for the terminal's
# width, and how many pieces a message is rejoined from.
WRAP_PROBE_LINES = 64
WRAP_PROBE_BYTES = 64 * 1024
MAX_CUT_WRAP_PIECES = 4
# The most characters any regex is handed at once (a line, a window of a longer line, or a rejoined wrapped
# line); see the module docstring. Real error lines are far shorter; only what they match is needed.
MAX_MATCH_CHARS = 4096
# Terminal-wrapped lines (issue 15): a line at least MIN_WRAP_CHARS long may continue on up to this many lines.
MAX_CONTINUATION_LINES = 3
MAX_FIRST_BLOCK_HITS = 16  # lines per literal of a first_block signature (one per rank and communicator)
MAX_BACKWARD_LINES = 2  # the pieces before the keyword's: the message's start, its "[rank3]:" or "[Rank 3]"

LOOKBACK_LINES = 10  # torchrun's failure summary: the "rank :" line sits a few lines above "exitcode :"
TRACEBACK_LOOKBACK_LINES = 60  # a Python traceback: its header sits above every frame of the stack
BLOCK_RANK_FIRST_LINES = 6  # what Scanner._block_rank reads first: most walks end on the line above

def _line_end(block: bytearray, start: int, size: int) -> int:
    end = block.find(b"\n", start, size)
    return size if end < 0 else end


def _decode(block: bytearray, start: int, end: int) -> str:
    # errors="replace": a log with binary garbage or another encoding must never crash the scan.
    return block[start:end].decode("utf-8", errors="replace").rstrip("\r")


def _windows(block: bytearray, start: int, end: int) -> list[str]:
    """What of a line longer than ``MAX_MATCH_CHARS`` bytes is matched: its head and its tail.

    The tail also yields its last carriage-return segment on its own: tqdm glues progress updates into one
    line with ``\\r`` and the error printed after the last update is what the terminal shows (its ``[rank3]:``
    prefix must start the text to name the rank).
    """
    out = [_decode(block, start, start + MAX_MATCH_CHARS)]
    tail = _decode(block, end - MAX_MATCH_CHARS, end)
    cr = tail.rfind("\r")
    if cr >= 0 and tail[cr + 1:].strip():
        out.append(tail[cr + 1:])
    out.append(tail)
    return out


def _first_match(patterns: tuple[re.Pattern[str], ...], text: str) -> tuple[int, re.Match[str] | None]:
    for index, pattern in enumerate(patterns):
        m = pattern.search(text)
        if m:
            return index, m
    return -1, None

_Probe = tuple[Signature | None, int, int | None, int]  # see Scanner._probe


def _wrapped_start(body: bytes, start: int, line_no: int) -> tuple[int, int]:
    """Where the last line of ``body`` (at ``start``, line ``line_no``) begins when a terminal wrapped it: the
    pieces above it that are exactly as wide as the widest of the last ``WRAP_PROBE_LINES`` lines (at least
    ``MIN_WRAP_CHARS`` wide, ``MIN_WRAPPED_LINES`` of them), at most ``MAX_CUT_WRAP_PIECES`` pieces in all. Returns
    the offset and line number of its first piece; ``(start, line_no)`` when it was not wrapped."""
    probe = body[max(0, start - WRAP_PROBE_BYTES):start].split(b"\n")[-WRAP_PROBE_LINES:]
    widths = [len(ln.rstrip(b"\r")) for ln in probe]
    width = max(widths, default=0)
    if width < MIN_WRAP_CHARS or widths.count(width) < MIN_WRAPPED_LINES or len(body) - start > width:
        return start, line_no
    first = line_no
    while first > line_no - MAX_CUT_WRAP_PIECES + 1 and start > 0:
        above = body.rfind(b"\n", 0, start - 1) + 1
        if len(body[above:start - 1].rstrip(b"\r")) != width:
            break
        start, first = above, first - 1
    return start, first


def _sign_once_unwrapped(block: bytearray, size: int) -> bool:
    """A sign of a distributed job that a terminal's wrap cut in two (``lines.terminal_unwrapped``), in the input's
    first ``DIST_SIGN_BYTES``."""
    joined = terminal_unwrapped(block, min(size, DIST_SIGN_BYTES))
    return joined is not None and has_dist_sign(bytearray(joined), len(joined))


def _says_more(joined: _Probe, alone: _Probe) -> bool:
    """Whether a rejoined line's match (see ``Scanner._probe``) tells more than the line's own.

    More: another signature, or the same one with a rank, a more specific pattern or more details. Not a
    longer match where the line's own ran to its end (``work: 80`` of ``work: 808`` cut by the wrap): tried,
    and it glued the next, unrelated line onto a detail line ending in digits.
    """
    sig, index, rank, details = joined
    if sig is None:
        return False
    if sig is not alone[0]:
        return True
    if alone[2] is not None:
        return rank == alone[2] and (index < alone[1] or details > alone[3])
    return rank is not None or index < alone[1] or details > alone[3]


def _strip_pieces(pieces: list[str]) -> list[str]:
    """The pieces of a terminal-wrapped line without what pasting put in front of each (see ``strip_paste``).

    The first piece loses its prefixes (a Ray actor's, a glog header, a quote mark). A later piece loses one
    only where pasting decorated every line alike (quote marks, line numbers: the first piece's prefix starts
    with the same character); otherwise what looks like a prefix is the message's own text, cut there by the
    terminal ("... [Proxy Service " wrapped onto "9] Failed to execute operation ...").
    """
    first = strip_paste(pieces[0])
    lead = pieces[0][:len(pieces[0]) - len(first)][:1]
    out = [first]
    for piece in pieces[1:]:
        bare = strip_paste(piece)
        out.append(bare if lead and piece[:1] == lead else piece)
    return out


class Scanner:
    """Feed it streams (one per file); ask for the ordered diagnoses at the end."""

    def __init__(self, kb: list[Signature] | None = None) -> None:
        self.kb = kb if kb is not None else load_kb()
        self._by_id = {s.id: s for s in self.kb}
        # The inventory's templates (see .templates) for this KB's signatures; their anchors join the one pass.
        self._templates = matcher_for(frozenset(self._by_id))
        # RAISE_KEYWORDS: a traceback's `raise SomeError("...")` source line (see .sources and _match_raise);
        # REPR_KEYWORDS: an exception's repr, `SomeError('...')`, inside a list or a dict.
        self._prefilter = build_prefilter([*(prefilter_keyword(k) for s in self.kb for k in s.keywords),
                                           *self._templates.keywords,
                                           *RAISE_KEYWORDS, *REPR_KEYWORDS])
        self._repr_anchor = prefilter_anchors([REPR_KEYWORDS[0]])[REPR_KEYWORDS[0]]  # "Error('": see repr_type_known
        self._specific = [s for s in self.kb if not s.catch_all]  # what a raise line's message may be credited to
        self._first_block = [(s, tuple(x.encode() for x in s.first_block)) for s in self.kb if s.first_block]
        # Which keywords a line holds is found once per line, not once per signature (many signatures
        # share 'Error: ' / 'NCCL WARN'); a line without a signature's keyword is not tried against it.
        self._keywords = tuple(sorted({k for s in self.kb for k in s.keywords}))
        self._sig_keywords = {s.id: frozenset(s.keywords) for s in self.kb}
        self._pending: tuple[tuple[Signature, ...], int] | None = None  # follow-up lines owed to the next block
        self._floor = 0  # offset in the current block before which lines were matched already (see _rejoin)
        self._found: dict[str, Diagnosis] = {}
        self._last_credit = (-1, -1, False)  # (input, line, catch-all?) of the last line credited (see _match_cut_line)
        self._distributed = False  # seen any sign of a distributed job (see DIST_CONTEXT)
        self._facts = Facts()
        self.files: list[str] = []
        self.lines_scanned = 0
        self.bytes_scanned = 0
        self.lines_windowed = 0

    # -- streaming ---------------------------------------------------------------------------------
    def scan(self, name: str, stream: IO[bytes], file_rank: int | None = None) -> None:
        """Scan one binary stream to the end, ``CHUNK_BYTES`` at a time, into one reused buffer.

        Reusing a bytearray (``readinto``) instead of ``read()`` + concatenation avoids allocating and
        page-faulting fresh 4 MB objects per chunk, which alone cost more than the regex passes.
        """
        file_index = len(self.files)
        self.files.append(name)
        self._pending = None
        if file_rank is not None:
            self._distributed = True
        buf = bytearray(CHUNK_BYTES + MAX_LINE_BYTES)
        view = memoryview(buf)
        readinto = getattr(stream, "readinto", None)
        have = 0  # bytes in buf: the unfinished last line of the previous chunk, then the new chunk
        tail = b""  # the end of the previous block, for look-back across a block boundary
        end_tail = b""  # the input's last TAIL_BYTES so far: where it ends (see phases)
        consumed = 0  # bytes of this input handed to _scan_block so far
        lines_before = 0
        eof = False
        try:
            while not eof:
                room = min(CHUNK_BYTES, len(buf) - have)
                if readinto is not None:
                    got = readinto(view[have:have + room])
                else:  # a stream without readinto (rare): copy what read() returns
                    data = stream.read(room)
                    got = len(data)
                    buf[have:have + got] = data
                got = got or 0
                self.bytes_scanned += got
                have += got
                eof = got == 0
                cut = buf.rfind(b"\n", 0, have)
                if cut < 0 and not eof and have < MAX_LINE_BYTES:
                    continue  # no complete line yet: read more
                end = have if (eof or cut < 0) else cut + 1
                if end:
                    # Lines a paste flattened with literal "\n" (JSON, a repr) are scanned as the lines they were.
                    # A backslash is looked for first: one byte is found with memchr (~20 GB/s), "\\n" at < 1 GB/s,
                    # which alone cost a quarter of a healthy log's scan time.
                    slash = buf.find(b"\\", 0, end)
                    block = unflatten(buf, end) if slash >= 0 and buf.find(b"\\n", slash, end) >= 0 else None
                    size = end if block is None else len(block)
                    block = buf if block is None else block
                    plain = from_the_web(block, size)  # a copy from a web page: its spaces and HTML escapes
                    if plain is not None:
                        block, size = plain, len(plain)
                    lines_before = self._scan_block(block, size, tail, name, file_index, lines_before, file_rank)
                    tail = bytes(block[max(0, size - 8192):size])
                    # One copy of at most TAIL_BYTES per block: the end of the input is kept for free.
                    piece = bytes((view if block is buf else memoryview(block))[max(0, size - TAIL_BYTES):size])
                    end_tail = piece if len(piece) >= TAIL_BYTES else (end_tail + piece)[-TAIL_BYTES:]
                    consumed += size
                rest = have - end
                if rest:
                    buf[:rest] = buf[end:have]
                have = rest
        finally:
            view.release()
        lines_in_input = lines_before + (1 if tail and not tail.endswith(b"\n") else 0)
        self.lines_scanned += lines_in_input
        ending = where_input_ends(end_tail, len(end_tail) == consumed, lines_in_input, name, file_index, file_rank)
        if ending is not None:
            self._facts.phase_ends.append(ending)
        self._match_cut_line(end_tail, lines_in_input, name, file_index, file_rank)
        cut_at_end = cut_traceback(end_tail, lines_in_input, name, file_index, file_rank)
        if cut_at_end is not None:
            self._facts.cut_tracebacks.append(cut_at_end)
        crash = verbs_crash(end_tail, lines_in_input, name, file_index, file_rank)
        if crash is not None:
            self._facts.verbs_crashes.append(crash)
        if any(i in self._found for i in TIMEOUT_IDS):  # what the rank the others waited for did last
            self._facts.last_progress.update(last_progress_lines(end_tail, len(end_tail) == consumed,
                                                                 lines_in_input, name, file_rank))

    def _match_cut_line(self, end_tail: bytes, last_line: int, name: str, file_index: int,
                        file_rank: int | None) -> None:
        """The input's last line, when no specific signature took it, read as a message the paste cut short.

        Issue 33: a paste often stops mid-line (a comment box, a thread excerpt, a user who stopped copying):
        ``... waiting for clients. 1/3 clients jo``. Its line is matched against every template of the inventory
        for a message whose literal pieces it holds in order up to one its end starts (``TemplateMatcher.match_cut``:
        at least MIN_CUT_CHARS of literal text); the diagnosis says the message is cut. One line an input."""
        body = end_tail.rstrip()
        start = body.rfind(b"\n") + 1
        if not body or len(body) - start > MAX_MATCH_CHARS:
            return
        line_no = last_line - max(0, end_tail[len(body):].count(b"\n") - 1)  # less the blank lines after it
        if self._last_credit[:2] == (file_index, line_no) and not self._last_credit[2]:
            return  # a specific signature took it whole
        start, first_no = _wrapped_start(body, start, line_no)
        if first_no < line_no and self._last_credit[1] in range(first_no, line_no) and not self._last_credit[2]:
            return  # a specific signature took a piece of it
        raw = end_tail[start:len(body)].replace(b"\n", b"").decode("utf-8", errors="replace").rstrip("\r")
        if quiet_level(raw):
            return  # a warning or an info line cut short is no failure, whichever message it would have been
        template = self._templates.match_cut(strip_paste(raw))
        if template is None:
            return
        by_catch_all = self._last_credit[0] == file_index and self._last_credit[1] in range(first_no, line_no + 1) \
            and self._last_credit[2]
        credited = self._last_credit[1]
        block = bytearray(end_tail)
        sig = self._match_line(raw, self._specific, True, name, file_index, first_no, file_rank,
                               partial(self._lookback, block, start, b""), cut=template)
        if sig is not None and by_catch_all:  # the catch-all read the cut line first: the message is known now
            for catch_all in [d for d in self._found.values() if d.signature.catch_all]:
                if catch_all.count == 1 and catch_all.first_seq == (file_index, credited):
                    del self._found[catch_all.id]

    def _scan_block(self, block: bytearray, size: int, tail: bytes, name: str, file_index: int,
                    lines_before: int, file_rank: int | None) -> int:
        """Find the keyword lines in ``block[:size]`` (complete lines only) and match them.

        Returns the number of lines before the next block: newlines are counted once, hit to hit and
        then to the end (counting the whole block again cost as much as a prefilter pass).
        """
        if not self._distributed and lines_before == 0 and (has_dist_sign(block, min(size, DIST_SIGN_BYTES))
                                                            or interleaved_tracebacks(block, size)
                                                            or _sign_once_unwrapped(block, size)):
            # The start of each input only (the launcher's banner, torchrun's and NCCL's start-up lines are
            # there); later signs are looked for around the lines a needs_distributed signature matched (see
            # _match_line). Checking every block of a log with no sign cost twelve passes per block: trainer and
            # HF-Trainer logs ran at half speed for it.
            self._distributed = True
        if lines_before == 0 and self._first_block:
            self._scan_first_block(block, size, name, file_index, file_rank, tail)
        hits = self._admitted(block, size)
        pending, self._pending = self._pending, None
        self._floor = 0
        if pending is not None:  # a match at the end of the previous block wants to see these lines
            hits.setdefault(0, _line_end(block, 0, size))
        if not hits:
            return lines_before + newlines(block, 0, size)
        line_no = lines_before  # 0-based number of the line starting at counted_to
        counted_to = 0
        done_to = -1  # lines up to this offset were already handled as follow-ups
        for start in sorted(hits):
            if start <= done_to:
                continue
            line_no += newlines(block, counted_to, start)
            counted_to = start
            if pending is not None and start == 0:
                follow, remaining = pending
                pending = None
                done_to, line_no = self._followups(block, size, 0, line_no, follow, remaining, name,
                                                   file_index, file_rank, tail)
                counted_to = done_to
                continue
            end = hits[start]
            sig, last, used = self._match_at(block, start, end, size, self.kb, True, name, file_index, line_no,
                                             file_rank, tail)
            if used:  # continuation lines of a terminal-wrapped message: consumed with it
                done_to, line_no, counted_to = last, line_no + used, last
                end = _line_end(block, last, size)
            if sig is not None and sig.followup_lines and end + 1 < size:
                follow = tuple(self._by_id[i] for i in sig.followup_ids)
                done_to, line_no = self._followups(block, size, end + 1, line_no + 1, follow,
                                                   sig.followup_lines, name, file_index, file_rank, tail)
                counted_to = done_to
            elif sig is not None and sig.followup_lines:
                self._pending = (tuple(self._by_id[i] for i in sig.followup_ids), sig.followup_lines)
        return line_no + newlines(block, counted_to, size)

    def _admitted(self, block: bytearray, size: int) -> dict[int, int]:
        """The lines of ``block[:size]`` the prefilter admits: offset of each line's start -> of its end."""
        hits: dict[int, int] = {}
        prefilter = self._prefilter
        folded = prefilter.fold(block, size)
        m = prefilter.search(folded, 0, size)
        while m is not None:
            if (m.end() - m.start() == len(self._repr_anchor) and block.startswith(self._repr_anchor, m.start())
                    and not repr_type_known(block, m.start())):
                m = prefilter.search(folded, m.end(), size)  # urllib3's ProtocolError('...'): no look at the line
                continue
            start = block.rfind(b"\n", 0, m.start()) + 1
            # A cut anchor (see _anchor_trie) ends with the line's own newline.
            end = m.end() - 1 if block[m.end() - 1] == 10 else _line_end(block, m.end(), size)
            hits[start] = end
            m = prefilter.search(folded, end + 1, size) if end + 1 < size else None
        return hits

    def _scan_first_block(self, block: bytearray, size: int, name: str, file_index: int, file_rank: int | None,
                          tail: bytes) -> None:
        """The ``first_block`` signatures (start-up facts such as the interface NCCL chose), found with
        ``bytes.find`` in an input's first block: a handful of literal searches per input, nothing per block."""
        for sig, literals in self._first_block:
            for literal in literals:
                pos, found = 0, 0
                while found < MAX_FIRST_BLOCK_HITS:
                    at = block.find(literal, pos, size)
                    if at < 0:
                        break
                    start = block.rfind(b"\n", 0, at) + 1
                    end = _line_end(block, at, size)
                    if end - start <= MAX_MATCH_CHARS:
                        line_no = block.count(b"\n", 0, start)
                        self._match_line(_decode(block, start, end), [sig], False, name, file_index, line_no + 1,
                                         file_rank, partial(self._lookback, block, start, tail))
                    pos, found = end + 1, found + 1

    def _followups(self, block: bytearray, size: int, pos: int, line_no: int, follow: tuple[Signature, ...],
                   remaining: int, name: str, file_index: int, file_rank: int | None,
                   tail: bytes) -> tuple[int, int]:
        """Try ``remaining`` lines from ``pos`` (0-based line ``line_no``) against ``follow``.

        Multi-line messages put their details on lines without any keyword ('Parameter indices which did
        not receive grad ...', the line after NCCL's 'Last error:', the desync report). A line that is not
        such a detail is matched normally; a match with its own follow-ups extends the window. Returns the
        offset and line number of the last line handled.
        """
        last = pos
        while remaining > 0 and pos < size:
            end = _line_end(block, pos, size)
            sig, cont, used = self._match_at(block, pos, end, size, follow, False, name, file_index, line_no,
                                             file_rank, tail)
            if sig is None:
                sig, cont, used = self._match_at(block, pos, end, size, self.kb, True, name, file_index, line_no,
                                                 file_rank, tail)
            if used:
                pos, line_no, remaining = cont, line_no + used, remaining - used
                end = _line_end(block, pos, size)
            remaining -= 1
            if sig is not None and sig.followup_lines:
                follow = tuple(self._by_id[i] for i in sig.followup_ids)
                remaining = max(remaining, sig.followup_lines)
            last = pos
            pos = end + 1
            line_no += 1
        if remaining > 0:
            self._pending = (follow, remaining)
        return last, line_no - 1

    @staticmethod
    def _lookback(block: bytearray, start: int, tail: bytes, count: int = LOOKBACK_LINES,
                  strip: bool = True) -> list[str]:
        """Up to ``count`` lines (within 8 KiB) before the line at ``start``, nearest first, paste prefixes
        stripped unless ``strip`` is False."""
        before = bytes(block[max(0, start - 8192):start])
        if start < 8192:
            before = tail + before
        lines = before.decode("utf-8", errors="replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        clean = strip_paste if strip else str
        return [clean(ln.rstrip("\r")[:MAX_MATCH_CHARS]) for ln in reversed(lines[-count:])]

    def _match_at(self, block: bytearray, start: int, end: int, size: int, sigs: tuple[Signature, ...] | list[Signature],
                  gate: bool, name: str, file_index: int, line_no: int, file_rank: int | None,
                  tail: bytes) -> tuple[Signature | None, int, int]:
        """Match the line ``block[start:end]`` (0-based line ``line_no``), whole, in windows, or rejoined.

        Returns the signature credited (or None), the offset of the last line used and how many continuation
        lines were used with it (0 unless a terminal-wrapped message was rejoined with lines after it).
        """
        floor, self._floor = self._floor, end + 1
        if end - start > MAX_MATCH_CHARS:
            self.lines_windowed += 1
            lookback = partial(self._lookback, block, start, tail)
            for text in _windows(block, start, end):
                sig = self._match_pieces(text, sigs, gate, name, file_index, line_no + 1, file_rank, lookback)
                if sig is not None:
                    return sig, start, 0
            return None, start, 0
        text = _decode(block, start, end)
        if gate and "raise" in text:
            raised = self._match_raise(block, start, end, size, text, name, file_index, line_no, file_rank, tail)
            if raised is not None:
                return raised
        joined = self._rejoin(block, start, end, size, text, sigs, gate, floor)
        if joined is not None:
            whole, first, back, last, used = joined
            lookback = partial(self._lookback, block, first, tail)
            sig = self._match_line(whole, sigs, gate, name, file_index, line_no + 1 - back, file_rank, lookback)
            if sig is not None:
                self._floor = _line_end(block, last, size) + 1
                return sig, last, used
        lookback = partial(self._lookback, block, start, tail)
        sig = self._match_pieces(text, sigs, gate, name, file_index, line_no + 1, file_rank, lookback)
        if sig is None and gate and (glued := GLUED_EXCEPTION.search(text)) is not None:
            # The exception line a paste glued onto the source line above it, read as the line it was (on the
            # same rank: a "[rank3]:" in front of the glued pair is the exception's too).
            rank_prefix = LINE_PREFIX_RANK.match(text)
            piece = (rank_prefix.group(0) + " " if rank_prefix else "") + text[glued.start(1):]
            sig = self._match_line(piece, sigs, gate, name, file_index, line_no + 1, file_rank, lookback)
        if sig is None:
            self._floor = floor  # a line credited to nothing may still be the first piece of the next one's
        return sig, start, 0

    def _match_raise(self, block: bytearray, start: int, end: int, size: int, text: str, name: str,
                     file_index: int, line_no: int, file_rank: int | None,
                     tail: bytes) -> tuple[Signature | None, int, int] | None:
        """A traceback's ``raise SomeError("...")`` source line (and the lines its call continues on), matched
        as the exception line Python would have printed (see :mod:`.sources`), or None if it is not one or
        its message is no known one (the catch-all is not tried: the exception's own line, when pasted, is).
        The evidence quotes the source lines."""
        bare = strip_paste(text)
        prefix = LINE_PREFIX_RANK.match(bare)
        body = bare[prefix.end():] if prefix else bare
        if RAISE_START.match(body) is None:
            return None
        following: list[str] = []
        offsets: list[int] = []
        raws: list[str] = []
        pos = end + 1
        while len(following) < MAX_RAISE_LINES - 1 and pos < size:
            nend = _line_end(block, pos, size)
            if nend - pos > MAX_MATCH_CHARS:
                break
            raw = _decode(block, pos, nend)
            piece = strip_paste(raw)
            p = LINE_PREFIX_RANK.match(piece)
            if (p.group(0) if p else None) != (prefix.group(0) if prefix else None):
                break  # another rank's line, interleaved: not this statement
            following.append(piece[p.end():] if p else piece)
            offsets.append(pos)
            raws.append(raw)
            pos = nend + 1
        lookback = partial(self._lookback, block, start, tail)
        back = [LINE_PREFIX_RANK.sub("", ln, count=1) for ln in lookback(4)]
        got = raise_message([body, *following], back)
        if got is None:
            return None
        message, used = got
        quote = " ".join(x.strip() for x in (text, *raws[:used]) if x.strip(" ^~"))
        head = prefix.group(0) + " " if prefix else ""
        sig = self._match_line(head + message, self._specific, True, name, file_index, line_no + 1, file_rank,
                               lookback, quote=quote)
        if sig is None:
            return None
        last = offsets[used - 1] if used else start
        self._floor = _line_end(block, last, size) + 1
        return sig, last, used

    def _rejoin(self, block: bytearray, start: int, end: int, size: int, text: str,
                sigs: tuple[Signature, ...] | list[Signature], gate: bool,
                floor: int) -> tuple[str, int, int, int, int] | None:
        """The line joined with the pieces of it a terminal wrapped onto the lines around it, if it is one.

        A terminal wraps a long line at its width without a separator, so the pieces are joined as they are
        (less what pasting put in front of each). The keyword may sit on a later piece than the message's
        start or its ``[Rank 3]``, so up to ``MAX_BACKWARD_LINES`` lines before this one are tried too, and
        up to ``MAX_CONTINUATION_LINES`` after it. A boundary is a plausible wrap only when the piece above
        it is at least ``MIN_WRAP_CHARS`` long, the piece below is not longer (a terminal fills every piece
        but the last to its width), and the piece below is neither blank nor a new ``[rankN]:`` line. The
        joined text is kept only when it says more than the line alone: a signature the line does not match,
        or the same one with a rank or a more specific pattern; and never when a piece other than this line
        matches that signature on its own (it would have been its own match). A width-detection heuristic was
        tried and reverted (repeated NCCL lines of one length looked wrapped). Bounded: a few lines read back
        within this block and not before ``floor`` (lines already matched), ``MAX_MATCH_CHARS`` characters in
        all. Returns (joined text, offset of the first piece, pieces before, offset of the last piece, pieces
        after).
        """
        back: list[tuple[int, str]] = []  # (offset, raw text), nearest first
        below, pos = text, start
        while len(back) < MAX_BACKWARD_LINES and pos > floor and pos > 0:
            pstart = block.rfind(b"\n", 0, pos - 1) + 1
            if pstart < floor or pos - 1 - pstart > MAX_MATCH_CHARS:
                break
            piece = _decode(block, pstart, pos - 1)
            if not wraps_onto(piece, below):
                break
            back.append((pstart, piece))
            below, pos = piece, pstart
        fwd: list[tuple[int, str]] = []
        above, pos = text, end + 1
        while len(fwd) < MAX_CONTINUATION_LINES and pos < size:
            nend = _line_end(block, pos, size)
            if nend - pos > MAX_MATCH_CHARS:
                break
            piece = _decode(block, pos, nend)
            if not wraps_onto(above, piece):
                break
            fwd.append((pos, piece))
            above, pos = piece, nend + 1
        if not back and not fwd:
            return None
        best = alone = self._probe(strip_paste(text), sigs, gate)
        chosen: tuple[str, int, int, int, int] | None = None
        checked: dict[int, Signature | None] = {}
        for total in range(1, len(back) + len(fwd) + 1):
            for nb in range(min(total, len(back)), -1, -1):
                nf = total - nb
                if nf > len(fwd):
                    continue
                pieces = [p for _, p in reversed(back[:nb])] + [text] + [p for _, p in fwd[:nf]]
                if sum(map(len, pieces)) > MAX_MATCH_CHARS:
                    continue
                stripped = _strip_pieces(pieces)
                joined = self._probe("".join(stripped), sigs, gate)
                if not _says_more(joined, best):
                    continue
                others = [i for i in range(len(pieces)) if i != nb]
                clash = False
                for i in others:
                    if i not in checked:
                        checked[i] = self._probe(stripped[i], sigs, gate)[0]
                    if checked[i] is joined[0] is not None and self._matched_alone(stripped[i], joined[0], alone[0]):
                        clash = True
                        break
                if clash:
                    continue
                first = back[nb - 1][0] if nb else start
                last = fwd[nf - 1][0] if nf else start
                # Kept, and more pieces tried: the detail that names the rank may be one piece further.
                best, chosen = joined, (pieces[0] + "".join(stripped[1:]), first, nb, last, nf)
        return chosen if best is not alone else None

    def _matched_alone(self, piece: str, sig: Signature, own: Signature | None) -> bool:
        """Whether ``piece``, which matches ``sig`` on its own, will be credited to it as its own line, so that a
        rejoined match of ``sig`` through it would count the message twice (the clash ``_rejoin`` avoids).

        Not when the prefilter never admits the piece (an exception's message wrapped off its ``SomeError: ``
        line, a template found only through that marker), nor when the line's own match ``own`` is a catch-all
        (``python-exception`` for the ``DistBackendError: NCCL error in: ...`` head of a wrapped ``remote process
        exited`` message): the pieces are one message and the rejoined, specific match is the one to keep.
        """
        if own is not None and own.catch_all and not sig.catch_all:
            return False
        data = bytearray(piece.encode("utf-8", "replace"))
        return self._prefilter.search(self._prefilter.fold(data, len(data)), 0, len(data)) is not None

    def _probe(self, text: str, sigs: tuple[Signature, ...] | list[Signature],
               gate: bool) -> _Probe:
        """What ``text`` (already stripped) would be credited as, without crediting it.

        (signature or None, index of the pattern that matched, rank if the text names one, named details).
        """
        present = self._present(text) if gate else frozenset()
        template = self._templates.match(text) if gate else None
        for sig in sigs:
            index, named = self._sig_match(sig, text, gate, present, template)
            if named is None:
                continue
            groups = {k for k, v in named.items() if v is not None}
            for extra in sig.extract:
                em = extra.search(text)
                if em:
                    groups.update(k for k, v in em.groupdict().items() if v is not None)
            rank = named.get("rank")
            found = rank_int(rank) if rank else self._line_rank(text, None)
            return sig, index, found, len(groups)
        return None, -1, None, 0

    # -- matching ----------------------------------------------------------------------------------
    def _present(self, text: str) -> frozenset[str]:
        """The keywords ``text`` holds; a keyword ending in ``$`` only at its end (a bare exception name's ``Error$``)."""
        line = text.rstrip() + "$"
        return frozenset(k for k in self._keywords if k in line)

    def _sig_match(self, sig: Signature, text: str, gate: bool, present: frozenset[str],
                   template: Template | None) -> tuple[int, dict[str, str | None] | None]:
        """Whether ``sig`` matches ``text``: (pattern index, named groups) or (-1, None).

        Its own patterns first, where the line holds one of its keywords (they extract details and ranks);
        else the inventory template the line matched (:mod:`.templates`), if that template is one of ``sig``'s:
        pattern index ``len(sig.patterns)``, no groups. The KB's order still decides between signatures: a
        specific hand-written signature before a template's family, the template's family before a catch-all.
        """
        if not gate or not self._sig_keywords[sig.id].isdisjoint(present):
            index, m = _first_match(sig.patterns, text)
            if m is not None:
                return index, m.groupdict()
        if template is not None and template.signature == sig.id:
            return len(sig.patterns), {}
        return -1, None

    def _match_pieces(self, text: str, sigs: Iterable[Signature], gate: bool, name: str, file_index: int,
                      line_no: int, file_rank: int | None, lookback: Any) -> Signature | None:
        """``_match_line`` for a line that may be a flattened paste: each log line it holds
        (``lines.embedded_lines``) is credited on its own, the first match returned; else the line whole."""
        pieces = embedded_lines(text) if gate else [text]
        if len(pieces) > 1:
            sigs = tuple(sigs)
            found = [self._match_line(piece, sigs, gate, name, file_index, line_no, file_rank, lookback)
                     for piece in pieces]
            sig = next((s for s in found if s is not None), None)
            if sig is not None:
                return sig
        return self._match_line(text, sigs, gate, name, file_index, line_no, file_rank, lookback)

    def _match_line(self, text: str, sigs: Iterable[Signature], gate: bool, name: str, file_index: int,
                    line_no: int, file_rank: int | None, lookback: Any, quote: str | None = None,
                    cut: Template | None = None) -> Signature | None:
        """Credit the line to the first signature that matches it; return that signature (or None).

        ``quote``: what the evidence shows instead of the line (the source lines a raise's message was read
        from)."""
        raw = text
        label = SRUN_LABEL.match(text.lstrip("> "))
        if label is not None and self._wrapped_label(lookback, text):
            label = None
        text = strip_paste(text)
        present = self._present(text) if gate else frozenset()
        template = cut if cut is not None else self._templates.match(text) if gate else None
        for sig in sigs:
            index, found = self._sig_match(sig, text, gate, present, template)
            if found is None:
                continue
            groups = {k: v for k, v in found.items() if v is not None}
            if sig.catch_all and "message" not in groups and not self._ends_traceback(lookback):
                continue  # a type's name alone, not under a traceback's frames: a word, not an exception line
            if template is not None and template.signature == sig.id:
                groups["template_source"] = template.where  # the message's provenance: project version file:line
                if cut is not None:
                    groups["cut"] = "the paste ends inside this message"
            for extra in sig.extract:
                em = extra.search(text)
                if em:
                    for k, v in em.groupdict().items():
                        if v is not None:
                            groups.setdefault(k, v)
            rank = rank_int(groups.pop("rank")) if "rank" in groups else None
            when = timestamp(raw)  # raw: a glog prefix strip_paste removed carries the time
            if sig.context == "torchrun-summary":
                keep, summary_rank, root, summary_time = self._torchrun_context(text, groups, lookback)
                if not keep:
                    return None
                if rank is None:
                    rank = summary_rank
                if root and rank is not None:
                    self._facts.summary_roots.add(rank)
                when = when or summary_time
            if sig.context == "python-traceback" and self._ignored_exception(lookback):
                return None
            if rank is None and label is not None:
                rank = int(label.group(1))
            if rank is None:
                rank = self._line_rank(text, file_rank)
            if rank is None:
                rank = self._block_rank(text, lookback)
            groups.pop("local_rank", None)
            if "signal_number" in groups:
                groups.setdefault("signal", signal_name(groups["signal_number"]))
            if not sig.needs_distributed:
                self._distributed = True
            elif not self._distributed:  # the traceback around it may show the job is distributed
                around = "\n".join((text, *lookback(TRACEBACK_LOOKBACK_LINES))).encode("utf-8", "replace")
                self._distributed = (DIST_CONTEXT.search(around) is not None
                                     or SEVERAL_WRITERS.search(text[:MAX_GLUED_NAME_CHARS]) is not None)
            diag = self._found.get(sig.id)
            if diag is None:
                diag = self._found[sig.id] = Diagnosis(sig)
            ev = Evidence(name, line_no, (quote or raw).strip()[:MAX_EVIDENCE_CHARS])
            # A warning printed on the way (a UserWarning, a glog W line, an INFO line) is not why a rank ended.
            fatal = not quiet_level(raw)
            seq = (file_index, line_no)
            event = None
            known = diag.rank_events.get(rank)
            if known is None or known.exception is None:
                # The first line on this rank: what and where, for the ranking; a later exception line of the same
                # diagnosis fills in what the first one lacked (a kernel's assertion line, then its traceback's
                # `torch.AcceleratorError: CUDA error: device-side assert triggered`).
                event = self._event(text, seq, when, lookback)
            if "exception" in groups:  # several ranks' exception lines glued into one: the type and message once
                groups["exception"], groups["message"] = one_writer(groups["exception"], groups.get("message") or "")
            if "frame" not in groups and event is not None and event.frame is not None:
                groups["frame"] = event.frame
            diag.add(ev, rank, index, groups, seq, when, fatal, event)
            self._last_credit = (file_index, line_no, sig.catch_all)
            if fatal:
                self._facts.last_fatal_line[file_index] = max(line_no, self._facts.last_fatal_line.get(file_index, 0))
            return sig
        return None

    @staticmethod
    def _event(text: str, seq: tuple[int, int], when: tuple[int, ...] | None, lookback: Any) -> RankEvent:
        """The first line of a diagnosis on a rank; for an exception, its type, message and the user's frame
        (the innermost one outside torch and installed packages, from the traceback above it)."""
        prefix = LINE_PREFIX_RANK.match(text)
        body = text[prefix.end():].lstrip() if prefix else text
        m = EXCEPTION_LINE.match(strip_paste(body))
        if m is None and (glued := GLUED_EXCEPTION.search(body)) is not None:  # glued onto its source line
            m = EXCEPTION_LINE.match(glued.group(1))
        if m is None:
            return RankEvent(seq, when)
        frames = []
        for ln in lookback(TRACEBACK_LOOKBACK_LINES):
            p = LINE_PREFIX_RANK.match(ln)
            if prefix is not None and (p is None or p.group(0) != prefix.group(0)):
                continue  # another rank's line, interleaved: not this traceback
            frames.append(ln[p.end():] if p else ln)
        exception, message = one_writer(m.group("exception"), (m.group("message") or "").strip())
        return RankEvent(seq, when, exception, message[:MAX_DETAIL_CHARS], user_frame(frames))

    @staticmethod
    def _wrapped_label(lookback: Any, text: str) -> bool:
        """Whether an srun ``10: `` label at the start of ``text`` is only where a terminal cut a longer line.

        ``...NCCL version 2.18.5 10: ncclSystemError`` wrapped at ``1`` starts the next line with ``0: ``;
        under ``srun --label`` the line above carries a label too, a wrapped line's first piece does not.
        """
        above = lookback(1, strip=False)
        return bool(above) and len(above[0]) >= MIN_WRAP_CHARS and SRUN_LABEL.match(above[0].lstrip("> ")) is None

    @staticmethod
    def _torchrun_context(text: str, groups: dict[str, str],
                          lookback: Any) -> tuple[bool, int | None, bool, tuple[int, ...] | None]:
        """Whether to keep a line of torchrun's failure summary, its rank, whether its entry is the summary's
        ``Root Cause (first observed failure)``, and the entry's ``time :``.

        The summary lists ``Root Cause (first observed failure):`` and ``Failures:`` entries; the ranks
        torchrun itself stopped with SIGTERM after the first failure are noise, not causes.
        """
        rank: int | None = None
        when: tuple[int, ...] | None = None
        agent_line = "failed (exitcode" in text  # the agent's own log line names the first failure
        root = False
        if not agent_line and ("exitcode" in text or "received by PID" in text):
            lines = lookback()
            for i, ln in enumerate(lines):
                m = SUMMARY_RANK.match(ln)
                if m and rank is None:
                    rank = int(m.group(1))
                t = SUMMARY_TIME.match(ln)
                if t and when is None:
                    when = timestamp(t.group(1))
                if SUMMARY_ENTRY.match(ln):
                    root = i + 1 < len(lines) and "Root Cause" in lines[i + 1]
                    break
        number = rank_int(groups.get("signal_number", ""))
        if number is not None and number in SIGTERM_LIKE and not (root or agent_line):
            return False, rank, root, when
        return True, rank, root, when

    @staticmethod
    def _ends_traceback(lookback: Any) -> bool:
        """Whether the line above is indented, as a traceback's innermost frame (its code line, its ``File ...``
        line, or Python 3.11's carets) is right above the exception line Python prints at the margin."""
        above = [LINE_PREFIX_RANK.sub("", ln, count=1) for ln in lookback(1)]
        return bool(above) and above[0][:1].isspace() and bool(above[0].strip())

    @staticmethod
    def _ignored_exception(lookback: Any) -> bool:
        """Whether the traceback ending at this line follows Python's "Exception ignored in: ..." header.

        Python prints exceptions raised in ``__del__`` and at interpreter exit that way and carries on,
        e.g. DataLoader workers' "AssertionError: can only test a child process" at the end of a run that
        finished fine; such a line did not end the rank.
        """
        lines = [LINE_PREFIX_RANK.sub("", ln, count=1) for ln in lookback(TRACEBACK_LOOKBACK_LINES)]
        for i, ln in enumerate(lines):
            if ln.startswith("Traceback (most recent call last)"):
                return i + 1 < len(lines) and lines[i + 1].startswith("Exception ignored in")
            if ln.startswith("Exception ignored in"):  # no frames: the header right above the exception
                return True
            if not ln[:1].isspace():  # frames and their code are indented; anything else ends the walk
                return False
        return False

    @staticmethod
    def _block_rank(text: str, lookback: Any) -> int | None:
        """The rank of an exception inside a block that names it a few lines above, walking up its traceback.

        * mp.spawn: ``-- Process 3 terminated with the following error:`` then process 3's traceback;
        * torchrun's failure summary: ``rank : 1 (local_rank: 1)`` ... ``traceback : Traceback ...`` then the
          worker's traceback, indented (taken from its error file).
        Only hit lines pay for this walk (at most ``TRACEBACK_LOOKBACK_LINES`` lines, within 8 KiB), and most
        decide within a few lines (the line above is no traceback's): those few are read first, the rest only
        when the walk is still inside a traceback there (a log of 100,000 NCCL WARN lines took 36 s reading 60
        lines above each).
        """
        lines = lookback(BLOCK_RANK_FIRST_LINES)
        decided, rank = Scanner._walk_block(lines, complete=len(lines) < BLOCK_RANK_FIRST_LINES)
        if decided:
            return rank
        return Scanner._walk_block(lookback(TRACEBACK_LOOKBACK_LINES), complete=True)[1]

    @staticmethod
    def _walk_block(lines: list[str], complete: bool) -> tuple[bool, int | None]:
        """(decided, rank) of ``_block_rank``'s walk over ``lines`` (nearest first); not decided when the walk
        reached the last line of an incomplete list (that line's reading depends on the one above it)."""
        seen_traceback = False
        for i, ln in enumerate(lines):
            if i + 1 == len(lines) and not complete:
                return False, None
            if i + 1 < len(lines) and wraps_onto(lines[i + 1], ln) and not ln.startswith("Traceback"):
                continue  # the rest of a long frame line a terminal wrapped: still inside the traceback
            m = SPAWN_HEADER.search(ln)
            if m:
                return True, int(m.group(1))
            if "traceback :" in ln:
                seen_traceback = True
            elif seen_traceback:
                m = SUMMARY_RANK.match(ln)
                if m:
                    return True, int(m.group(1))
            if SUMMARY_ENTRY.match(ln) or (ln and not ln[:1].isspace() and not ln.startswith("Traceback")):
                return True, None  # left the traceback: whatever names a rank further up is another block
        return complete, None

    @staticmethod
    def _line_rank(text: str, file_rank: int | None) -> int | None:
        m = LINE_PREFIX_RANK.match(text)
        if m:
            return int(m.group(1) or m.group(2) or m.group(3))  # at most MAX_RANK_DIGITS by the regex
        if file_rank is not None:
            return file_rank
        m = PG_RANK.search(text)
        if m:
            return int(m.group(1))
        if "NCCL" in text:
            m = NCCL_RANK.search(text)
            if m:
                return int(m.group(1))
        return None

    # -- result ------------------------------------------------------------------------------------
    def result(self) -> ExplainResult:
        ordered = order_diagnoses(self._found, self._distributed, self._facts, self._by_id)
        ordered = add_hints(ordered, self._facts.last_progress)
        return ExplainResult(ordered, list(self.files), self.lines_scanned, self.bytes_scanned, self.lines_windowed)
