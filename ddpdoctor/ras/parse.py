"""NCCL RAS status outputs (JSON from NCCL 2.28.7, text before and by default) as one :class:`RasStatus`.

Both formats are NCCL's own (``src/ras/client_support.cc``): the JSON is a dump of every communicator's
ranks (``collective_counts`` per operation, ``status``) and ``missing_ranks`` (``unresponsive``,
``considered_dead``); the text is a human summary whose ``Errors`` section lists ``INCOMPLETE`` and
``DEAD`` processes and per-communicator missing ranks, and whose ``Warnings`` section lists
``MISMATCH``-ed operation counts. The text parser reads only those lines; anything else is kept verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.errors import DoctorError
from ddpdoctor.safejson import UntrustedJSONError, loads_untrusted


@dataclass
class RasRank:
    """A rank that answered for its communicator."""

    rank: int
    host: str | None = None
    pid: int | None = None
    cuda_dev: int | None = None
    counts: dict[str, int] = field(default_factory=dict)  # operation -> operations launched
    status: dict[str, Any] = field(default_factory=dict)


@dataclass
class RasMissingRank:
    """A rank RAS could not get data from: unresponsive (still trying) or considered dead (gave up)."""

    rank: int
    host: str | None = None
    pid: int | None = None
    cuda_dev: int | None = None
    unresponsive: bool = True
    dead: bool = False


@dataclass
class RasCommunicator:
    """One NCCL communicator as RAS saw it (``label`` is the text output's ``#group-index``)."""

    hash: str
    size: int | None = None
    label: str = ""
    ranks: list[RasRank] = field(default_factory=list)
    missing: list[RasMissingRank] = field(default_factory=list)
    # Text output only: operation -> {operations launched: comm ranks listed with that count}.
    count_groups: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    # Text output only: operation -> {operations launched: how many ranks (NCCL lists only outliers)}.
    count_sizes: dict[str, dict[int, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass
class RasProcess:
    """A job process named in the text output's ``INCOMPLETE``/``DEAD`` sections."""

    pid: int
    host: str
    gpus: str


@dataclass
class RasStatus:
    """Everything the verdict needs, whichever format it came from."""

    format: str
    nccl_version: str | None = None
    communicators: list[RasCommunicator] = field(default_factory=list)
    dead_processes: list[RasProcess] = field(default_factory=list)
    unresponsive_processes: list[RasProcess] = field(default_factory=list)
    dead_count: int = 0
    unresponsive_count: int = 0
    timeouts: int = 0


def parse_reply(body: str, fmt: str) -> RasStatus:
    """The status body in the format the service said it used."""
    return parse_json(body) if fmt == "json" else parse_text(body)


# A rank or communicator size beyond this is no job's (the bound ddpdoctor.fr and ddpdoctor.stacks use).
MAX_RANKS = 1 << 20
# Digits in one number of the text format: pids, ranks and operation counts all fit in 19.
MAX_DIGITS = 19


class _BadReply(ValueError):
    """A reply that NCCL's RAS would not send: a number out of range or of the wrong type."""


def _int(value: Any, what: str = "a number", maximum: int | None = None) -> int | None:
    """An integer field of the JSON reply: None when absent; a non-negative integer (at most ``maximum``)
    when present, else the reply is not NCCL's (a float, string or boolean is not guessed at)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (maximum is not None and value > maximum):
        bound = f" up to {maximum}" if maximum is not None else ""
        raise _BadReply(f"{what} is {str(value)[:40]!r}, not an integer from 0{bound}")
    return value


def _pid(value: Any, what: str) -> int | None:
    """A pid of the JSON reply; None when unknown. NCCL writes ``-1`` (with host ``"unknown"``) for a rank
    whose RAS peer it cannot find (client_support.cc ``rasDumpCommsToJSON``): that is NCCL's reply, not a
    bad one."""
    return None if value == -1 and not isinstance(value, bool) else _int(value, what)


def _str(value: Any, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _BadReply(f"{what} is {str(value)[:40]!r}, not a string")
    return value


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_json(body: str) -> RasStatus:
    """``SET FORMAT json`` output (NCCL >= 2.28.7); DoctorError when it is not that document.

    Read with :func:`ddpdoctor.safejson.loads_untrusted` (no NaN/Infinity, overflowing or huge numbers),
    and every number checked: something else listening on the RAS port must not crash or stall us.
    """
    try:
        doc = loads_untrusted(body)
    except UntrustedJSONError as exc:
        raise DoctorError(f"NCCL RAS sent JSON that does not parse ({exc}); "
                          "retry, or query the text format") from None
    try:
        return _parse_json_doc(doc)
    except _BadReply as exc:
        raise DoctorError(f"NCCL RAS sent a status that NCCL does not write ({exc}); is something else "
                          "listening on the RAS port?") from None


def _entries(value: Any, what: str) -> list[dict[str, Any]]:
    """A list of objects of the reply (``communicators``, a communicator's ``ranks``/``missing_ranks``):
    NCCL writes each as an array of objects (client_support.cc ``rasDumpCommsToJSON``). Anything else there
    is not NCCL's reply, and is refused rather than skipped: an entry skipped is a rank not judged, and a
    reply whose entries were all skipped would read as "every rank answered"."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _BadReply(f"{what} is {str(value)[:40]!r}, not a list")
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise _BadReply(f"{what}[{i}] is {str(entry)[:40]!r}, not an object")
    return value


def _rank_of(entry: dict[str, Any], what: str) -> int:
    """The ``rank`` every rank and missing-rank object of NCCL's reply carries (jsonWriteRankData,
    jsonWriteMissingRank)."""
    rank = _int(entry.get("rank"), f"{what}.rank", MAX_RANKS)
    if rank is None:
        raise _BadReply(f"{what} has no rank")
    return rank


def _parse_json_doc(doc: Any) -> RasStatus:
    # NCCL always writes the list (jsonWriteHeader/jsonWriteFooter), so a document without one, or with
    # one that holds no rank at all, is not a status to judge: it must never read as an all-clear.
    if not isinstance(doc, dict) or not isinstance(doc.get("communicators"), list):
        raise DoctorError("NCCL RAS sent JSON without a 'communicators' list; not a RAS status document")
    status = RasStatus(format="json", nccl_version=_str(doc.get("nccl_version"), "nccl_version"))
    ras = _obj(doc.get("ras"))
    status.timeouts = _int(ras.get("timeouts_count"), "timeouts_count") or 0
    for ci, comm in enumerate(_entries(doc["communicators"], "communicators")):
        where = f"communicators[{ci}]"
        c = RasCommunicator(hash=str(_str(comm.get("hash"), "hash") or "?"),
                            size=_int(comm.get("size"), "size", MAX_RANKS))
        for ri, r in enumerate(_entries(comm.get("ranks"), f"{where}.ranks")):
            counts = _obj(r.get("collective_counts"))
            c.ranks.append(RasRank(
                rank=_rank_of(r, f"{where}.ranks[{ri}]"), host=_str(r.get("host"), "host"),
                pid=_pid(r.get("pid"), "pid"), cuda_dev=_int(r.get("cuda_dev"), "cuda_dev"),
                counts={str(k): n for k, v in counts.items() if (n := _int(v, f"count {k}")) is not None},
                status=_obj(r.get("status"))))
        for mi, m in enumerate(_entries(comm.get("missing_ranks"), f"{where}.missing_ranks")):
            st = _obj(m.get("status"))
            c.missing.append(RasMissingRank(
                rank=_rank_of(m, f"{where}.missing_ranks[{mi}]"), host=_str(m.get("host"), "host"),
                pid=_pid(m.get("pid"), "pid"), cuda_dev=_int(m.get("cuda_dev"), "cuda_dev"),
                unresponsive=bool(st.get("unresponsive", True)), dead=bool(st.get("considered_dead", False))))
        status.communicators.append(c)
    if not any(c.ranks or c.missing for c in status.communicators):
        raise DoctorError("NCCL RAS sent a status that names no rank (no communicator lists a rank that answered "
                          "or one that is missing): the processes hold no NCCL communicator (before the first "
                          "collective, or after destroy_process_group); nothing to judge")
    status.dead_count = len({(m.host, m.pid) for c in status.communicators for m in c.missing if m.dead})
    status.unresponsive_count = len({(m.host, m.pid) for c in status.communicators for m in c.missing
                                     if m.unresponsive and not m.dead})
    return status


_VERSION = re.compile(r"^NCCL version (\S+)")
_PROCESS = re.compile(r"^\s+Process (\d+) on node (\S+) managing GPUs? (.+?)\s*$")
_COMM_HEAD = re.compile(r"^#(\d+-\d+) \(([0-9a-fA-F]+)\) ([A-Z,]+)\s*$")
_RANK_LINE = re.compile(r"^\s+Rank (\d+)(?: has launched up to operation (\d+)| has not launched any operations)?"
                        r"(?: has status \S+)?(?: -- GPU (\S+) managed by process (\d+) on node (\S+))?")
_MISSING_LIST = re.compile(r"^\s+The missing ranks?: (.+)$")
_GROUP = re.compile(r"^\s+(\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)")
_OPS = re.compile(r"^\s+Communicator ranks have different (?:(\S+) )?(?:collective )?operation counts")
_COUNT = re.compile(r"^\s+(\d+) job process(?:es)? (?:is|are) considered dead")
_MISSING_COUNT = re.compile(r"^\s+Missing communicator data from (\d+) job process")
_TIMEOUTS = re.compile(r"^\s+Encountered (\d+) communication timeouts?")


def _number(text: str) -> int:
    """A number of the text format; more digits than any pid, rank or count has is not NCCL's text."""
    if len(text) > MAX_DIGITS:
        raise DoctorError(f"NCCL RAS sent a number of {len(text)} digits (a rank, pid or count has at most "
                          f"{MAX_DIGITS}); is something else listening on the RAS port?")
    return int(text)


def _rank_list(text: str) -> list[int]:
    """'21' or '3, 5-7' (NCCL 2.24's "The missing ranks:" list) -> [3, 5, 6, 7], at most MAX_RANKS ranks."""
    out: list[int] = []
    for part in re.split(r"[,\s]+", text.strip()):
        if re.fullmatch(r"\d+-\d+", part):
            a, b = (_number(x) for x in part.split("-"))
            if b - a + 1 + len(out) > MAX_RANKS or b >= MAX_RANKS:
                raise DoctorError(f"NCCL RAS listed the missing ranks {part[:60]}: more than any job has "
                                  f"({MAX_RANKS}); is something else listening on the RAS port?")
            out.extend(range(a, b + 1))
        elif part.isdigit():
            out.append(_number(part))
    return out


def parse_text(body: str) -> RasStatus:
    """The default text output (every NCCL >= 2.24): what the Errors and Warnings sections say."""
    status = RasStatus(format="text")
    comms: dict[str, RasCommunicator] = {}
    section = block = ""
    comm: RasCommunicator | None = None
    op = ""
    group_value: int | None = None
    reported = False  # a "Job summary" or "Communicators" section: NCCL's status report, whatever else it holds
    for raw in body.splitlines():
        line = raw.rstrip()
        if m := _VERSION.match(line):
            status.nccl_version = m.group(1)
            continue
        if line in ("Errors", "Warnings") or line.startswith(("Job summary", "Communicators")):
            section, block, comm = line.split()[0], "", None
            reported = reported or line.startswith(("Job summary", "Communicators"))
            continue
        if not line or set(line) == {"="}:
            continue
        if not line.startswith(" "):
            block, comm, op, group_value = line, None, "", None
            if m := _COMM_HEAD.match(line):
                label, hsh, kinds = m.groups()
                comm = comms.setdefault(label, RasCommunicator(hash=f"0x{hsh.lower().lstrip('0') or '0'}", label=f"#{label}"))
                comm.errors.extend(k for k in kinds.split(",") if k not in comm.errors)
                block = "COMM"
            continue
        if section not in ("Errors", "Warnings"):
            continue
        if block in ("DEAD", "INCOMPLETE"):
            if m := _PROCESS.match(line):
                proc = RasProcess(pid=_number(m.group(1)), host=m.group(2), gpus=m.group(3))
                (status.dead_processes if block == "DEAD" else status.unresponsive_processes).append(proc)
            elif m := _COUNT.match(line):
                status.dead_count = _number(m.group(1))
            elif m := _MISSING_COUNT.match(line):
                status.unresponsive_count = _number(m.group(1))
        elif block == "TIMEOUT":
            if m := _TIMEOUTS.match(line):
                status.timeouts = _number(m.group(1))
        elif block == "COMM" and comm is not None:
            if m := _OPS.match(line):
                op, group_value = m.group(1) or "collective", None
            elif m := _GROUP.match(line):
                group_value = _number(m.group(2) or "0")
                comm.count_groups.setdefault(op or "collective", {}).setdefault(group_value, [])
                comm.count_sizes.setdefault(op or "collective", {})[group_value] = _number(m.group(1))
            elif m := _MISSING_LIST.match(line):
                comm.missing.extend(RasMissingRank(rank=r) for r in _rank_list(m.group(1)))
            elif m := _RANK_LINE.match(line):
                rank = _number(m.group(1))
                host, pid = m.group(5), (_number(m.group(4)) if m.group(4) else None)
                if op:
                    value = (_number(m.group(2)) if m.group(2) else 0) if ("launched" in line) else group_value
                    if value is not None:
                        comm.count_groups.setdefault(op, {}).setdefault(value, []).append(rank)
                    comm.ranks.append(RasRank(rank=rank, host=host, pid=pid))
                elif "INCOMPLETE" in comm.errors and section == "Errors":
                    comm.missing.append(RasMissingRank(rank=rank, host=host, pid=pid))
    dead = {(p.host, p.pid) for p in status.dead_processes}
    # NCCL 2.24 lists a missing rank without its process ("The missing rank: 21"); when every process RAS
    # misses is dead (none merely INCOMPLETE), that rank is a dead process's.
    only_dead = bool(status.dead_processes or status.dead_count) and not (
        status.unresponsive_processes or status.unresponsive_count)
    for c in comms.values():
        for mr in c.missing:
            mr.dead = (mr.host, mr.pid) in dead if mr.pid is not None else only_dead
            mr.unresponsive = not mr.dead
    if not reported:
        # Every NCCL >= 2.24 report has its job summary or its communicators table (client_support.cc); text
        # with neither after a good handshake is not a status, and must never read as "every rank answered".
        raise DoctorError("NCCL RAS sent text with no 'Job summary' or 'Communicators' section: not a RAS status "
                          "report; is something else listening on the RAS port?")
    status.communicators = list(comms.values())
    status.dead_count = max(status.dead_count, len(status.dead_processes))
    status.unresponsive_count = max(status.unresponsive_count, len(status.unresponsive_processes))
    return status
