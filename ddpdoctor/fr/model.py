"""What ``fr`` knows after reading the dumps, kept small enough for 512 ranks x 2,000 entries.

A Flight Recorder dump holds every entry with its Python frames; most entries of a training loop are the
same call at the same line. Each distinct call is interned once in a :class:`CallTable` and a rank's
history on a process group is an ``array`` of call ids indexed by collective sequence number, so memory
grows with the number of distinct calls, not with ranks x entries.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.errors import DoctorError
from ddpdoctor.ranks import format_rank_list

# Bounds on what a (damaged or hostile) dump can make us allocate: a sequence-number jump within one group
# (a ring buffer holds a few thousand entries), and a rank number (no job has a million ranks).
MAX_SEQ_GAP = 1_000_000
MAX_RANK = 1 << 20

NO_CALL = -1  # a sequence number whose entry the ring buffer no longer holds


@dataclass(frozen=True)
class Call:
    """One collective as a rank issued it: what it was and where the user's code called it."""

    op: str                       # 'all_reduce', 'barrier', 'send', ... (the backend prefix removed)
    input_sizes: tuple[Any, ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[Any, ...]
    output_dtypes: tuple[str, ...]
    file: str | None = None       # the user's frame: the first one outside torch
    line: int | None = None
    function: str | None = None

    def where(self) -> str | None:
        """'train.py:41 (train_step)', or None for a dump without frames (JSON dumps have none)."""
        if self.file is None:
            return None
        func = f" ({self.function})" if self.function else ""
        return f"{os.path.basename(self.file)}:{self.line}{func}"

    def describe(self) -> str:
        where = self.where()
        return f"{self.op} at {where}" if where else self.op

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "input_sizes": _plain(self.input_sizes), "input_dtypes": list(self.input_dtypes),
                "output_sizes": _plain(self.output_sizes), "output_dtypes": list(self.output_dtypes),
                "file": self.file, "line": self.line, "function": self.function, "where": self.where()}


def _plain(sizes: tuple[Any, ...]) -> list[Any]:
    return [list(s) if isinstance(s, tuple) else s for s in sizes]


class CallTable:
    """Interns :class:`Call` objects: the same call at the same line is stored once for all ranks."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._ids: dict[Call, int] = {}
        self._by_fields: dict[tuple[Any, ...], int] = {}

    def intern(self, call: Call) -> int:
        found = self._ids.get(call)
        if found is None:
            found = self._ids[call] = len(self.calls)
            self.calls.append(call)
        return found

    def intern_fields(self, *fields: Any) -> int:
        """:meth:`intern` for ``Call(*fields)``, without building the Call when it is known (the hot path)."""
        found = self._by_fields.get(fields)
        if found is None:
            found = self._by_fields[fields] = self.intern(Call(*fields))
        return found

    def __getitem__(self, call_id: int) -> Call:
        return self.calls[call_id]


@dataclass
class P2POp:
    """One send or recv, with the peer as a global rank where the group's ranks are known."""

    send: bool
    peer: int | None
    call_id: int
    p2p_seq: int
    time_created_ns: int
    state: str


@dataclass
class GroupTrace:
    """One rank's history on one process group."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None        # global ranks of the group, when the dump says (pg_config)
    first_seq: int = 0                   # collective sequence number of calls[0]; 0 = none held
    calls: array = field(default_factory=lambda: array("i"))  # call id per sequence number, NO_CALL if lost
    last_enqueued: int = 0               # from pg_status: survives the ring buffer overwriting entries
    last_completed: int | None = None
    p2p: list[P2POp] = field(default_factory=list)

    @property
    def last_seq(self) -> int:
        held = self.first_seq + len(self.calls) - 1 if self.calls else 0
        return max(held, self.last_enqueued)

    def call_at(self, seq: int) -> int:
        """The call id of collective ``seq``, or NO_CALL when the buffer no longer holds it."""
        index = seq - self.first_seq
        if not self.calls or index < 0 or index >= len(self.calls):
            return NO_CALL
        return int(self.calls[index])

    def put(self, seq: int, call_id: int) -> None:
        if not self.calls:
            self.first_seq = seq
            self.calls.append(call_id)
            return
        if seq < self.first_seq:  # entries are in record order; a lower seq only after a wrap: keep the newest run
            return
        index = seq - self.first_seq
        if index - len(self.calls) > MAX_SEQ_GAP:
            raise DoctorError(f"collective #{seq} follows #{self.first_seq + len(self.calls) - 1} in one group: "
                              "a jump no ring buffer makes; the dump is damaged")
        while len(self.calls) < index:
            self.calls.append(NO_CALL)
        if index == len(self.calls):
            self.calls.append(call_id)
        # A coalesced group repeats its sequence number: the first entry stands for it.


@dataclass
class RankDump:
    """One rank's dump, reduced to what the analysis needs."""

    rank: int
    path: str
    format: str                    # 'pickle' or 'json'
    version: str
    entries: int
    has_frames: bool
    oldest_ns: int | None
    groups: dict[str, GroupTrace] = field(default_factory=dict)
    newest: tuple[str, int] | None = None   # (group name, seq) of the newest collective entry: where it waits

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "path": self.path, "format": self.format, "version": self.version,
                "entries": self.entries, "frames": self.has_frames}


@dataclass
class StackNow:
    """Where a rank's main thread is now, from a ``ddpdoctor stacks --json`` file."""

    rank: int
    host: str
    pid: int
    where: str           # 'stacks_hang.py:45 in sync_odd_path'
    call: str | None     # the torch.distributed function it waits in, if any
    source: str

    def describe(self) -> str:
        inside = f"in {self.call}() " if self.call else ""
        return f"now {inside}at {self.where} (pid {self.pid} on {self.host})"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "pid": self.pid, "where": self.where, "call": self.call,
                "source": self.source}


@dataclass
class Side:
    """Ranks that did the same thing at a divergence."""

    ranks: list[int]
    call: Call | None       # what they issued (None: nothing, or no longer in the buffer)
    seq: int | None         # the sequence number that call had
    diverged: bool          # the odd one(s) out, as opposed to the majority

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "seq": self.seq, "diverged": self.diverged,
                "call": self.call.to_dict() if self.call else None}


@dataclass
class Divergence:
    """Where the ranks of one group stopped doing the same thing."""

    kind: str                 # mismatch | size_mismatch | not_issued | p2p_unmatched
    seq: int | None
    summary: str
    sides: list[Side]
    stacks: dict[int, StackNow] = field(default_factory=dict)

    @property
    def diverged_ranks(self) -> list[int]:
        return sorted(r for side in self.sides if side.diverged for r in side.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "seq": self.seq, "summary": self.summary,
                "diverged_ranks": self.diverged_ranks, "sides": [s.to_dict() for s in self.sides],
                "stacks": {str(r): s.to_dict() for r, s in sorted(self.stacks.items())}}


@dataclass
class GroupVerdict:
    """One process group: its members, the window every rank still holds, and the first divergence."""

    label: str
    name: str
    desc: str
    ranks: list[int]
    ranks_known: bool          # from pg_config, or inferred from which dumps mention the group
    missing: list[int]
    window: tuple[int, int] | None
    divergences: list[Divergence]
    note: str = ""
    caused_by: str | None = None   # the label of the group whose divergence holds this one's ranks

    @property
    def status(self) -> str:
        return "fail" if self.divergences else "pass"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "name": self.name, "desc": self.desc, "ranks": self.ranks,
                "ranks_from": "pg_config" if self.ranks_known else "dumps", "missing_ranks": self.missing,
                "window": list(self.window) if self.window else None, "status": self.status,
                "note": self.note, "caused_by": self.caused_by,
                "divergences": [d.to_dict() for d in self.divergences]}


@dataclass(frozen=True)
class Unreadable:
    """A rank whose dump could not be read, and why (``load.UnreadableDump``'s text without the path): empty
    (the rank was killed while writing it), cut short, damaged, or not a dump."""

    rank: int
    path: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "path": self.path, "why": self.why}


@dataclass
class FrReport:
    """The whole verdict: the dumps read, the ranks with none, every group's verdict (failing first)."""

    dumps: list[RankDump]
    missing: list[int]
    world_size: int
    groups: list[GroupVerdict]
    stacks_files: list[str] = field(default_factory=list)
    # host -> its ranks. Flight Recorder dumps carry no host name (torch 2.13's dump: version, pg_config,
    # pg_status, entries, nccl_comm_state), so this comes from the `stacks --json` files read beside them.
    hosts: dict[str, list[int]] = field(default_factory=dict)
    unreadable: list[Unreadable] = field(default_factory=list)  # ranks among ``missing`` whose file was damaged

    @property
    def status(self) -> str:
        return "fail" if self.missing or any(g.status == "fail" for g in self.groups) else "pass"

    def summary(self) -> str:
        failing = sorted((g for g in self.groups if g.divergences), key=lambda g: g.caused_by is not None)
        if failing:
            return failing[0].divergences[0].summary
        if self.missing:
            return (f"no {'readable ' if self.unreadable else ''}dump from {'rank' if len(self.missing) == 1 else 'ranks'} "
                    f"{format_rank_list(self.missing)}; the other ranks agree")
        return "every rank issued the same collectives in the same order"
