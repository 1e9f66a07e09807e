"""The supervisor's picture of a watched job: per-rank progress, mismatches, hangs, the first divergence.

Fed with the ranks' side-channel messages (and, when ddpdoctor launched them, their exit statuses); pure
bookkeeping, no sockets and no torch, so it is tested and reused by both the self-launching supervisor
and the aggregator thread inside rank 0 under torchrun.

A hang is declared when some live rank sits inside a recorded call (a collective, init_process_group,
or ``backward`` of a DDP model) and no rank has made progress for ``hang_timeout`` seconds. A rank that is
only running its own code (evaluation, checkpointing) while nobody waits is not a hang.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.watch.pitfalls import merge as merge_pitfalls
from ddpdoctor.watch.recorder import P2P_RECV, P2P_SEND

OK, HANG, MISMATCH, CRASH = "ok", "hang", "mismatch", "crash"


@dataclass
class RankState:
    """What the supervisor knows about one rank."""

    rank: int
    pid: int | None = None
    host: str = ""
    connected: bool = False
    progress: int = -1
    cur: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    seqs: dict[str, int] = field(default_factory=dict)
    said_exit: bool = False  # the rank's own exit message arrived
    message_code: int | None = None
    raised: bool = False
    error: str = ""
    returncode: int | None = None  # from the OS, when ddpdoctor launched the rank
    lost: bool = False  # the channel closed without an exit message
    stack: list[str] | None = None
    pitfalls: list[dict[str, Any]] = field(default_factory=list)
    ended_at: float | None = None
    # True when ddpdoctor started the process: then only its real end counts (after the exit message a
    # rank may still run atexit handlers, uploading logs or checkpoints; it must not be torn down then).
    owned: bool = False

    @property
    def finished(self) -> bool:
        if self.owned:
            return self.returncode is not None
        return self.said_exit or self.returncode is not None or self.lost

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    @property
    def exit_code(self) -> int | None:
        return self.returncode if self.returncode is not None else self.message_code

    @property
    def crashed(self) -> bool:
        if self.signal_name or self.raised:
            return True
        if self.returncode is not None and not self.said_exit:
            return self.returncode != 0  # os._exit / interpreter abort: it never reached the script's end
        # A closed channel alone says "dead" only when there is no process to ask.
        return self.lost and not self.said_exit and not self.owned

    @property
    def state(self) -> str:
        if self.crashed:
            return "crashed"
        if self.finished:
            return "exited"
        if not self.connected:
            return "not started"
        return "waiting" if self.cur is not None else "running"

    def how_ended(self) -> str:
        if self.signal_name:
            return f"killed by {self.signal_name}"
        if self.raised:
            return f"raised {self.error}" if self.error else "raised an exception"
        if self.lost and not self.said_exit and self.returncode is None:
            return "lost its connection without an exit status (killed, or crashed outside Python)"
        return f"exit code {self.exit_code}"


def _op_class(op: str) -> str:
    return "p2p" if op in P2P_SEND or op in P2P_RECV else op


class Aggregator:
    """Merges the ranks' messages; ``verdict`` says when the job is done, hung or mismatched."""

    def __init__(self, world_size: int, hang_timeout_s: float, owns_processes: bool = False) -> None:
        self.world_size = world_size
        self.hang_timeout_s = hang_timeout_s
        self.ranks = {r: RankState(r, owned=owns_processes) for r in range(world_size)}
        self.last_progress = time.monotonic()
        # (group, seq) -> arrivals [(rank, record)]; dropped once every member has arrived.
        self.expect: dict[tuple[str, int], list[tuple[int, dict[str, Any]]]] = {}
        self.mismatch: dict[str, Any] | None = None

    # -- input -------------------------------------------------------------------------------------

    def feed(self, rank: int, message: dict[str, Any] | None, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        state = self.ranks.get(rank)
        if state is None:
            return
        if message is None:
            if not state.said_exit:
                state.lost = True
                state.ended_at = state.ended_at or now
            self.last_progress = now
            return
        kind = message.get("t")
        if kind == "hello":
            state.pid, state.host, state.connected = message.get("pid"), message.get("host", ""), True
            self.last_progress = now
        elif kind == "rec":
            for record in message["recs"]:
                self._arrive(rank, record)
            self.last_progress = now
        elif kind == "beat":
            if message["progress"] != state.progress:
                self.last_progress = now
            state.progress, state.cur, state.last = message["progress"], message["cur"], message["last"]
            state.seqs = message.get("seqs", state.seqs)
        elif kind == "stack":
            state.stack = message["stack"]
            state.pitfalls = message.get("pitfalls", [])
        elif kind == "exit":
            state.said_exit, state.message_code = True, int(message["code"])
            state.raised, state.error = bool(message.get("crashed")), message.get("error", "")
            state.pitfalls = message.get("pitfalls", [])
            state.cur = None
            state.ended_at = state.ended_at or now
            self.last_progress = now

    def process_exited(self, rank: int, returncode: int, now: float | None = None) -> None:
        """The OS's word on a rank ddpdoctor launched (the only source for a SIGKILL)."""
        state = self.ranks[rank]
        state.returncode = returncode
        state.cur = None
        state.ended_at = state.ended_at or (time.monotonic() if now is None else now)
        self.last_progress = time.monotonic() if now is None else now

    def _arrive(self, rank: int, record: dict[str, Any]) -> None:
        seq = record.get("seq")
        if seq is None:
            return
        key = (record["group"], int(seq))
        arrivals = self.expect.setdefault(key, [])
        arrivals.append((rank, record))
        first = arrivals[0][1]
        if self.mismatch is None and (_op_class(record["op"]) != _op_class(first["op"])
                                      or record["sig"] != first["sig"]):
            self.mismatch = {"group": key[0], "seq": key[1]}
        members = record.get("members")
        if len(arrivals) >= (len(members) if members else self.world_size) and self.mismatch is None:
            del self.expect[key]

    # -- decisions ---------------------------------------------------------------------------------

    def verdict(self, now: float | None = None) -> str | None:
        """MISMATCH / HANG / CRASH to stop the job now, OK when every rank ended, else None."""
        now = time.monotonic() if now is None else now
        if self.mismatch is not None:
            return MISMATCH
        live = [s for s in self.ranks.values() if not s.finished]
        if not live:
            return CRASH if any(s.crashed for s in self.ranks.values()) else OK
        if now - self.last_progress < self.hang_timeout_s:
            return None
        if any(s.crashed for s in self.ranks.values()):
            return CRASH
        if any(s.cur is not None for s in live):
            return HANG
        return None

    def exit_code(self, status: str) -> int:
        if status != OK:
            return 1
        codes = [self.ranks[r].exit_code or 0 for r in sorted(self.ranks)]
        return next((c for c in codes if c != 0), 0)

    # -- the report --------------------------------------------------------------------------------

    def divergence(self) -> dict[str, Any] | None:
        """The first collective not every member reached in the same way, with who was where."""
        if self.mismatch is not None:
            group, seq = self.mismatch["group"], self.mismatch["seq"]
            arrivals = self.expect.get((group, seq), [])
            members = arrivals[0][1].get("members") if arrivals else None
            return self._describe(group, seq, members, {r: rec for r, rec in arrivals})
        groups: dict[str, list[int] | None] = {"WORLD": None}
        for state in self.ranks.values():
            for record in (state.cur, state.last):
                if record and record.get("seq") is not None:
                    groups.setdefault(record["group"], record.get("members"))
        for group, members in groups.items():
            found = self._first_gap(group, members)
            if found is not None:
                return found
        return None

    def _first_gap(self, group: str, members: list[int] | None) -> dict[str, Any] | None:
        ranks = members if members else sorted(self.ranks)
        positions: dict[int, int] = {}
        at: dict[int, dict[str, Any]] = {}
        for rank in ranks:
            state = self.ranks[rank]
            issued = state.seqs.get(group, 0)
            cur = state.cur
            if cur and cur.get("group") == group and cur.get("seq") is not None:
                at[rank] = cur
                positions[rank] = int(cur["seq"]) - 1
            else:
                positions[rank] = issued
        if not positions:
            return None
        seq = min(positions.values()) + 1
        if len(set(positions.values())) == 1:
            inflight = [at.get(r) for r in ranks]
            if all(inflight) and len({(_op_class(c["op"]), c["sig"]) for c in inflight if c}) == 1:
                return None  # everyone is in the same collective: slow, not divergent
            if not any(inflight):
                return None
        return self._describe(group, seq, members, {r: c for r, c in at.items() if int(c["seq"]) == seq})

    def _describe(self, group: str, seq: int, members: list[int] | None,
                  there: dict[int, dict[str, Any]]) -> dict[str, Any]:
        clusters: dict[tuple[Any, ...], dict[str, Any]] = {}
        for rank in sorted(members) if members else sorted(self.ranks):
            state = self.ranks[rank]
            record = there.get(rank)
            if record is not None:
                key: tuple[Any, ...] = ("in", record["op"], record["desc"], record["site"])
                entry = {"op": record["op"], "desc": record["desc"], "site": record["site"], "state": "waiting"}
            elif state.finished:
                key = ("ended", state.state, state.how_ended())
                entry = {"op": None, "desc": "", "site": None, "state": state.state, "how": state.how_ended()}
            elif state.cur is not None:
                cur = state.cur
                key = ("in", cur["op"], cur.get("desc", ""), cur["site"], cur.get("seq"), cur.get("group"))
                entry = {"op": cur["op"], "desc": cur.get("desc", ""), "site": cur["site"], "state": "elsewhere",
                         "seq": cur.get("seq"), "group": cur.get("group")}
            else:
                where = _innermost(state.stack)
                key = ("running", where)
                entry = {"op": None, "desc": "", "site": where, "state": state.state}
            clusters.setdefault(key, {**entry, "ranks": []})["ranks"].append(rank)
        return {"seq": seq, "group": group, "groups": list(clusters.values())}

    def result(self, status: str) -> dict[str, Any]:
        """The whole outcome as the JSON document `--json` writes."""
        from ddpdoctor import __version__

        ranks = []
        for rank in sorted(self.ranks):
            s = self.ranks[rank]
            waiting = None
            if s.cur is not None:
                waiting = {k: s.cur.get(k) for k in ("op", "seq", "group", "site", "desc")}
            ranks.append({
                "rank": rank, "state": s.state, "pid": s.pid, "host": s.host,
                "exit_code": s.exit_code, "signal": s.signal_name, "error": s.error or None,
                "last_completed": {k: s.last.get(k) for k in ("op", "seq", "group", "site", "desc")} if s.last else None,
                "waiting_in": waiting, "issued": dict(s.seqs), "stack": s.stack or [],
            })
        divergence = self.divergence() if status != OK else None
        if divergence and all(g["state"] in ("exited", "crashed") for g in divergence["groups"]):
            divergence = None  # everyone is gone: the crash order says more than a "divergence"
        ended = [s for s in self.ranks.values() if s.crashed and s.ended_at is not None]
        crash_order = [s.rank for s in sorted(ended, key=lambda s: (s.ended_at, s.rank))]
        warnings = merge_pitfalls({r: s.pitfalls for r, s in self.ranks.items()}, self.world_size)
        return {"tool": "ddpdoctor", "version": __version__, "command": "watch", "status": status,
                "exit_code": self.exit_code(status), "world_size": self.world_size,
                "hang_timeout_s": self.hang_timeout_s,
                "stalled_s": round(time.monotonic() - self.last_progress, 3) if status == HANG else None,
                "ranks": ranks, "divergence": divergence, "crash_order": crash_order, "warnings": warnings}


def _innermost(stack: list[str] | None) -> str | None:
    """'train.py:55' from the innermost stack entry 'train.py:55 in main: ...'."""
    if not stack:
        return None
    return stack[-1].split(" in ", 1)[0]
