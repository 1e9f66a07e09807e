"""`ddpdoctor watch`'s own side channel: JSON lines over TCP, independent of the job's process group.

The job's collectives may be stuck (that is what we diagnose) and its TCPStore belongs to the job, so
the ranks' watchdog threads talk to the supervisor over a plain socket of ddpdoctor's own. One line is
one JSON message; the server side is a ``selectors`` loop that never blocks longer than its poll slice.

Anyone on the machine can connect to the channel (a user's script finds its address in its environment),
and a rank killed mid-send leaves half a line: every line is read as untrusted. It is parsed by
:func:`ddpdoctor.safejson.loads_untrusted` (no NaN/Infinity, huge numbers or deep nesting), capped at
:data:`MAX_LINE` bytes (a longer one is skipped up to its newline, never buffered whole), and checked
against the shape the supervisor relies on (:func:`well_formed`). A message that fails is counted in
``Server.malformed`` (the supervisor reports the count) and dropped; it never reaches the aggregator.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
from typing import Any

from ddpdoctor.safejson import UntrustedJSONError, loads_untrusted

ADDR_ENV = "DDPDOCTOR_WATCH_CHANNEL"
# A real message is a few KB; a batch of records stays far below this (the watchdog sends at most
# RECORDS_PER_MESSAGE records per line). Anything longer is garbage, and is skipped, not buffered.
MAX_LINE = 8 << 20
RECORDS_PER_MESSAGE = 256
# The supervisor's keep-alive to the ranks (NCCL's RAS keeps its peers alive once a second too).
PING_S = 1.0
HOSTS_EVERY = 10


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


class Client:
    """A rank's end: thread-safe sends, non-blocking receives."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        self._buffer = b""
        self.closed = False

    @classmethod
    def connect(cls, address: str, deadline_s: float) -> Client:
        """Connect to ``host:port``, retrying until the deadline (the server may start later)."""
        host, port = address.rsplit(":", 1)
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                sock = socket.create_connection((host, int(port)), timeout=5)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return cls(sock)
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def send(self, message: dict[str, Any]) -> bool:
        data = encode(message)
        with self._lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self.closed = True
                return False

    def receive(self, timeout: float) -> list[dict[str, Any]] | None:
        """Messages that arrived within ``timeout``; None once the server has gone."""
        sel = selectors.DefaultSelector()
        try:
            sel.register(self.sock, selectors.EVENT_READ)
            if not sel.select(timeout):
                return []
        finally:
            sel.close()
        try:
            chunk = self.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
            return None
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_LINE:
            self._buffer = b""  # never a real message: drop it rather than grow without end
        messages = []
        for line in lines:
            if not line.strip() or len(line) > MAX_LINE:
                continue
            with contextlib.suppress(UntrustedJSONError):
                message = loads_untrusted(line)
                if isinstance(message, dict):
                    messages.append(message)
        return messages

    def close(self) -> None:
        with self._lock:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.close()


class Server:
    """The supervisor's end: accepts ranks, yields (rank, message) and (rank, None) on disconnect."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.ranks: dict[int, socket.socket] = {}
        self._buffers: dict[socket.socket, bytes] = {}
        self._rank_of: dict[socket.socket, int] = {}
        self._skipping: set[socket.socket] = set()
        self.malformed = 0
        self.first_malformed = ""
        self._pinged_at = -PING_S
        self._pings = 0
        self._hosts_sent = ""

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def poll(self, timeout: float) -> list[tuple[int, dict[str, Any] | None]]:
        events: list[tuple[int, dict[str, Any] | None]] = []
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                try:
                    conn, _addr = self.listener.accept()
                except OSError:
                    continue
                conn.setblocking(False)
                self._buffers[conn] = b""
                self.selector.register(conn, selectors.EVENT_READ, "rank")
                continue
            conn = key.fileobj  # type: ignore[assignment]
            try:
                chunk = conn.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if not chunk:
                events.extend(self._drop(conn))
                continue
            for line in self._lines(conn, chunk):
                message = self._parse(line)
                if message is None:
                    continue
                if message.get("t") == "hello":
                    self._rank_of[conn] = message["rank"]
                    self.ranks[message["rank"]] = conn
                elif message.get("t") == "init" and message.get("bind") and isinstance(message.get("rank"), int) \
                        and message["rank"] >= 0:
                    # A process the script started claims its rank: from now on it is that rank. A second
                    # claimant of the same rank keeps the first one's route (the verdict names both).
                    was = self._rank_of.get(conn)
                    message["was"] = was
                    if was is not None and self.ranks.get(was) is conn:
                        del self.ranks[was]
                    self._rank_of[conn] = message["rank"]
                    self.ranks.setdefault(message["rank"], conn)
                rank = self._rank_of.get(conn)
                if rank is not None:
                    events.append((rank, message))
        return events

    def _lines(self, conn: socket.socket, chunk: bytes) -> list[bytes]:
        """Complete lines of ``conn`` so far; an over-long line is skipped up to its newline."""
        data = self._buffers[conn] + chunk
        skipping = conn in self._skipping
        *lines, rest = data.split(b"\n")
        if skipping and lines:
            lines = lines[1:]  # the tail of the over-long line
            self._skipping.discard(conn)
        elif skipping:
            rest = b""
        if len(rest) > MAX_LINE:
            self._note(f"a line longer than {MAX_LINE} bytes")
            self._skipping.add(conn)
            rest = b""
        self._buffers[conn] = rest
        too_long = [line for line in lines if len(line) > MAX_LINE]
        for _ in too_long:
            self._note(f"a line longer than {MAX_LINE} bytes")
        return [line for line in lines if line.strip() and len(line) <= MAX_LINE]

    def _parse(self, line: bytes) -> dict[str, Any] | None:
        """The message on ``line``, or None (counted) when it is not one the supervisor can use."""
        try:
            message = loads_untrusted(line)
        except UntrustedJSONError as exc:
            self._note(f"not JSON the ranks send ({exc})")
            return None
        why = well_formed(message)
        if why:
            self._note(why)
            return None
        return message  # well_formed: a dict

    def _note(self, why: str) -> None:
        self.malformed += 1
        if not self.first_malformed:
            self.first_malformed = why[:200]

    def malformed_line(self) -> str | None:
        """The line the supervisor prints at the end when garbage arrived on the channel."""
        if not self.malformed:
            return None
        return (f"ddpdoctor watch: ignored {self.malformed} malformed message(s) on the watch channel "
                f"(first: {self.first_malformed}); something other than ddpdoctor's ranks wrote to it, or a "
                "rank died mid-message")

    def _drop(self, conn: socket.socket) -> list[tuple[int, dict[str, Any] | None]]:
        self.selector.unregister(conn)
        self._buffers.pop(conn, None)
        self._skipping.discard(conn)
        conn.close()
        rank = self._rank_of.pop(conn, None)
        if rank is None:
            return []
        if self.ranks.get(rank) is conn:
            del self.ranks[rank]
        return [(rank, None)]

    def send(self, rank: int, message: dict[str, Any]) -> None:
        conn = self.ranks.get(rank)
        if conn is None:
            return
        try:
            conn.setblocking(True)
            conn.settimeout(2)
            conn.sendall(encode(message))
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.setblocking(False)

    def keepalive(self, hosts: dict[str, list[int]], decided: bool, now: float | None = None) -> None:
        """Once a second: a ``ping`` to every rank, so a rank on another host can tell a silent supervisor (a cut
        link, a lost host: no FIN ever arrives) from a quiet one, and name whom it lost (``hosts``: the rank
        map, sent when it changed and every :data:`HOSTS_EVERY` pings). ``decided``: a verdict is being written
        (stacks, the bundle), and the exit message will follow."""
        now = time.monotonic() if now is None else now
        if now - self._pinged_at < PING_S:
            return
        self._pinged_at = now
        self._pings += 1
        message: dict[str, Any] = {"t": "ping", "verdict": decided}
        signature = repr(sorted(hosts.items()))
        if signature != self._hosts_sent or self._pings % HOSTS_EVERY == 0:
            message["hosts"] = hosts
            self._hosts_sent = signature
        for rank in list(self.ranks):
            self.send(rank, message)

    def close(self) -> None:
        for conn in list(self._buffers):
            with contextlib.suppress(OSError):
                conn.close()
        self.selector.close()
        self.listener.close()


# -- the shape of a message ---------------------------------------------------------------------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _opt(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or isinstance(value, kind)


def _record_ok(record: Any) -> bool:
    """A recorded call as :meth:`ddpdoctor.watch.recorder.Record.to_json` writes it."""
    if not isinstance(record, dict) or not isinstance(record.get("op"), str):
        return False
    members = record.get("members")
    return (_opt(record.get("group"), str) and (record.get("seq") is None or _is_int(record.get("seq")))
            and _opt(record.get("sig"), str) and _opt(record.get("desc"), str) and _opt(record.get("site"), str)
            and (members is None or (isinstance(members, list) and all(_is_int(m) for m in members))))


def _pitfalls_ok(items: Any) -> bool:
    from ddpdoctor.watch.pitfalls import MESSAGES

    return items is None or (isinstance(items, list) and all(
        isinstance(i, dict) and i.get("kind") in MESSAGES and isinstance(i.get("key"), str)
        and _opt(i.get("site"), str) and (i.get("epochs") is None or _is_int(i.get("epochs"))) for i in items))


def _inflight_ok(items: Any) -> bool:
    """In-flight calls as :meth:`ddpdoctor.watch.progress.InFlight.to_json` writes them."""
    return items is None or (isinstance(items, list) and all(
        isinstance(i, dict) and isinstance(i.get("op"), str) and isinstance(i.get("on"), str)
        and (i.get("seq") is None or _is_int(i.get("seq"))) and _opt(i.get("site"), str)
        and _opt(i.get("group"), str) and _opt(i.get("desc"), str) and _is_num(i.get("age_s")) for i in items))


def _frames_ok(frames: Any) -> bool:
    """[file, line, function, source] per frame (``watchdog.frames_of``)."""
    return frames is None or (isinstance(frames, list) and all(
        isinstance(f, list) and len(f) == 4 and isinstance(f[0], str) and _is_int(f[1]) and isinstance(f[2], str)
        and isinstance(f[3], str) for f in frames))


def _loader_ok(loader: Any) -> bool:
    """A DataLoader wait as ``watchdog.dataloader_wait`` reports it."""
    if loader is None:
        return True
    return (isinstance(loader, dict) and isinstance(loader.get("workers"), list)
            and all(_is_int(p) for p in loader["workers"])
            and all(loader.get(k) is None or _is_int(loader.get(k)) for k in ("worker_id", "worker_pid"))
            and isinstance(loader.get("worker_stack"), list) and all(isinstance(x, str) for x in loader["worker_stack"]))


def _steps_ok(steps: Any) -> bool:
    return steps is None or (isinstance(steps, dict) and all(
        steps.get(k) is None or _is_num(steps.get(k)) for k in ("window", "wait_us", "step_us")))


def well_formed(message: Any) -> str:
    """'' when ``message`` has the shape the supervisor reads, else what is wrong with it.

    Only the fields the aggregator and the server use are checked; unknown message types pass (and
    are ignored there)."""
    if not isinstance(message, dict):
        return f"a JSON {type(message).__name__}, not an object"
    kind = message.get("t")
    if not isinstance(kind, str):
        return "an object without a message type"
    ok = True
    if kind == "hello":
        ok = _is_int(message.get("rank")) and (message.get("pid") is None or _is_int(message.get("pid"))) \
            and _opt(message.get("host"), str) and _opt(message.get("role"), str) \
            and (message.get("index") is None or _is_int(message.get("index")))
    elif kind == "init":
        claim = message.get("claim")
        ok = isinstance(claim, dict) and (message.get("rank") is None or _is_int(message.get("rank"))) and all(
            claim.get(k) is None or _is_int(claim.get(k)) for k in ("rank", "world_size", "pid")) \
            and (claim.get("timeout_s") is None or _is_num(claim.get("timeout_s")))
    elif kind == "rec":
        recs = message.get("recs")
        ok = isinstance(recs, list) and all(_record_ok(r) for r in recs)
    elif kind == "beat":
        seqs = message.get("seqs")
        ok = _is_int(message.get("progress")) and all(
            message.get(k) is None or _record_ok(message.get(k)) for k in ("cur", "last")) \
            and (seqs is None or (isinstance(seqs, dict) and all(_is_int(v) for v in seqs.values()))) \
            and _steps_ok(message.get("steps")) and _inflight_ok(message.get("inflight")) \
            and all(message.get(k) is None or _is_int(message.get(k)) for k in ("done", "inflight_n")) \
            and _opt(message.get("started"), bool)
    elif kind == "stack":
        stack = message.get("stack")
        ok = isinstance(stack, list) and all(isinstance(line, str) for line in stack) \
            and _pitfalls_ok(message.get("pitfalls")) and _opt(message.get("fr"), str) \
            and _frames_ok(message.get("frames")) and _inflight_ok(message.get("inflight")) \
            and _loader_ok(message.get("loader"))
    elif kind == "exit":
        ok = _is_int(message.get("code")) and _opt(message.get("error"), str) \
            and _pitfalls_ok(message.get("pitfalls")) and (message.get("at") is None or _is_num(message.get("at")))
    return "" if ok else f"a {kind!r} message without the fields it needs"
