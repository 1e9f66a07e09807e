"""Where a log ends: inside a start-up phase or a collective, with nothing after it (a probable hang).

A hung job prints no error: its log just stops. What it printed last says where it waits, when that is a
phase whose start PyTorch or NCCL logs and whose end they log too (the texts and where they come from):

* **rendezvous** (torchrun's agent, ``torch/distributed/elastic``): ``[default] Rendezvous'ing worker group``
  (``agent/server/api.py``) or ``The node '...' attempts to join the next round of the rendezvous '...'``
  (``rendezvous/dynamic_rendezvous.py``), ended by ``Rendezvous complete for workers`` /
  ``has joined round N of the rendezvous``;
* **store connect** (c10d's TCPStore client, ``TCPStore.cpp``): ``TCP client failed to connect/validate to
  host H:P - retrying (try=N, ...)``, ended by ``The client socket has connected to`` (``socket.cpp``);
  its end is logged at debug level only, so the phase counts as open only after two retries to the same
  endpoint with nothing but retries and chatter after them;
* **store barrier** (``init_process_group``/``new_group``, ``distributed_c10d._store_based_barrier``):
  ``Waiting in store based barrier to initialize process group for rank: R, key: K (world_size=N,
  worker_count=M, timeout=T)`` (torch 1.x, INFO) or ``... for S seconds``\\ ``rank: R, key: K (world_size=N,
  num_workers_joined=M, timeout=T error=E)`` (torch 2.x, DEBUG; the two literals are joined without a space),
  ended by ``Rank R: Completed store-based barrier for key:K with N nodes.``;
* **NCCL communicator init** (NCCL ``src/init.cc``): ``NCCL INFO [Rank R] ncclCommInitRank... comm 0x... rank R
  nranks N ... - Init START`` without the ``- Init COMPLETE`` of the same communicator (PyTorch >= 2.2 creates
  communicators at the first collective, so this is also "inside the first collective");
* **init_process_group** (a training script's own start-up line): ``| distributed init (rank R): env://, gpu G``,
  which the ``init_distributed_mode`` of DeiT, MAE, DINO, ConvNeXt, BEiT and the many projects that copied it
  prints right before ``torch.distributed.init_process_group(...)`` and ``torch.distributed.barrier()``, and ended
  by whatever the script prints next (rank 0 goes on printing; the others are silenced by ``setup_for_distributed``);
* **Lightning's init_process_group** (``lightning/fabric/utilities/distributed.py``, ``_init_dist_connection``;
  PyTorch Lightning 1.x's ``initializing ddp: ...``): ``Initializing distributed: GLOBAL_RANK: R, MEMBER: R+1/N``
  (logged by every rank right before ``init_process_group``), ended by rank 0's ``All distributed processes
  registered. Starting with N processes`` (printed once the process group is up, so it ends every rank's);
* **Lightning's start of training**: that line of rank 0, then nothing but its ``-----`` rules and chatter: the
  ranks are in the first collective (DDP's parameter broadcast, where NCCL sets up its communicators) or a rank
  is stuck before it; a healthy job prints its ``LOCAL_RANK: R - CUDA_VISIBLE_DEVICES`` lines, model summary or
  progress right after it;
* **first collective**: every communicator completed (``Init COMPLETE``) and then nothing but NCCL INFO
  lines, where the log also holds rank 0's ``NCCL version`` line and the job's own output before NCCL's
  lines (a pasted excerpt of NCCL's INFO lines alone proves nothing: a healthy job's look the same).

The phase is open at the end when, after its last start line, every line is another phase line or quiet
chatter (NCCL INFO lines, glog I/W lines, Python warnings, torchrun's banner); any other line means the job
moved on. PyTorch's watchdog prints nothing for a collective that is slow but not yet timed out (no such
message exists in torch 2.13's c10d or NCCL 2.28), so a hang inside a later collective leaves no line to
find: that is what ``ddpdoctor watch`` is for.

Only the end of each input is read (the last ``TAIL_BYTES``, kept by the scanner as it streams), so this
costs nothing per block: a hang is a property of where a log stops.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ddpdoctor.explain.lines import (
    LINE_PREFIX_RANK,
    quiet_level,
    rank_int,
    strip_paste,
    timestamp,
    wraps_onto,
)

TAIL_BYTES = 1 << 20  # the end of each input that is read: 64 ranks' NCCL init lines fit in it
MAX_TAIL_LINE_CHARS = 4096  # scanner.MAX_MATCH_CHARS (no regex is handed more); markers sit at a line start
MAX_CONTINUATION_PIECES = 3  # a wrapped phase line is rejoined from at most this many pieces after it
RECORD_HEAD_CHARS = 12  # how much of a record's first piece says "a new record of the same kind" (_continues)

RENDEZVOUS = "rendezvous"
STORE_CONNECT = "store connect"
STORE_BARRIER = "store barrier"
NCCL_INIT = "NCCL communicator init"
FIRST_COLLECTIVE = "first collective"
SCRIPT_INIT = "init_process_group"
LIGHTNING_INIT = "Lightning's init_process_group"
LIGHTNING_START = "Lightning's start of training"

_RDZV_OPEN = re.compile(r"Rendezvous'ing worker group|The node '[^']*' attempts to join the next round of the "
                        r"rendezvous '(?P<run_id>[^']*)'")
_RDZV_CLOSE = re.compile(r"Rendezvous complete for workers|has joined round \d+ of the rendezvous")
_CONNECT_RETRY = re.compile(r"TCP client failed to connect/validate to host (?P<endpoint>\S+?) - retrying")
_CONNECT_CLOSE = re.compile(r"The client socket has connected to")
_BARRIER_OPEN = re.compile(
    r"Waiting in store based barrier to initialize process group for (?:[\d.]+ seconds ?)?rank: (?P<rank>\d{1,7}), "
    r"key: (?P<key>[^ ]+) \(world_size=(?P<world_size>\d{1,7}), (?:worker_count|num_workers_joined)="
    r"(?P<workers_joined>\d{1,7}), timeout=(?P<timeout>[^)]*?)(?: error=.*)?\)")
_BARRIER_CLOSE = re.compile(r"(?:Rank (?P<rank>\d{1,7}): )?Completed store-based barrier for key")
_NCCL_START = re.compile(r"NCCL INFO (?:\[Rank \d+\] )?(?:\w+ )?comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d{1,7}) "
                         r"nranks (?P<nranks>\d{1,7}) .*- Init START")
_NCCL_COMPLETE = re.compile(r"NCCL INFO (?:\w+ )?comm (?P<comm>0x[0-9a-fA-F]+) rank \d{1,7} nranks \d{1,7} "
                            r".*- Init COMPLETE")
_NCCL_VERSION = re.compile(r"NCCL INFO NCCL version \d")
# facebookresearch's init_distributed_mode (deit utils.py, mae util/misc.py, dino utils.py, ...):
# print('| distributed init (rank {}): {}, gpu {}'.format(args.rank, args.dist_url, args.gpu), flush=True), then
# init_process_group and barrier; DeiT's omits ", gpu {}", later copies add ", world size {}".
_SCRIPT_INIT = re.compile(r"^\|? ?distributed init \(rank (?P<rank>\d{1,7})\): (?P<url>[^,\s]{1,200})")
# Lightning (fabric/utilities/distributed.py _init_dist_connection, and PyTorch Lightning 1.x's ddp plugins):
# log.info(f"Initializing distributed: GLOBAL_RANK: {global_rank}, MEMBER: {global_rank + 1}/{world_size}"),
# init_process_group(...), then rank_zero_info("-" * 100 + "\ndistributed_backend=...\nAll distributed processes
# registered. Starting with {world_size} processes\n" + "-" * 100).
LIGHTNING_INIT_LINE = re.compile(r"[Ii]nitializing (?:distributed|ddp): GLOBAL_RANK: (?P<rank>\d{1,7}), "
                                 r"MEMBER: \d{1,7}/(?P<world_size>\d{1,7})")
_LIGHTNING_UP = re.compile(r"All distributed processes registered\. Starting with (?P<world_size>\d{1,7}) process")
_NCCL_HOST = re.compile(r"^(?P<host>[\w.-]+:\d+):\d+ \[\d+\] NCCL ")
# Lines that say nothing about progress: the launcher's banner, Python's echo of a warning's source line, and
# the C++ stack c10 appends to a logged error (c10/util/Exception.cpp: "Exception raised from recvBytes at
# ...", "frame #3: ...", "<omitting python frames>"), e.g. under each of TCPStore's retry warnings.
# Lightning's rules around its start-up banner (100 dashes) and its distributed_backend= line say nothing either.
_CHATTER = re.compile(r"^\*{5,}\s*$|^-{20,}\s*$|^distributed_backend=\w+\s*$"
                      r"|^Setting OMP_NUM_THREADS environment variable|^\s+warnings\.warn\(|NCCL INFO "
                      r"|^Exception raised from \S+ at |^frame #\d+: |^<omitting python frames>")

# A glog info/warning/debug line, as c10d, torchrun and torch._logging print them ("[rank0]:[W1126 ...",
# "I1126 ...", "[rank0]:V1126 ..."): chatter (see lines.quiet_level, which this anchored test short-cuts).
_GLOG_QUIET = re.compile(r"^\s*(?:\[(?:rank|default)\d{1,7}\]:)?\[?[WIV]\d{4} \d\d:\d\d:\d\d")

MAX_EVIDENCE_LINES = 5
# Every phase line holds one of these (see the regexes above).
MARKER_WORDS = ("Init START", "Init COMPLETE", "store based barrier", "store-based barrier", "Rendezvous",
                "rendezvous", "connect/validate", "client socket has connected", "distributed init (rank",
                "GLOBAL_RANK: ", "distributed processes registered")
_MARKER_BYTES = tuple(w.encode() for w in MARKER_WORDS)


@dataclass(frozen=True)
class Marker:
    """One line of the tail that opens or closes a phase."""

    phase: str
    opens: bool
    key: str  # who is in the phase: a rank, a communicator, an agent, an endpoint
    line: int
    text: str
    rank: int | None
    time: tuple[int, ...] | None
    details: tuple[tuple[str, str], ...] = ()


@dataclass
class PhaseEnd:
    """An input that ends inside a phase: which, on which ranks, and the lines that show it."""

    file: str
    file_index: int
    phases: list[str]
    line: int  # the last line that opened a still-open phase
    markers: list[Marker] = field(default_factory=list)  # the last open line of each key, in input order

    @property
    def evidence(self) -> list[Marker]:
        """The open lines to show: the last ``MAX_EVIDENCE_LINES`` of them."""
        return self.markers[-MAX_EVIDENCE_LINES:]

    @property
    def ranks(self) -> set[int]:
        return {m.rank for m in self.markers if m.rank is not None}

    @property
    def time(self) -> tuple[int, ...] | None:
        times = [m.time for m in self.markers if m.time is not None]
        return min(times) if times else None

    def details(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {"phase": list(self.phases)}
        for m in self.markers:
            for k, v in m.details:
                values = out.setdefault(k, [])
                if v not in values:
                    values.append(v)
        waiting = {m.rank for m in self.markers if m.phase == STORE_BARRIER and m.rank is not None}
        sizes = {v for m in self.markers if m.phase == STORE_BARRIER for k, v in m.details if k == "world_size"}
        joined = {v for m in self.markers if m.phase == STORE_BARRIER for k, v in m.details if k == "workers_joined"}
        if len(sizes) == 1 and len(joined) == 1:
            world, count = int(next(iter(sizes))), int(next(iter(joined)))
            # Every rank that joined the barrier logs its wait: when as many ranks wait as joined, the others
            # never came. (A count above the world size means stale keys: nothing can be said.)
            if count == len(waiting) < world <= 65536:
                out["ranks_not_seen"] = [_rank_list(sorted(set(range(world)) - waiting))]
        return out


def _rank_list(ranks: list[int]) -> str:
    from ddpdoctor.ranks import format_rank_list

    return format_rank_list(ranks)


def _may_be_marker(raw: str) -> bool:
    """A substring test every phase line passes (cheap: most lines are no phase line)."""
    return any(word in raw for word in MARKER_WORDS)


def _marker(raw: str, line: int, file_rank: int | None) -> Marker | None:
    """The phase line ``raw`` is (after its paste and rank prefixes), or None."""
    if not _may_be_marker(raw):
        return None
    text = strip_paste(raw)
    prefix = LINE_PREFIX_RANK.match(text)
    line_rank = file_rank
    if prefix:
        line_rank = rank_int(prefix.group(1) or prefix.group(2) or prefix.group(3) or "")
        text = text[prefix.end():].lstrip()
        text = strip_paste(text)
    when = timestamp(raw)
    if "NCCL INFO" in text:
        host = _NCCL_HOST.match(text)
        who = host.group("host") if host else ""
        m = _NCCL_START.search(text)
        if m:
            return Marker(NCCL_INIT, True, f"{who}/{m.group('comm')}", line, raw, rank_int(m.group("rank")), when,
                          (("nranks", m.group("nranks")),))
        m = _NCCL_COMPLETE.search(text)
        if m:
            return Marker(NCCL_INIT, False, f"{who}/{m.group('comm')}", line, raw, line_rank, when)
        return None
    m = _BARRIER_OPEN.search(text)
    if m:
        rank = rank_int(m.group("rank"))
        return Marker(STORE_BARRIER, True, f"rank {rank}", line, raw, rank, when,
                      (("world_size", m.group("world_size")), ("workers_joined", m.group("workers_joined")),
                       ("timeout", m.group("timeout"))))
    m = _BARRIER_CLOSE.search(text)
    if m:
        rank = rank_int(m.group("rank")) if m.group("rank") else line_rank
        return Marker(STORE_BARRIER, False, f"rank {rank}" if rank is not None else "", line, raw, rank, when)
    m = _SCRIPT_INIT.search(text)
    if m:
        rank = rank_int(m.group("rank"))
        return Marker(SCRIPT_INIT, True, f"rank {rank}", line, raw, rank, when, (("init_method", m.group("url")),))
    m = LIGHTNING_INIT_LINE.search(text)
    if m:
        rank = rank_int(m.group("rank"))
        return Marker(LIGHTNING_INIT, True, f"rank {rank}", line, raw, rank, when,
                      (("world_size", m.group("world_size")),))
    m = _LIGHTNING_UP.search(text)
    if m:  # ends every rank's init (the process group is up), and opens the start of training
        return Marker(LIGHTNING_START, True, "job", line, raw, None, when, (("world_size", m.group("world_size")),))
    m = _RDZV_OPEN.search(text)
    if m:
        details = (("rendezvous", m.group("run_id")),) if m.group("run_id") else ()
        return Marker(RENDEZVOUS, True, "agent", line, raw, line_rank, when, details)
    if _RDZV_CLOSE.search(text):
        return Marker(RENDEZVOUS, False, "agent", line, raw, line_rank, when)
    m = _CONNECT_RETRY.search(text)
    if m:
        return Marker(STORE_CONNECT, True, m.group("endpoint"), line, raw, line_rank, when,
                      (("endpoint", m.group("endpoint")),))
    if _CONNECT_CLOSE.search(text):
        return Marker(STORE_CONNECT, False, "", line, raw, line_rank, when)
    return None


def chatter(raw: str) -> bool:
    """Whether a line says nothing about progress (NCCL INFO, glog info/warning, Python warnings, c10's C++
    stack, torchrun's banner): see ``_chatter``."""
    return _chatter(raw)


def _chatter(raw: str) -> bool:
    """Whether a line that is no phase line says nothing about progress (see the module docstring)."""
    if "NCCL INFO " in raw or _GLOG_QUIET.match(raw):
        return True  # the two most common kinds, decided without the general level search
    text = strip_paste(raw)
    prefix = LINE_PREFIX_RANK.match(text)
    if prefix:
        text = text[prefix.end():].lstrip()
    return bool(_CHATTER.search(text)) or quiet_level(raw)


def tail_lines(tail: bytes, at_file_start: bool, last_line: int) -> tuple[list[str], int]:
    """The whole lines of an input's last bytes and the 1-based number of the first: the line the tail cut
    (its first, unless ``tail`` is the whole input) and the empty piece after a final newline are dropped."""
    lines = tail.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not at_file_start and lines:
        lines.pop(0)
    return lines, last_line - len(lines) + 1


def where_input_ends(tail: bytes, at_file_start: bool, last_line: int, name: str, file_index: int,
                     file_rank: int | None) -> PhaseEnd | None:
    """The phase the input whose last bytes are ``tail`` ends in, or None (see the module docstring).

    ``last_line`` is the 1-based number of the input's last line; ``at_file_start`` says ``tail`` is the whole
    input (else its first, cut line is dropped).
    """
    # Every phase (and the first collective's Init COMPLETE) needs a line holding a marker word: without one in
    # the tail there is nothing to find, and classifying up to 1 MiB of lines that all read as chatter (a
    # trainer logging at INFO level: nothing before its last line "shows progress") cost 0.5-1.5 s an input,
    # most of a 25 MB scan. A substring test over the tail costs milliseconds; line breaks (and a quote mark
    # after them) are removed first, so that a phase line a terminal wrapped inside a marker word passes it.
    flat = tail.replace(b"\n> ", b"\n").translate(None, b"\r\n")
    if not any(word in flat for word in _MARKER_BYTES):
        return None
    lines, first_no = tail_lines(tail, at_file_start, last_line)
    # Whatever was open before the last line that shows progress was closed by it: only what follows that
    # line (and the pieces it may be the wrapped rest of) can tell where the input stops. On a healthy log
    # that is its last line or so; the rest of the tail is never classified.
    start = _last_progress(lines)
    if start is not None:
        skip = max(0, start - MAX_CONTINUATION_PIECES)
        first_no += skip
        lines = lines[skip:]
    open_: dict[tuple[str, str], Marker] = {}
    retries: dict[str, int] = {}
    nccl_block_start: int | None = None  # index where the trailing run of NCCL/chatter lines began
    saw_version = saw_complete = False
    own_output_before = False
    for i, raw, marker in _logical_lines(lines, first_no, file_rank):
        if marker is None:
            if _chatter(raw):
                if "NCCL INFO" in raw:
                    if nccl_block_start is None:
                        nccl_block_start, saw_version, saw_complete = i, False, False
                    saw_version = saw_version or bool(_NCCL_VERSION.search(raw))
                continue
            # The job moved on: whatever was open before this line is not where it stopped.
            open_.clear()
            retries.clear()
            nccl_block_start = None
            own_output_before = True
            continue
        if marker.phase == NCCL_INIT:
            if nccl_block_start is None:
                nccl_block_start, saw_version, saw_complete = i, False, False
            saw_complete = saw_complete or not marker.opens
        else:
            nccl_block_start = None
        if marker.phase == LIGHTNING_START:
            open_ = {k: v for k, v in open_.items() if k[0] != LIGHTNING_INIT}
        if marker.opens:
            if marker.phase == STORE_CONNECT:
                retries[marker.key] = retries.get(marker.key, 0) + 1
            open_[(marker.phase, marker.key)] = marker
        elif marker.phase == RENDEZVOUS:
            open_ = {k: v for k, v in open_.items() if k[0] != RENDEZVOUS}
        elif marker.phase == STORE_CONNECT:
            open_ = {k: v for k, v in open_.items() if k[0] != STORE_CONNECT}
            retries.clear()
        elif marker.phase == STORE_BARRIER and not marker.key:
            open_ = {k: v for k, v in open_.items() if k[0] != STORE_BARRIER}
        else:
            open_.pop((marker.phase, marker.key), None)
    # A store connect whose end is not logged at the default level counts only when it kept retrying.
    markers = [m for m in open_.values() if m.phase != STORE_CONNECT or retries.get(m.key, 0) >= 2]
    if markers:
        markers.sort(key=lambda m: m.line)
        phases = []
        for m in markers:
            if m.phase not in phases:
                phases.append(m.phase)
        return PhaseEnd(name, file_index, phases, markers[-1].line, markers)
    if nccl_block_start is not None and saw_version and saw_complete and own_output_before:
        block = [(first_no + i, raw.rstrip("\r")[:MAX_TAIL_LINE_CHARS]) for i, raw in enumerate(lines)
                 if i >= nccl_block_start and "Init COMPLETE" in raw]
        ends = [Marker(FIRST_COLLECTIVE, True, str(no), no, text, _nccl_rank(text, file_rank), timestamp(text))
                for no, text in block]
        return PhaseEnd(name, file_index, [FIRST_COLLECTIVE], ends[-1].line, ends)
    return None


def _last_progress(lines: list[str]) -> int | None:
    """The index of the last line that is neither a phase line, nor chatter, nor the wrapped rest of the line
    above it: the last sign that the job moved on (see ``where_input_ends``)."""
    for i in range(len(lines) - 1, -1, -1):
        raw = lines[i].rstrip("\r")[:MAX_TAIL_LINE_CHARS]
        if not raw.strip() or _may_be_marker(raw) or _chatter(raw):
            continue
        above = lines[i - 1].rstrip("\r")[:MAX_TAIL_LINE_CHARS] if i else ""
        if above and _continues(above, above, raw):
            continue  # may be a piece of a wrapped phase line: the forward pass decides
        return i
    return None


def _continues(first: str, above: str, piece: str) -> bool:
    """Whether ``piece`` may be the wrapped rest of the record that began with the line ``first`` (``above``
    being the piece before it): ``lines.wraps_onto``, and it does not begin the way that record began (the
    next "INFO:root:Waiting ..." line of a run of them is a new record, not the rest of the last one)."""
    head = first[:RECORD_HEAD_CHARS]
    return wraps_onto(above, piece) and not (len(head) == RECORD_HEAD_CHARS and piece.startswith(head))


def _logical_lines(lines: list[str], first_no: int,
                   file_rank: int | None) -> Iterator[tuple[int, str, Marker | None]]:
    """(index, line, the phase line it is) for each non-blank line, terminal-wrapped pieces rejoined.

    A phase line a terminal cut at its width (issue 15) is matched on its pieces joined (up to
    ``MAX_CONTINUATION_PIECES`` after it). The pieces after any line that look like its wrapped rest
    (``_continues``) are skipped rather than taken for the job's own output: the rest of a wrapped
    waiting line is not a sign that the job moved on.
    """
    i, n = 0, len(lines)
    while i < n:
        raw = lines[i].rstrip("\r")[:MAX_TAIL_LINE_CHARS]
        if not raw.strip():
            i += 1
            continue
        marker = _marker(raw, first_no + i, file_rank)
        j = i + 1
        if marker is None:
            joined, above = raw, raw
            for k in range(i + 1, min(n, i + 1 + MAX_CONTINUATION_PIECES)):
                piece = lines[k].rstrip("\r")[:MAX_TAIL_LINE_CHARS]
                if not _continues(raw, above, piece) or len(joined) + len(piece) > MAX_TAIL_LINE_CHARS:
                    break  # (no regex is handed more than MAX_MATCH_CHARS: see scanner)
                joined += strip_paste(piece)
                above = piece
                found = _marker(joined, first_no + i, file_rank)
                if found is not None:
                    marker, j = found, k + 1
                    break
        yield i, (marker.text if marker is not None else raw), marker
        # The wrapped rest of this line, if any: neither a phase line nor the job's output.
        pieces, above = 0, lines[j - 1].rstrip("\r")
        while j < n and pieces < MAX_CONTINUATION_PIECES:
            piece = lines[j].rstrip("\r")[:MAX_TAIL_LINE_CHARS]
            if not _continues(raw, above, piece) or _marker(piece, first_no + j, file_rank) is not None:
                break
            above, j, pieces = piece, j + 1, pieces + 1
        i = j


def _nccl_rank(text: str, file_rank: int | None) -> int | None:
    m = re.search(r" rank (\d{1,7}) nranks ", text)
    return rank_int(m.group(1)) if m else file_rank
