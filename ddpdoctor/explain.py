"""Recognise known DDP / NCCL / gloo / torchrun errors in logs of any size, and order them root cause first.

A crashed job leaves thousands of lines from many ranks; the real cause is one of a few dozen known
messages and is often not the last one printed (a rank killed by the OOM killer shows up on the *other*
ranks as NCCL timeouts and "remote process exited"). The signatures live in ``explain_kb.json`` (data, not
code); this module streams the input in fixed-size blocks, so memory stays flat for a 100 GB log:

* prefilter: the signatures' keywords (distinctive pieces of the message texts) are searched over a whole
  block by a few regexes, one per rare lead byte (C speed, no per-line Python; see ``prefilter_anchors``),
  so a healthy but noisy log (glog warnings, NCCL INFO) sends almost no line to the matcher;
* only lines holding a keyword are decoded (``errors="replace"``: binary garbage never crashes it) and
  run through the regexes of the signatures whose keywords they contain; the first matching signature wins;
* each diagnosis keeps bounded state: a count, up to ``MAX_EVIDENCE`` evidence lines, a capped rank set and
  capped extracted details;
* no regex is ever handed more than ``MAX_MATCH_CHARS`` characters: a longer line (binary data, tqdm bars
  glued into one line, a hostile ``NCCL error NCCL error ...``) is matched on its first and last
  ``MAX_MATCH_CHARS`` bytes only, and the report says so. A few patterns backtrack (``NCCL error.*internal
  error`` tries every start and scans to the end: quadratic in the line), so this bound is what keeps the scan
  linear on any input (issue 20); the patterns themselves are also written not to backtrack where they can;
* a message the terminal wrapped over several lines is matched rejoined (see ``Scanner._rejoin``);
* a UTF-16 log with a byte-order mark (Windows PowerShell's ``>``) is transcoded to UTF-8 as it streams.

Ranks come from, in order: the signature's own ``rank`` group, torchrun's ``[rank3]:`` line prefix (also
``[default3]:`` and Open MPI's ``[1,3]<stdout>:``), the file name (``rank3.log``, ``*_rank_3*``, torchrun
``--log-dir`` layout ``attempt_0/3/stderr.log``), ProcessGroupNCCL's ``[Rank 3]`` / ``[PG ... Rank 3]``,
and ``rank 3`` in NCCL lines.
"""

from __future__ import annotations

import codecs
import io
import json
import re
import signal as _signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from typing import IO, Any, cast

from ddpdoctor.ranks import format_rank_list
from ddpdoctor.safejson import loads_untrusted

CHUNK_BYTES = 4 << 20  # read size: large enough for C-speed scans, small enough for flat memory
MAX_LINE_BYTES = 1 << 20  # a "line" longer than this (binary data, no newlines) is scanned as it is
# The most characters any regex is handed at once (a line, a window of a longer line, or a rejoined wrapped
# line); see the module docstring. Real error lines are far shorter; only what they match is needed.
MAX_MATCH_CHARS = 4096
# Terminal-wrapped lines (issue 15): a line at least this long may continue on up to this many next lines.
MIN_WRAP_CHARS = 60
MAX_CONTINUATION_LINES = 3
MAX_BACKWARD_LINES = 2  # the pieces before the keyword's: the message's start, its "[rank3]:" or "[Rank 3]"
# A rank has at most this many digits (jobs have at most a few hundred thousand ranks); more is text, not
# a rank: CPython refuses int() of over 4,300 digits, and a 5,000-digit "[rank777...]" was a crash.
MAX_RANK_DIGITS = 7
MAX_EVIDENCE = 5
MAX_EVIDENCE_CHARS = 400
MAX_RANKS = 65536  # a bound on memory per diagnosis, above the largest jobs in practice
MAX_DETAIL_VALUES = 8
MAX_DETAIL_CHARS = 200
LOOKBACK_LINES = 10  # torchrun's failure summary: the "rank :" line sits a few lines above "exitcode :"
TRACEBACK_LOOKBACK_LINES = 60  # a Python traceback: its header sits above every frame of the stack

# Report order: what the user must fix, then what crashed, then which rank lagged, then echoes, then hints.
ROLE_ORDER = ("cause", "crash", "lagging-rank", "symptom", "warning")

# torchrun (torch >= 2.2) prefixes each worker line with "[rank3]:"; older --tee used "[default3]:";
# Open MPI's --tag-output writes "[jobid,rank]<stdout>:"; application loggers often write "[RANK 3] ...".
_LINE_PREFIX_RANK = re.compile(
    r"^\s*\[(?:rank|default)(\d{1,7})\]:|^\[\d+,(\d{1,7})\]<std(?:out|err)>:|^\[RANK (\d{1,7})\]")
# SLURM's `srun --label` puts the task id in front of every line: "10: ..."; the task id is the rank.
_SRUN_LABEL = re.compile(r"^(\d{1,6}): ")
# What users paste around the real line, stripped before matching (repeatedly, outermost first): "> " quote
# marks, pasted line numbers ("[80746] ", "1743] "), srun's "10: " label, Ray's "(RayWorker pid=7046, ip=...) ", pytest's
# "E       ", vLLM-style "ERROR 04-15 00:31:11 worker_base.py:574] " and glog "E0325 20:57:27.62 2606 api.py:869] ".
_PASTE_PREFIX = re.compile(
    r"^(?:>+ ?"
    r"|\[?\d{1,7}\][ \t]"
    r"|\d{1,7}:[ \t]"
    r"|\(\w+ pid=\d+(?:, ip=[\d.]+)?\) ?"
    r"|E {3,}"
    r"|[A-Z]{4,8} \d\d-\d\d \d\d:\d\d:\d\d [\w.]+:\d+\] "
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] )")
# A log that shows no sign of a distributed job: a CUDA OOM or a Python exception in it is not a DDP problem.
_DIST_CONTEXT = re.compile(
    rb"torch[./\\]distributed|torchrun|\[rank\d|\[RANK \d|ProcessGroup|NCCL|[Rr]ank \d|local_rank|LOCAL_RANK"
    rb"|DistributedDataParallel|init_process_group|multiprocessing[./\\]spawn|WORLD_SIZE|deepspeed|accelerate")
# Literals every _DIST_CONTEXT match contains. _DIST_CONTEXT has no literal start, so `re` tries every
# alternative at every position: 22-38 MB/s over a log with no sign (a plain single-GPU run pays it on every
# block), against GB/s for `bytes.find` of a literal; the regex only confirms around each literal found.
_DIST_LITERALS = (b"NCCL", b"rank", b"Rank", b"RANK", b"torch", b"ProcessGroup", b"DistributedDataParallel",
                  b"init_process_group", b"multiprocessing", b"WORLD_SIZE", b"deepspeed", b"accelerate")
_DIST_WINDOW = 32  # bytes either side of a literal: more than the longest _DIST_CONTEXT alternative
_DIST_MAX_CANDIDATES = 256  # literals found but not confirmed (torch/nn/... frames): then one regex pass
# mp.spawn: the traceback after "-- Process 3 terminated with the following error:" is rank 3's.
# What starts a new log line, never the middle of a wrapped one: a glog or ISO time stamp, an NCCL
# "host:pid:tid [dev] NCCL" header, a traceback's header.
_LINE_HEADER = re.compile(
    r"\[?[IWEF]\d{4} \d\d:\d\d:\d\d|\[?\d{4}-\d\d-\d\d[ T]\d\d:|[\w.-]+:\d+:\d+ \[\d+\] NCCL |Traceback \(most")
_SPAWN_HEADER = re.compile(r"Process (\d{1,7}) terminated with the following error")
_PG_RANK = re.compile(r"\[(?:PG [^\]\[]*?)?Rank (\d{1,7})\]")
_NCCL_RANK = re.compile(r"\brank (\d{1,7})\b")
_FILE_RANK = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,7})(?!\d)", re.IGNORECASE)
# torchrun --log-dir: {log_dir}/{run_id}_{suffix}/attempt_{n}/{local_rank}/{stdout,stderr}.log
_LOGDIR_RANK = re.compile(r"attempt_\d+[/\\](\d{1,7})[/\\](?:stdout\.log|stderr\.log|error\.json)$")
# A torchrun worker's error file (TORCHELASTIC_ERROR_FILE, written by @record / ErrorHandler) is one small JSON
# document; anything larger is not one and is scanned as a log.
MAX_ERROR_FILE_BYTES = 16 << 20
# torchrun failure summary, see torch/distributed/elastic/multiprocessing/errors/__init__.py
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d{1,7})(?!\d)")
_SUMMARY_ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")
# glog "E1122 01:39:40.561000" (optionally after "[rank0]:[") and ISO-ish "2026-11-22 01:39:40,123"
_GLOG_TIME = re.compile(r"(?:^|[\[\s:])[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?")
_ISO_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?")
_SIGTERM_LIKE = {int(_signal.SIGTERM), int(_signal.SIGINT), int(_signal.SIGHUP)}


@dataclass(frozen=True)
class Signature:
    """One known error message: how to find it and what to tell the user."""

    id: str
    role: str
    title: str
    keywords: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]
    extract: tuple[re.Pattern[str], ...]
    cause: str
    remedy: str
    command: str
    context: str = ""
    suppressed_by: tuple[str, ...] = ()
    followup_lines: int = 0
    followup_ids: tuple[str, ...] = ()
    # Within its role, a higher precedence comes first whatever the order of the lines: a rank killed by a
    # signal explains the peers that then exit with an error, even when torchrun logs those first.
    precedence: int = 0
    # Only a finding in a distributed job: a CUDA OOM or an exception in a plain script is not one.
    needs_distributed: bool = False
    # detail name -> value -> what it means (e.g. which Xid); shown as notes under the diagnosis.
    notes: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text}


@dataclass
class Diagnosis:
    """Everything ddpdoctor learned about one signature across all inputs; bounded in size."""

    signature: Signature
    count: int = 0
    ranks: set[int] = field(default_factory=set)
    evidence: list[Evidence] = field(default_factory=list)
    details: dict[str, list[str]] = field(default_factory=dict)
    first_seq: tuple[int, int] = (0, 0)
    first_time: tuple[int, ...] | None = None
    _evidence_keys: set[tuple[int, int | None]] = field(default_factory=set)

    @property
    def id(self) -> str:
        return self.signature.id

    def add(self, ev: Evidence, rank: int | None, pattern_index: int, groups: dict[str, str],
            seq: tuple[int, int], when: tuple[int, ...] | None) -> None:
        if self.count == 0:
            self.first_seq, self.first_time = seq, when
        self.count += 1
        if rank is not None and len(self.ranks) < MAX_RANKS:
            self.ranks.add(rank)
        # One evidence line per (pattern, rank): the report shows each kind of line and each rank once.
        key = (pattern_index, rank)
        if len(self.evidence) < MAX_EVIDENCE and key not in self._evidence_keys:
            self._evidence_keys.add(key)
            self.evidence.append(ev)
        for name, value in groups.items():
            values = self.details.setdefault(name, [])
            value = value.strip()[:MAX_DETAIL_CHARS]
            if value and value not in values and len(values) < MAX_DETAIL_VALUES:
                values.append(value)

    @property
    def notes(self) -> list[str]:
        """What the extracted details mean (the signature's ``notes`` table), in the order they were seen."""
        out: list[str] = []
        for name, table in self.signature.notes.items():
            for value in self.details.get(name, ()):
                note = table.get(value)
                if note and note not in out:
                    out.append(note)
        return out

    def to_json(self) -> dict[str, Any]:
        sig = self.signature
        return {"id": sig.id, "title": sig.title, "role": sig.role, "ranks": sorted(self.ranks),
                "count": self.count, "details": self.details,
                "evidence": [e.to_json() for e in self.evidence],
                "cause": sig.cause, "remedy": sig.remedy, "command": sig.command, "notes": self.notes}


@dataclass
class ExplainResult:
    diagnoses: list[Diagnosis]
    files: list[str]
    lines_scanned: int
    bytes_scanned: int
    # Lines holding a keyword that were longer than MAX_MATCH_CHARS bytes: matched on their two ends only.
    lines_windowed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"diagnoses": [d.to_json() for d in self.diagnoses], "files": self.files,
                "lines_scanned": self.lines_scanned, "bytes_scanned": self.bytes_scanned,
                "lines_windowed": self.lines_windowed}


def load_kb() -> list[Signature]:
    """The knowledge base, in match-priority order; a malformed entry fails loudly (it is a ddpdoctor bug)."""
    text = resources.files("ddpdoctor").joinpath("explain_kb.json").read_text(encoding="utf-8")
    sigs = []
    for raw in json.loads(text)["signatures"]:
        if raw["role"] not in ROLE_ORDER:
            raise ValueError(f"explain KB entry {raw['id']!r}: role must be one of {ROLE_ORDER}")
        sigs.append(Signature(
            id=raw["id"], role=raw["role"], title=raw["title"], keywords=tuple(raw["keywords"]),
            patterns=tuple(re.compile(p) for p in raw["patterns"]),
            extract=tuple(re.compile(p) for p in raw.get("extract", ())),
            cause=raw["cause"], remedy=raw["remedy"], command=raw["command"],
            context=raw.get("context", ""), suppressed_by=tuple(raw.get("suppressed_by", ())),
            followup_lines=int(raw.get("followup", {}).get("lines", 0)),
            followup_ids=tuple(raw.get("followup", {}).get("ids", ())),
            precedence=int(raw.get("precedence", 0)),
            needs_distributed=bool(raw.get("needs_distributed", False)),
            notes={k: dict(v) for k, v in raw.get("notes", {}).items()}))
    ids = [s.id for s in sigs]
    if len(set(ids)) != len(ids):
        raise ValueError("explain KB: duplicate signature ids")
    unknown = {i for s in sigs for i in (*s.followup_ids, *s.suppressed_by)} - set(ids)
    if unknown:
        raise ValueError(f"explain KB: followup/suppressed_by name unknown ids {sorted(unknown)}")
    return sigs


def rank_from_path(path: str) -> int | None:
    """One file per rank: ``rank3.log``, ``train_rank_3.out``, torchrun ``attempt_0/3/stderr.log``."""
    m = _LOGDIR_RANK.search(path)
    if m:
        return int(m.group(1))
    base = re.split(r"[/\\]", path)[-1]
    m = _FILE_RANK.search(base)
    return int(m.group(1)) if m else None


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


def _timestamp(text: str) -> tuple[int, ...] | None:
    m = _ISO_TIME.search(text)
    if m:
        return (int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)), int(m.group(6)),
                int((m.group(7) or "0").ljust(9, "0")[:9]))
    m = _GLOG_TIME.search(text)
    if m:
        return (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                int((m.group(6) or "0").ljust(9, "0")[:9]))
    return None


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


def _signal_name(digits: str) -> str:
    number = _rank_int(digits)
    try:
        return _signal.Signals(number).name if number is not None else f"signal {digits[:MAX_RANK_DIGITS]}..."
    except ValueError:
        return f"signal {number}"


def _rank_int(digits: str) -> int | None:
    """A rank (or a signal number) from a regex group; None for an absurdly long run of digits."""
    return int(digits) if digits.isdecimal() and len(digits) <= MAX_RANK_DIGITS else None


def _has_dist_sign(block: bytearray, size: int) -> bool:
    """Whether ``block[:size]`` shows a sign of a distributed job (``_DIST_CONTEXT``), at ``bytes.find`` speed.

    Each literal of ``_DIST_LITERALS`` is searched; the regex confirms in a small window around each hit.
    Past ``_DIST_MAX_CANDIDATES`` unconfirmed hits (a log full of ``torch/nn/...`` frames) one regex pass
    over the block decides: never slower than that pass alone, which is all there was before.
    """
    candidates = 0
    for literal in _DIST_LITERALS:
        at = block.find(literal, 0, size)
        while at >= 0:
            if _DIST_CONTEXT.search(block, max(0, at - _DIST_WINDOW), min(size, at + len(literal) + _DIST_WINDOW)):
                return True
            candidates += 1
            if candidates > _DIST_MAX_CANDIDATES:
                return _DIST_CONTEXT.search(block, 0, size) is not None
            at = block.find(literal, at + 1, size)
    return False


def _wraps_onto(above: str, below: str) -> bool:
    """Whether ``below`` may be the rest of ``above`` that a terminal wrapped onto the next line."""
    return (len(above) >= MIN_WRAP_CHARS and 0 < len(below) <= len(above) and bool(below.strip())
            and not _LINE_PREFIX_RANK.match(below) and not _LINE_HEADER.match(below))


_Probe = tuple[Signature | None, int, int | None, int]  # see Scanner._probe


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


class Scanner:
    """Feed it streams (one per file); ask for the ordered diagnoses at the end."""

    def __init__(self, kb: list[Signature] | None = None) -> None:
        self.kb = kb if kb is not None else load_kb()
        self._prefilter = build_prefilter(k for s in self.kb for k in s.keywords)
        self._by_id = {s.id: s for s in self.kb}
        # Which keywords a line holds is found once per line, not once per signature (many signatures
        # share 'Error: ' / 'NCCL WARN'); a line without a signature's keyword is not tried against it.
        self._keywords = tuple(sorted({k for s in self.kb for k in s.keywords}))
        self._sig_keywords = {s.id: frozenset(s.keywords) for s in self.kb}
        self._pending: tuple[tuple[Signature, ...], int] | None = None  # follow-up lines owed to the next block
        self._floor = 0  # offset in the current block before which lines were matched already (see _rejoin)
        self._found: dict[str, Diagnosis] = {}
        self._distributed = False  # seen any sign of a distributed job (see _DIST_CONTEXT)
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
                    lines_before = self._scan_block(buf, end, tail, name, file_index, lines_before, file_rank)
                    tail = bytes(buf[max(0, end - 8192):end])
                rest = have - end
                if rest:
                    buf[:rest] = buf[end:have]
                have = rest
        finally:
            view.release()
        self.lines_scanned += lines_before + (1 if tail and not tail.endswith(b"\n") else 0)

    def _scan_block(self, block: bytearray, size: int, tail: bytes, name: str, file_index: int,
                    lines_before: int, file_rank: int | None) -> int:
        """Find the keyword lines in ``block[:size]`` (complete lines only) and match them.

        Returns the number of lines before the next block: newlines are counted once, hit to hit and
        then to the end (counting the whole block again cost as much as a prefilter pass).
        """
        hits: dict[int, int] = {}
        if not self._distributed and _has_dist_sign(block, size):
            # Extra passes per block, and only until the first sign: a distributed log pays them once.
            self._distributed = True
        for rx in self._prefilter:
            m = rx.search(block, 0, size)
            while m is not None:
                start = block.rfind(b"\n", 0, m.start()) + 1
                # A cut anchor (see _cut_trie) ends with the line's own newline.
                end = m.end() - 1 if block[m.end() - 1] == 10 else _line_end(block, m.end(), size)
                hits[start] = end
                m = rx.search(block, end + 1, size) if end + 1 < size else None
        pending, self._pending = self._pending, None
        self._floor = 0
        if pending is not None:  # a match at the end of the previous block wants to see these lines
            hits.setdefault(0, _line_end(block, 0, size))
        if not hits:
            return lines_before + block.count(b"\n", 0, size)
        line_no = lines_before  # 0-based number of the line starting at counted_to
        counted_to = 0
        done_to = -1  # lines up to this offset were already handled as follow-ups
        for start in sorted(hits):
            if start <= done_to:
                continue
            line_no += block.count(b"\n", counted_to, start)
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
        return line_no + block.count(b"\n", counted_to, size)

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
        clean = _strip_paste if strip else str
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
                sig = self._match_line(text, sigs, gate, name, file_index, line_no + 1, file_rank, lookback)
                if sig is not None:
                    return sig, start, 0
            return None, start, 0
        text = _decode(block, start, end)
        joined = self._rejoin(block, start, end, size, text, sigs, gate, floor)
        if joined is not None:
            whole, first, back, last, used = joined
            lookback = partial(self._lookback, block, first, tail)
            sig = self._match_line(whole, sigs, gate, name, file_index, line_no + 1 - back, file_rank, lookback)
            if sig is not None:
                self._floor = _line_end(block, last, size) + 1
                return sig, last, used
        lookback = partial(self._lookback, block, start, tail)
        sig = self._match_line(text, sigs, gate, name, file_index, line_no + 1, file_rank, lookback)
        if sig is None:
            self._floor = floor  # a line credited to nothing may still be the first piece of the next one's
        return sig, start, 0

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
            if not _wraps_onto(piece, below):
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
            if not _wraps_onto(above, piece):
                break
            fwd.append((pos, piece))
            above, pos = piece, nend + 1
        if not back and not fwd:
            return None
        best = alone = self._probe(_strip_paste(text), sigs, gate)
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
                stripped = [_strip_paste(p) for p in pieces]
                joined = self._probe("".join(stripped), sigs, gate)
                if not _says_more(joined, best):
                    continue
                others = [i for i in range(len(pieces)) if i != nb]
                clash = False
                for i in others:
                    if i not in checked:
                        checked[i] = self._probe(stripped[i], sigs, gate)[0]
                    if checked[i] is joined[0]:
                        clash = True
                        break
                if clash:
                    continue
                first = back[nb - 1][0] if nb else start
                last = fwd[nf - 1][0] if nf else start
                # Kept, and more pieces tried: the detail that names the rank may be one piece further.
                best, chosen = joined, (pieces[0] + "".join(stripped[1:]), first, nb, last, nf)
        return chosen if best is not alone else None

    def _probe(self, text: str, sigs: tuple[Signature, ...] | list[Signature],
               gate: bool) -> _Probe:
        """What ``text`` (already stripped) would be credited as, without crediting it.

        (signature or None, index of the pattern that matched, rank if the text names one, named details).
        """
        present = frozenset(k for k in self._keywords if k in text) if gate else frozenset()
        for sig in sigs:
            if gate and self._sig_keywords[sig.id].isdisjoint(present):
                continue
            index, m = _first_match(sig.patterns, text)
            if m is None:
                continue
            groups = {k for k, v in m.groupdict().items() if v is not None}
            for extra in sig.extract:
                em = extra.search(text)
                if em:
                    groups.update(k for k, v in em.groupdict().items() if v is not None)
            rank = m.groupdict().get("rank")
            found = _rank_int(rank) if rank else self._line_rank(text, None)
            return sig, index, found, len(groups)
        return None, -1, None, 0

    # -- matching ----------------------------------------------------------------------------------
    def _match_line(self, text: str, sigs: Iterable[Signature], gate: bool, name: str, file_index: int,
                    line_no: int, file_rank: int | None, lookback: Any) -> Signature | None:
        """Credit the line to the first signature that matches it; return that signature (or None)."""
        raw = text
        label = _SRUN_LABEL.match(text.lstrip("> "))
        if label is not None and self._wrapped_label(lookback, text):
            label = None
        text = _strip_paste(text)
        present = frozenset(k for k in self._keywords if k in text) if gate else frozenset()
        for sig in sigs:
            if gate and self._sig_keywords[sig.id].isdisjoint(present):
                continue
            index, m = _first_match(sig.patterns, text)
            if m is None:
                continue
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            for extra in sig.extract:
                em = extra.search(text)
                if em:
                    for k, v in em.groupdict().items():
                        if v is not None:
                            groups.setdefault(k, v)
            rank = _rank_int(groups.pop("rank")) if "rank" in groups else None
            if sig.context == "torchrun-summary":
                keep, summary_rank = self._torchrun_context(text, groups, lookback)
                if not keep:
                    return None
                if rank is None:
                    rank = summary_rank
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
                groups.setdefault("signal", _signal_name(groups["signal_number"]))
            if not sig.needs_distributed:
                self._distributed = True
            diag = self._found.get(sig.id)
            if diag is None:
                diag = self._found[sig.id] = Diagnosis(sig)
            ev = Evidence(name, line_no, raw.strip()[:MAX_EVIDENCE_CHARS])
            diag.add(ev, rank, index, groups, (file_index, line_no), _timestamp(text))
            return sig
        return None

    @staticmethod
    def _wrapped_label(lookback: Any, text: str) -> bool:
        """Whether an srun ``10: `` label at the start of ``text`` is only where a terminal cut a longer line.

        ``...NCCL version 2.18.5 10: ncclSystemError`` wrapped at ``1`` starts the next line with ``0: ``;
        under ``srun --label`` the line above carries a label too, a wrapped line's first piece does not.
        """
        above = lookback(1, strip=False)
        return bool(above) and len(above[0]) >= MIN_WRAP_CHARS and _SRUN_LABEL.match(above[0].lstrip("> ")) is None

    @staticmethod
    def _torchrun_context(text: str, groups: dict[str, str], lookback: Any) -> tuple[bool, int | None]:
        """Rank and root-cause flag of a line in torchrun's failure summary.

        The summary lists ``Root Cause (first observed failure):`` and ``Failures:`` entries; the ranks
        torchrun itself stopped with SIGTERM after the first failure are noise, not causes.
        """
        rank: int | None = None
        root = "failed (exitcode" in text  # the agent's own log line names the first failure
        if not root and ("exitcode" in text or "received by PID" in text):
            lines = lookback()
            for i, ln in enumerate(lines):
                m = _SUMMARY_RANK.match(ln)
                if m and rank is None:
                    rank = int(m.group(1))
                if _SUMMARY_ENTRY.match(ln):
                    root = i + 1 < len(lines) and "Root Cause" in lines[i + 1]
                    break
        number = _rank_int(groups.get("signal_number", ""))
        if number is not None and number in _SIGTERM_LIKE and not root:
            return False, rank
        return True, rank

    @staticmethod
    def _ignored_exception(lookback: Any) -> bool:
        """Whether the traceback ending at this line follows Python's "Exception ignored in: ..." header.

        Python prints exceptions raised in ``__del__`` and at interpreter exit that way and carries on,
        e.g. DataLoader workers' "AssertionError: can only test a child process" at the end of a run that
        finished fine; such a line did not end the rank.
        """
        lines = [_LINE_PREFIX_RANK.sub("", ln, count=1) for ln in lookback(TRACEBACK_LOOKBACK_LINES)]
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
        Only hit lines pay for this walk (at most ``TRACEBACK_LOOKBACK_LINES`` lines, within 8 KiB).
        """
        seen_traceback = False
        lines = lookback(TRACEBACK_LOOKBACK_LINES)
        for i, ln in enumerate(lines):
            if i + 1 < len(lines) and _wraps_onto(lines[i + 1], ln) and not ln.startswith("Traceback"):
                continue  # the rest of a long frame line a terminal wrapped: still inside the traceback
            m = _SPAWN_HEADER.search(ln)
            if m:
                return int(m.group(1))
            if "traceback :" in ln:
                seen_traceback = True
            elif seen_traceback:
                m = _SUMMARY_RANK.match(ln)
                if m:
                    return int(m.group(1))
            if _SUMMARY_ENTRY.match(ln) or (ln and not ln[:1].isspace() and not ln.startswith("Traceback")):
                return None  # left the traceback: whatever names a rank further up is another block
        return None

    @staticmethod
    def _line_rank(text: str, file_rank: int | None) -> int | None:
        m = _LINE_PREFIX_RANK.match(text)
        if m:
            return int(m.group(1) or m.group(2) or m.group(3))  # at most MAX_RANK_DIGITS by the regex
        if file_rank is not None:
            return file_rank
        m = _PG_RANK.search(text)
        if m:
            return int(m.group(1))
        if "NCCL" in text:
            m = _NCCL_RANK.search(text)
            if m:
                return int(m.group(1))
        return None

    # -- result ------------------------------------------------------------------------------------
    def result(self) -> ExplainResult:
        found = self._found
        diags = [d for d in found.values() if not any(s in found for s in d.signature.suppressed_by)
                 and (self._distributed or not d.signature.needs_distributed)]
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
        return ExplainResult(ordered, list(self.files), self.lines_scanned, self.bytes_scanned, self.lines_windowed)


def error_file_text(data: bytes) -> str | None:
    """The log lines a torchrun worker error file stands for, or None if ``data`` is not one.

    torchrun gives each worker TORCHELASTIC_ERROR_FILE ({log_dir}/attempt_N/RANK/error.json); a worker whose
    entry point is decorated with ``torch.distributed.elastic.multiprocessing.errors.record`` writes its
    exception there as ``{"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack":
    "Traceback ...", "timestamp": "..."}}}`` (errors/error_handler.py). The traceback is the worker's real
    failure; torchrun's own summary only says the rank exited with code 1. Parsed by
    ``ddpdoctor.safejson.loads_untrusted`` (no code runs; NaN, 1e400, huge numbers and deep nesting are refused:
    torchrun never writes them, so such a file is scanned as plain text instead).
    """
    try:
        doc = loads_untrusted(data)
    except (ValueError, UnicodeDecodeError, RecursionError):  # UntrustedJSONError is a ValueError
        return None
    if not isinstance(doc, dict) or "message" not in doc:
        return None
    message = doc["message"]
    lines: list[str] = []
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        text = message.get("message")
        if isinstance(stack, str):
            lines.append(stack.rstrip("\n"))
        if isinstance(text, str) and not (isinstance(stack, str) and text in stack):
            lines.append(text)
    elif isinstance(message, str):
        lines.append(message)
    return "\n".join(lines) + "\n" if lines else None


class _Prefixed(io.RawIOBase):
    """``head`` (bytes already read while sniffing the input) followed by the rest of ``stream``."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self._head = memoryview(head)
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head.nbytes:
            n = min(len(buffer), self._head.nbytes)
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        readinto = getattr(self._stream, "readinto", None)
        if readinto is not None:  # straight into the scanner's buffer: no copy per chunk
            return cast(int, readinto(buffer) or 0)
        data = self._stream.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class _Utf16AsUtf8(io.RawIOBase):
    """A UTF-16 stream (its byte-order mark first) read as UTF-8, a piece at a time (memory stays flat).

    Windows PowerShell 5 writes ``python train.py > log.txt`` as UTF-16LE with a BOM: every other byte is
    NUL, so no keyword would ever match. Undecodable code units become U+FFFD, as in a UTF-8 log.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-16")(errors="replace")  # reads and drops the BOM
        self._pending = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending and not self._eof:
            data = self._stream.read(1 << 20)
            self._eof = not data
            self._pending = self._decoder.decode(data, final=self._eof).encode("utf-8", errors="replace")
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def _read_up_to(stream: IO[bytes], limit: int) -> bytes:
    """Up to ``limit`` bytes: a raw stream's read() may return less than asked before its end."""
    parts, have = [], 0
    while have < limit:
        data = stream.read(limit - have)
        if not data:
            break
        parts.append(data)
        have += len(data)
    return b"".join(parts)


def _sniffed(stream: IO[bytes]) -> IO[bytes]:
    """The stream as UTF-8-compatible bytes: a UTF-16 one is transcoded.

    UTF-16 is recognised by its byte-order mark and NULs in at least a quarter of the next bytes (log text
    is mostly ASCII, whose UTF-16 high bytes are NUL): a UTF-8 log that merely starts with the bytes FF FE
    (garbage) is not taken for one.
    """
    head = _read_up_to(stream, 4096)
    rest = cast(IO[bytes], _Prefixed(head, stream))
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) and head[2:].count(0) * 4 >= len(head) - 2:
        return cast(IO[bytes], _Utf16AsUtf8(rest))
    return rest


def explain_streams(streams: Iterable[tuple[str, IO[bytes], int | None]],
                    kb: list[Signature] | None = None) -> ExplainResult:
    """Scan (name, binary stream, rank-or-None) inputs in order and return the ordered diagnoses.

    An input named ``*.json`` that is a torchrun worker error file is read as the traceback it holds; a
    UTF-16 input with a byte-order mark is read as text.
    """
    scanner = Scanner(kb)
    for name, stream, rank in streams:
        stream = _sniffed(stream)
        if name.endswith(".json"):
            head = _read_up_to(stream, MAX_ERROR_FILE_BYTES + 1)
            text = error_file_text(head) if len(head) <= MAX_ERROR_FILE_BYTES else None
            stream = io.BytesIO(text.encode("utf-8")) if text is not None else cast(IO[bytes], _Prefixed(head, stream))
        scanner.scan(name, stream, rank)
    return scanner.result()


def explain_text(text: str | bytes, name: str = "<text>", file_rank: int | None = None) -> ExplainResult:
    """Convenience for tests and the Python API: explain an in-memory log."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return explain_streams([(name, io.BytesIO(data), file_rank)])


def _strip_paste(text: str) -> str:
    """The line without what pasting added in front of it (quote marks, line numbers, runner prefixes)."""
    for _ in range(4):  # "> [12] (Actor pid=1) ..." nests a few; a bound keeps it linear
        m = _PASTE_PREFIX.match(text)
        if m is None or not m.end():
            break
        text = text[m.end():]
    return text


def render_text(result: ExplainResult) -> str:
    """The human report: one numbered block per diagnosis, root cause first."""
    nfiles = len(result.files)
    where = f"{nfiles} input{'s' if nfiles != 1 else ''}, {result.lines_scanned:,} lines"
    windowed = ""
    if result.lines_windowed:
        n = result.lines_windowed
        windowed = (f"note: {n:,} line{'s' if n != 1 else ''} longer than {MAX_MATCH_CHARS:,} bytes "
                    f"{'was' if n == 1 else 'were'} matched on {'its' if n == 1 else 'their'} first and last "
                    f"{MAX_MATCH_CHARS:,} bytes only (what lies between was not searched).\n")
    if not result.diagnoses:
        return f"ddpdoctor explain: no known DDP/NCCL/torchrun error found ({where}).\n" + windowed
    n = len(result.diagnoses)
    out = [f"ddpdoctor explain: {n} known problem{'s' if n != 1 else ''} found ({where}); root cause first.", ""]
    for i, d in enumerate(result.diagnoses, 1):
        sig = d.signature
        ranks = format_rank_list(list(d.ranks)) if d.ranks else "unknown"
        out.append(f"{i}. {sig.title}  [{sig.id}]")
        out.append(f"   ranks: {ranks}   lines: {d.count}")
        if d.details:
            out.append("   details: " + ", ".join(f"{k}={'/'.join(v)}" for k, v in d.details.items()))
        out.append("   evidence:")
        for ev in d.evidence:
            out.append(f"     {ev.file}:{ev.line}: {ev.text}")
        if d.count > len(d.evidence):
            out.append(f"     ... and {d.count - len(d.evidence)} more matching line(s)")
        out.extend(f"   note: {note}" for note in d.notes)
        out.append(f"   why:  {sig.cause}")
        out.append(f"   fix:  {sig.remedy}")
        out.append(f"   next: {sig.command}")
        out.append("")
    return "\n".join(out) + windowed
