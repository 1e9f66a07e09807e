"""`ddpdoctor watch`'s own side channel: JSON lines over TCP, independent of the job's process group.

The job's collectives may be stuck (that is what we diagnose) and its TCPStore belongs to the job, so
the ranks' watchdog threads talk to the supervisor over a plain socket of ddpdoctor's own. One line is
one JSON message; the server side is a ``selectors`` loop that never blocks longer than its poll slice.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
from typing import Any

ADDR_ENV = "DDPDOCTOR_WATCH_CHANNEL"


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
        return [json.loads(line) for line in lines if line.strip()]

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
            data = self._buffers[conn] + chunk
            *lines, self._buffers[conn] = data.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                message = json.loads(line)
                if message.get("t") == "hello":
                    self._rank_of[conn] = int(message["rank"])
                    self.ranks[int(message["rank"])] = conn
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

    def _drop(self, conn: socket.socket) -> list[tuple[int, dict[str, Any] | None]]:
        self.selector.unregister(conn)
        self._buffers.pop(conn, None)
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

    def close(self) -> None:
        for conn in list(self._buffers):
            with contextlib.suppress(OSError):
                conn.close()
        self.selector.close()
        self.listener.close()
