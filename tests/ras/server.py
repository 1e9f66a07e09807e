"""A stand-in for NCCL's RAS service: a real TCP server on 127.0.0.1 that replays a recorded status.

Labelled as what it is: no NCCL job can run here (no GPU), so this speaks the server side of NCCL's RAS
client protocol as ``rasClientProcessMsg`` in NVIDIA/nccl ``src/ras/client_support.cc`` does -- answer
``CLIENT PROTOCOL n`` with ``SERVER PROTOCOL 2``, ``TIMEOUT n`` with ``OK``, ``SET FORMAT json`` with ``OK``
(NCCL >= 2.28.7) or ``ERROR: Unknown command ...`` (older), then ``STATUS`` with the transcript and a close --
and can misbehave on purpose: never answer (``silent``) or stop mid-reply (``hang_after``).
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

DATA = Path(__file__).parent / "data"


class RasStandIn:
    """Serve one scenario on an ephemeral port until :meth:`close`; ``commands`` records what clients sent."""

    def __init__(self, text_body: str = "", json_body: str | None = None, *, silent: bool = False,
                 hang_after: int | None = None) -> None:
        self.text_body, self.json_body = text_body, json_body
        self.silent, self.hang_after = silent, hang_after
        self.commands: list[str] = []
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @classmethod
    def from_files(cls, text: str | None = None, json_file: str | None = None, **kw: object) -> RasStandIn:
        return cls((DATA / text).read_text() if text else "",
                   (DATA / json_file).read_text() if json_file else None, **kw)  # type: ignore[arg-type]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        fmt = "text"
        with conn:
            conn.settimeout(0.1)
            buf = b""
            while not self._stop.is_set():
                try:
                    chunk = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    raw, _, buf = buf.partition(b"\n")
                    cmd = raw.decode().rstrip("\r")
                    self.commands.append(cmd)
                    if self.silent:
                        continue
                    low = cmd.lower()
                    if low.startswith("client protocol "):
                        conn.sendall(b"SERVER PROTOCOL 2\n")
                    elif low.startswith("timeout "):
                        conn.sendall(b"OK\n")
                    elif low.startswith("set format "):
                        if self.json_body is not None and low.endswith("json"):
                            fmt = "json"
                            conn.sendall(b"OK\n")
                        else:
                            conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())
                    elif low in ("status", "verbose status"):
                        body = (self.json_body if fmt == "json" else self.text_body) or ""
                        data = body.encode()
                        if self.hang_after is not None:
                            conn.sendall(data[: self.hang_after])
                            self._stop.wait(30)  # a hung NCCL process: the connection stays open, silent
                            return
                        conn.sendall(data)
                        return  # NCCL closes the connection after the status
                    else:
                        conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=2)

    def __enter__(self) -> RasStandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
