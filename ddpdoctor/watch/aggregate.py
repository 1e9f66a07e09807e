"""The supervisor's picture of a watched job: per-rank progress, mismatches, hangs, the first divergence.

Fed with the ranks' side-channel messages (and, when ddpdoctor launched them, their exit statuses); pure
bookkeeping, no sockets and no torch, so it is tested and reused by both the self-launching supervisor
and the aggregator thread inside rank 0 under torchrun.

A hang is no progress on any rank for ``hang_timeout`` seconds, wherever the ranks are (issue 25): progress
is a completion the ranks count (:mod:`~ddpdoctor.watch.progress`: a collective completing, an optimizer
step, a DDP ``backward()`` ending), a rank arriving, claiming its rank or ending. Then every rank's place is
classified (:mod:`~ddpdoctor.watch.waits`); when nobody waits for anybody (every rank in its own code or
I/O, nothing in flight) the same verdict is worded as a *stall* the user can allow for.

Also: the ``init_process_group`` claims of every process (two claiming one rank, disagreeing world sizes
or backends, a rank outside the world: a verdict at once, before the rendezvous fails on them), and the
ranks' per-step medians (a rank the others chronically wait for is the straggler: a warning).

Ranks are keyed by rank; a process the script started itself (mp.spawn) is keyed by ``-pid`` until its
``init_process_group`` claim names its rank (see :mod:`~ddpdoctor.watch.spawned`).
"""

from __future__ import annotations

import time
from typing import Any

from ddpdoctor.stacks import StoreView, store_text
from ddpdoctor.watch.claims import STRAGGLER_CONFIRM, claim_conflict, straggler
from ddpdoctor.watch.pitfalls import merge as merge_pitfalls
from ddpdoctor.watch.recorder import P2P_RECV, P2P_SEND
from ddpdoctor.watch.state import ECHO_WINDOW_S, ProcState, RankState
from ddpdoctor.watch.verdict import (
    HOST_WINDOW_S,
    busy_at,
    clock,
    early_exit,
    hosts_of,
    silent_ranks,
    vanished,
)
from ddpdoctor.watch.verdict import classify as classify_failure
from ddpdoctor.watch.waits import ENDED, NOT_STARTED, classify, innermost, is_stall

OK, HANG, MISMATCH, CRASH, INIT_CONFLICT = "ok", "hang", "mismatch", "crash", "init_conflict"
# A rank still starting (its Python importing torch) holds the hang clock, at most this long.
STARTUP_LIMIT_S = 600.0
SILENT_S = 5.0  # no message from a starting rank for this long: its watchdog cannot run
# How far back a rank's own "I ended at" stamp may reach (a clock that disagrees is not believed further).
MAX_STAMP_AGE_S = 60.0


def _op_class(op: str) -> str:
    return "p2p" if op in P2P_SEND or op in P2P_RECV else op


class Aggregator:
    """Merges the ranks' messages; ``verdict`` says when the job is done, hung or mismatched."""

    def __init__(self, world_size: int, hang_timeout_s: float, owns_processes: bool = False,
                 spawned: bool = False) -> None:
        self.world_size = world_size
        self.hang_timeout_s = hang_timeout_s
        self.ranks = {r: RankState(r, owned=owns_processes) for r in range(world_size)}
        self.last_progress = self.created = time.monotonic()
        # (group, seq) -> arrivals [(rank, record)]; dropped once every member has arrived.
        self.expect: dict[tuple[str, int], list[tuple[int, dict[str, Any]]]] = {}
        # (group, seq) -> when its first arrival reached the supervisor (monotonic), kept as long as ``expect``
        # keeps the key: a rank is said to have skipped it only on a beat sent after that (see ``_behind``).
        self.expect_since: dict[tuple[str, int], float] = {}
        self.mismatch: dict[str, Any] | None = None
        # The script starts its own ranks: the world is what their init claims say; the job is over
        # when its one launcher process has exited (launcher_code).
        self.spawned = spawned
        self.launcher_code: int | None = None
        self.procs: dict[int, ProcState] = {}
        self.claims: list[dict[str, Any]] = []
        self.conflict: dict[str, Any] | None = None
        self.straggler_live: dict[str, Any] | None = None
        self._straggler_streak: tuple[int | None, int] = (None, 0)
        self._straggler_checked = 0.0
        self.evidence: str | None = None
        self.rendezvous: dict[str, Any] | None = None  # a hang in init_process_group: who never arrived
        # Monotonic -> wall clock, for "no report since 18:22:31" (the ranks' own logs print wall time).
        self.wall_offset = time.time() - time.monotonic()
        self.decided_at: float | None = None  # when verdict() first returned a verdict (monotonic)
        self.here: str | None = None  # the supervisor's host (rank 0's under a launcher); None: rank 0's
        self._silent: dict[int, float] = {}  # silent ranks at the divergence being described (rank -> age)

    def _add_ranks(self, upto: int) -> None:
        for rank in range(upto):
            self.ranks.setdefault(rank, RankState(rank))
        self.world_size = max(self.world_size, upto)

    # -- input -------------------------------------------------------------------------------------

    def feed(self, rank: int, message: dict[str, Any] | None, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if rank < 0:
            self._feed_proc(rank, message, now)
            return
        if message is not None and message.get("t") == "init":
            self._claim(rank, message, now)
        state = self.ranks.get(rank)
        if state is None:
            return
        state.heard_at = now
        if message is None:
            if not state.said_exit:
                state.lost = True
                state.ended_at = state.ended_at or now
            self.last_progress = now
            return
        kind = message.get("t")
        if kind == "hello":
            state.pid, state.host, state.connected = message.get("pid"), message.get("host", ""), True
            state.hello_at = now
            self.last_progress = now
        elif kind == "rec":
            # Issuing a call is not progress: on NCCL a desynchronised rank issues on until it blocks.
            state.started = True
            for record in message["recs"]:
                state.history.append(record)
                self._arrive(rank, record, now)
        elif kind == "beat":
            state.beat_at = now
            done = message.get("done")
            if done is not None and done != state.done:
                self.last_progress = now
            state.done = done if done is not None else state.done
            # A beat without the field (a sender that predates it) is from a running script.
            if message.get("started", True) and not state.started:
                state.started = True
                self.last_progress = now  # the script begins: the clock starts from here
            state.inflight = message.get("inflight") or []
            state.inflight_n = message.get("inflight_n") or len(state.inflight)
            state.progress, state.cur, state.last = message["progress"], message["cur"], message["last"]
            state.seqs = message.get("seqs", state.seqs)
            state.steps = message.get("steps") or state.steps
        elif kind == "stack":
            state.stack = message["stack"]
            state.pitfalls = message.get("pitfalls", [])
            state.fr = message.get("fr", state.fr)
            state.frames = message.get("frames", state.frames)
            state.loader = message.get("loader")
            if message.get("inflight") is not None:
                state.inflight = message["inflight"]
        elif kind == "exit":
            state.said_exit, state.message_code = True, int(message["code"])
            state.raised, state.error = bool(message.get("crashed")), message.get("error") or ""
            state.pitfalls = message.get("pitfalls") or []
            state.ended_in, state.cur = state.cur, None
            if message.get("last"):  # rank 0's end read from its own process (supervisor._own_crash)
                state.last = message["last"]
            at, sent = message.get("at"), message.get("sent")
            if isinstance(at, (int, float)) and not isinstance(at, bool):
                # The rank's own clock says when its script ended (its interpreter shutdown comes after).
                # Both stamps are the rank's (``sent``: when it wrote this message), so their difference holds
                # on a host whose clock is off; the supervisor's clock against the rank's only without it.
                if isinstance(sent, (int, float)) and not isinstance(sent, bool):
                    age = min(max(sent - at, 0.0), MAX_STAMP_AGE_S)
                else:
                    age = min(max(time.time() - at, 0.0), MAX_STAMP_AGE_S)
                state.ended_at = min(state.ended_at or now, now - age)
            state.ended_at = state.ended_at or now
            self.last_progress = now

    def _feed_proc(self, key: int, message: dict[str, Any] | None, now: float) -> None:
        """A spawned process without a rank yet: its hello, stack and end."""
        proc = self.procs.get(key)
        if message is None or message.get("t") == "exit":
            if proc is not None:
                proc.finished = True
            self.last_progress = now
            return
        kind = message.get("t")
        if kind == "hello":
            self.procs[key] = ProcState(key, message.get("pid"), message.get("host", ""),
                                        message.get("role", "child"), message.get("index"))
            self.last_progress = now
        elif kind == "stack" and proc is not None:
            proc.stack = message["stack"]

    def _claim(self, rank: int, message: dict[str, Any], now: float) -> None:
        """An init_process_group claim, before torch's rendezvous runs."""
        claim = dict(message.get("claim") or {})
        was = message.get("was")
        if self.spawned:
            world = claim.get("world_size")
            self._add_ranks(max(rank + 1, world if isinstance(world, int) and world < 1 << 16 else 0))
        state = self.ranks.get(rank)
        if state is not None and isinstance(was, int) and was < 0:
            proc = self.procs.pop(was, None)
            if proc is not None and not (state.connected and state.pid != proc.pid):
                state.pid, state.host, state.connected = proc.pid, proc.host, True
        if state is not None and state.claim is None:
            state.claim = claim
        self.claims.append(claim)
        if self.conflict is None:
            self.conflict = claim_conflict(self.claims)
        self.last_progress = now

    def launcher_exited(self, returncode: int, now: float | None = None) -> None:
        """The script's own process (it started the ranks itself) ended."""
        self.launcher_code = returncode
        self.last_progress = time.monotonic() if now is None else now

    def step_stats(self) -> dict[int, dict[str, Any] | None]:
        return {r: s.steps for r, s in self.ranks.items() if s.connected or s.steps}

    def straggler_notice(self, now: float | None = None) -> str | None:
        """Once a second while the job runs: the line to print when a straggler is confirmed."""
        now = time.monotonic() if now is None else now
        if now - self._straggler_checked < 1.0:
            return None
        self._straggler_checked = now
        found = straggler(self.step_stats())
        rank = found["rank"] if found else None
        previous, streak = self._straggler_streak
        streak = streak + 1 if rank is not None and rank == previous else (1 if rank is not None else 0)
        self._straggler_streak = (rank, streak)
        if found and streak == STRAGGLER_CONFIRM and (self.straggler_live or {}).get("rank") != rank:
            self.straggler_live = found
            return f"ddpdoctor watch: {found['summary']} (the job goes on)"
        return None

    def process_exited(self, rank: int, returncode: int, now: float | None = None) -> None:
        """The OS's word on a rank ddpdoctor launched (the only source for a SIGKILL)."""
        state = self.ranks[rank]
        state.returncode = returncode
        state.ended_in, state.cur = state.ended_in or state.cur, None
        state.ended_at = state.ended_at or (time.monotonic() if now is None else now)
        self.last_progress = time.monotonic() if now is None else now

    def _arrive(self, rank: int, record: dict[str, Any], now: float) -> None:
        seq = record.get("seq")
        if seq is None:
            return
        key = (record["group"], int(seq))
        arrivals = self.expect.setdefault(key, [])
        self.expect_since.setdefault(key, now)
        arrivals.append((rank, record))
        first = arrivals[0][1]
        if self.mismatch is None and (_op_class(record["op"]) != _op_class(first["op"])
                                      or record["sig"] != first["sig"]):
            self.mismatch = {"group": key[0], "seq": key[1]}
        members = record.get("members")
        if len(arrivals) >= (len(members) if members else self.world_size) and self.mismatch is None:
            del self.expect[key]
            self.expect_since.pop(key, None)

    # -- decisions ---------------------------------------------------------------------------------

    def verdict(self, now: float | None = None) -> str | None:
        """MISMATCH / HANG / CRASH to stop the job now, OK when every rank ended, else None."""
        now = time.monotonic() if now is None else now
        found = self._verdict(now)
        if found is not None and self.decided_at is None:
            self.decided_at = now
        return found

    def host_settling(self, now: float | None = None) -> bool:
        """A rank vanished (no exit status) less than :data:`~ddpdoctor.watch.verdict.HOST_WINDOW_S` ago and
        other ranks of its host are still live: wait for them before deciding, so a host that went down whole
        is named as one (its ranks' connections close within milliseconds, but are read one poll apart)."""
        now = time.monotonic() if now is None else now
        hosts = {s.host for s in self.ranks.values() if s.host}
        if len(hosts) < 2:
            return False
        for state in self.ranks.values():
            recent = vanished(state) and state.ended_at is not None and now - state.ended_at < HOST_WINDOW_S
            if recent and any(not other.finished for other in self.ranks.values() if other.host == state.host):
                return True
        return False

    def _verdict(self, now: float) -> str | None:
        if self.conflict is not None:
            return INIT_CONFLICT
        if self.mismatch is not None:
            return MISMATCH
        live = [s for s in self.ranks.values() if not s.finished]
        if self.spawned:
            if self.launcher_code is not None:
                # Ranks claimed but never started cannot start any more.
                live = [s for s in live if s.connected]
            elif not live:
                return None  # nothing can hang without a rank; the launcher's exit ends the job
        if not live:
            failed = any(s.failed for s in self.ranks.values()) or (self.spawned and bool(self.launcher_code))
            return CRASH if failed else OK
        if now - self.last_progress < self.hang_timeout_s:
            return None
        if any(s.failed for s in self.ranks.values()):
            return CRASH
        if any(self._starting(s, now) for s in live):
            return None
        if all(s.said_exit for s in live):
            # Every script has ended; what runs is interpreter shutdown (atexit handlers uploading logs or
            # checkpoints): nothing can hang on a peer any more, and the processes end on their own.
            return None
        return HANG  # no progress anywhere, wherever the ranks are

    def _starting(self, state: RankState, now: float) -> bool:
        """Still setting up, not stuck: a process ddpdoctor started that has not said hello yet, or a rank
        importing torch before its script runs (seconds, a minute from a cold network filesystem). Only up
        to :data:`STARTUP_LIMIT_S`: an import that never ends is a hang too."""
        if state.started or state.finished:
            return False
        if state.connected:
            since = state.hello_at if state.hello_at is not None else self.created
            # A watchdog that stopped beating is not watching an import: the main thread holds the GIL (a C
            # call that never returns) or the process froze; that is for the hang clock to judge.
            beating = state.heard_at is not None and now - state.heard_at < SILENT_S
            return beating and now - since < max(STARTUP_LIMIT_S, self.hang_timeout_s)
        # Not connected: only a process we started is known to exist (under a launcher it may never start).
        return state.owned and now - self.created < max(STARTUP_LIMIT_S, self.hang_timeout_s)

    def exit_code(self, status: str) -> int:
        """watch's own exit code: 1 when the run failed (a user script's exit code 3 is its failure, not
        ddpdoctor's bug code 3), 0 when every rank ended well."""
        return 0 if status == OK else 1

    def failure_order(self) -> list[int]:
        """The failed ranks, first to fail first; an echo (failed because a peer went away) goes after a
        real failure that ended at most ECHO_WINDOW_S later."""
        ended = [s for s in self.ranks.values() if s.failed]

        def key(state: RankState) -> tuple[float, int]:
            at = state.ended_at if state.ended_at is not None else float("inf")
            return (at + ECHO_WINDOW_S if state.echo else at, state.rank)

        return [s.rank for s in sorted(ended, key=key)]

    # -- the report --------------------------------------------------------------------------------

    def divergence(self, now: float | None = None) -> dict[str, Any] | None:
        """The first collective not every member reached in the same way, with who was where.

        With ``now`` (the verdict's time) and ranks on several hosts, a rank silent for
        :data:`~ddpdoctor.watch.verdict.SILENT_AFTER_S` is shown as ``silent`` with its last report's time
        (what it last said is old news, not where it is), and is never named as having skipped a collective."""
        self._silent = silent_ranks(self, now) if now is not None and len(hosts_of(self.ranks)) > 1 else {}
        if self.mismatch is not None:
            group, seq = self.mismatch["group"], self.mismatch["seq"]
            arrivals = self.expect.get((group, seq), [])
            members = arrivals[0][1].get("members") if arrivals else None
            return self._describe(group, seq, members, {r: rec for r, rec in arrivals})
        groups: dict[str, list[int] | None] = {"WORLD": None}
        for state in self.ranks.values():
            for record in (state.cur, state.last, *state.history):
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
        """Who is where at collective ``seq`` of ``group``: in it (``waiting``), issued it and moved on
        while it has not completed (``issued``: an async call, or NCCL's way), in another call
        (``elsewhere``), in its own code (``running``), or gone. Ranks that never issued it while others
        did are listed in ``behind``: on NCCL that is how a skipped collective shows."""
        clusters: dict[tuple[Any, ...], dict[str, Any]] = {}
        ranks = sorted(members) if members else sorted(self.ranks)
        for rank in ranks:
            state = self.ranks[rank]
            record = there.get(rank)
            mine = self._issued_record(state, group, seq) if record is None and not state.finished else None
            silent = self._silent.get(rank)
            key: tuple[Any, ...]
            if silent is not None and not state.finished:
                since = state.heard_at + self.wall_offset if state.heard_at is not None else None
                key = ("silent", state.host)
                entry: dict[str, Any] = {"op": None, "desc": "", "site": None, "state": "silent", "host": state.host,
                         "last_report": since, "age_s": round(silent, 1)}
            elif record is not None:
                key = ("in", record["op"], record["desc"], record["site"])
                entry = {"op": record["op"], "desc": record["desc"], "site": record["site"], "state": "waiting"}
            elif state.finished:
                key = ("ended", state.state, state.how_ended())
                entry = {"op": None, "desc": "", "site": None, "state": state.state, "how": state.how_ended()}
            elif mine is not None:
                now = self._now(state)
                key = ("issued", mine["op"], mine.get("desc", ""), mine.get("site"), now["op"], now["site"])
                entry = {"op": mine["op"], "desc": mine.get("desc", ""), "site": mine.get("site"), "state": "issued",
                         "now": now}
            elif state.cur is not None:
                cur = state.cur
                key = ("in", cur["op"], cur.get("desc", ""), cur["site"], cur.get("seq"), cur.get("group"))
                entry = {"op": cur["op"], "desc": cur.get("desc", ""), "site": cur["site"], "state": "elsewhere",
                         "seq": cur.get("seq"), "group": cur.get("group")}
            else:
                where = innermost(state.stack)
                key = ("running", where)
                entry = {"op": None, "desc": "", "site": where, "state": state.state}
            clusters.setdefault(key, {**entry, "ranks": []})["ranks"].append(rank)
        return {"seq": seq, "group": group, "groups": list(clusters.values()), "behind": self._behind(group, seq, ranks)}

    def _now(self, state: RankState) -> dict[str, Any]:
        """Where a rank is now: the call it is in, or the innermost line of its own code."""
        if state.cur is not None:
            return {"op": state.cur["op"], "site": state.cur.get("site")}
        return {"op": None, "site": innermost(state.stack)}

    @staticmethod
    def _issued_record(state: RankState, group: str, seq: int) -> dict[str, Any] | None:
        """The call a rank issued as ``seq`` of ``group`` (from its recent history), if it did."""
        if state.seqs.get(group, 0) < seq:
            return None
        for record in reversed(state.history):
            if record.get("group") == group and record.get("seq") == seq:
                return record
        return {"op": "?", "desc": "", "site": None}  # issued, but older than the history kept

    def _behind(self, group: str, seq: int, ranks: list[int]) -> list[dict[str, Any]]:
        """Live ranks that never issued collective ``seq`` of ``group`` although others did, and are now
        outside any recorded call (NCCL's shape of a skipped collective: every host thread moved on): what
        they missed (op and line, from a rank that issued it) and how many they issued."""
        issued = {r: self.ranks[r].seqs.get(group, 0) for r in ranks}
        ahead = [r for r in ranks if issued[r] >= seq]
        missed = next((rec for r in ahead if (rec := self._issued_record(self.ranks[r], group, seq)) is not None), None)
        if not ahead or missed is None:
            return []
        late: dict[tuple[int, str | None], list[int]] = {}
        since = self.expect_since.get((group, seq))
        for rank in ranks:
            state = self.ranks[rank]
            # Only ranks that moved on outside any recorded call: one waiting in another collective (rank 0
            # alone in an extra barrier, the others in the next backward) is a divergence, not a skip. And only
            # on a beat the rank sent after the others' call arrived: a count from before it says nothing (a
            # short script whose ranks all raised before rank 1's first beat read "rank 1 never issued #1").
            fresh = since is not None and state.beat_at is not None and state.beat_at > since
            if issued[rank] < seq and fresh and not state.finished and state.cur is None and rank not in self._silent:
                late.setdefault((issued[rank], busy_at(state, missed.get("site"))), []).append(rank)
        return [{"ranks": late_ranks, "issued": count, "others": ahead, "others_issued": max(issued[r] for r in ahead),
                 "op": missed["op"], "desc": missed.get("desc", ""), "site": missed.get("site"), "busy": busy}
                for (count, busy), late_ranks in sorted(late.items(), key=lambda item: (item[0][0], item[0][1] or ""))]

    def verdict_time(self) -> float:
        """The verdict's monotonic time: when verdict() decided, else the last message (a state fed by hand)."""
        if self.decided_at is not None:
            return self.decided_at
        heard = [s.heard_at for s in self.ranks.values() if s.heard_at is not None]
        return max(heard) if heard else time.monotonic()

    def result(self, status: str) -> dict[str, Any]:
        """The whole outcome as the JSON document `--json` writes."""
        from ddpdoctor import __version__
        now = self.verdict_time()
        waits = self.waits() if status == HANG else {}
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
                "init": s.claim, "steps": s.steps, "flight_recorder": s.fr,
                "wait": waits.get(rank), "inflight": s.inflight_n,
                "last_report": clock(s.heard_at + self.wall_offset) if s.heard_at is not None else None,
                "last_report_age_s": round(max(now - s.heard_at, 0.0), 1) if s.heard_at is not None else None,
            })
        divergence = self.divergence(now) if status != OK else None
        if divergence and all(g["state"] in ("exited", "crashed") for g in divergence["groups"]):
            divergence = None  # everyone is gone: the crash order says more than a "divergence"
        crash_order = self.failure_order()
        warnings = merge_pitfalls({r: s.pitfalls for r, s in self.ranks.items()}, self.world_size)
        stall = status == HANG and is_stall([w for w in waits.values() if w["kind"] not in (NOT_STARTED, ENDED)])
        failure = classify_failure(self, status, now, self.here, divergence, stall)
        silent = {entry["rank"] for entry in (failure or {}).get("silent_ranks") or []}
        for entry in ranks:
            if entry["rank"] in silent:
                entry["state"] = "silent"  # alive by every fact we have, but its last report is old
        return {"tool": "ddpdoctor", "version": __version__, "command": "watch", "status": status,
                "failure": failure, "hosts": [{"host": h, "ranks": r} for h, r in hosts_of(self.ranks).items()],
                "exit_code": self.exit_code(status), "world_size": self.world_size,
                "launch": "script" if self.spawned else "ranks",
                "script_exit_code": self.launcher_code if self.spawned else None,
                "hang_timeout_s": self.hang_timeout_s,
                "stalled_s": round(time.monotonic() - self.last_progress, 3) if status == HANG else None,
                "stall": stall,
                "ranks": ranks, "divergence": divergence, "crash_order": crash_order,
                "early_exit": early_exit(self) if status == CRASH else None,
                "init_conflict": self.conflict if status == INIT_CONFLICT else None,
                "outside": self.outside() if status == HANG else [],
                "rendezvous": self.rendezvous if status == HANG else None,
                "straggler": straggler(self.step_stats()) or self.straggler_live,
                "evidence": self.evidence, "warnings": warnings}

    def in_rendezvous(self) -> list[int]:
        """Live ranks waiting inside ``init_process_group``."""
        return [r for r, s in sorted(self.ranks.items())
                if not s.finished and s.cur is not None and s.cur.get("op") == "init_process_group"]

    def note_rendezvous(self, view: StoreView | None, rank0_hosts: bool) -> None:
        """A hang in the rendezvous: the ranks that never reached ``init_process_group`` (from the channel:
        never connected, or never claimed a rank), with what the job's store said (``view``)."""
        waiting = self.in_rendezvous()
        if not waiting:
            return
        missing = [r for r, s in sorted(self.ranks.items()) if not s.finished and s.claim is None]
        self.rendezvous = {"waiting": waiting, "never_arrived": missing,
                           "store": view.to_json() if view is not None else None,
                           "store_said": store_text(view, rank0_hosts) if view is not None else None}

    def waits(self) -> dict[int, dict[str, Any]]:
        """Where each rank waits at a hang (see :mod:`~ddpdoctor.watch.waits`)."""
        found: dict[int, dict[str, Any]] = {}
        for rank, state in sorted(self.ranks.items()):
            if state.finished:
                found[rank] = {"kind": ENDED, "site": None, "summary": state.how_ended(), "pending": [], "worker": None}
            elif not state.connected:
                found[rank] = {"kind": NOT_STARTED, "site": None, "pending": [], "worker": None,
                               "summary": "never arrived: it did not start, or never reached the watch channel"}
            else:
                found[rank] = classify(state.cur, state.frames or [], state.inflight, state.loader)
        return found

    def outside(self) -> list[dict[str, Any]]:
        """Processes stuck outside any collective while others wait: ranks running their own code, and
        started processes that never called init_process_group (data loading, a lock, an input())."""
        found = []
        for state in self.ranks.values():
            if state.connected and not state.finished and state.cur is None:
                found.append({"rank": state.rank, "pid": state.pid, "site": innermost(state.stack),
                              "stack": state.stack or [], "before_init": state.claim is None})
        for proc in self.procs.values():
            if proc.role == "child" and not proc.finished:
                found.append({"rank": None, "pid": proc.pid, "index": proc.index, "site": innermost(proc.stack),
                              "stack": proc.stack or [], "before_init": True})
        return found
