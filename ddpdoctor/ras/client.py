"""The client side of NCCL's RAS protocol, with a deadline on every socket operation.

The exchange, as NCCL's own ``ncclras`` client does it (NVIDIA/nccl ``src/ras/client.cc``; the server side
is ``rasClientProcessMsg`` in ``src/ras/client_support.cc``)::

    -> CLIENT PROTOCOL 2        <- SERVER PROTOCOL 2
    -> TIMEOUT 3                <- OK             (how long NCCL waits for its peers; optional)
    -> SET FORMAT json          <- OK             (NCCL >= 2.28.7; older ones: "ERROR: Unknown command ...")
    -> STATUS                   <- the report, then the server closes the connection

Commands are case-insensitive lines. A server that accepts but never answers, or stops mid-reply (a hung
process, or one of the NCCL versions that misbehaved under frequent polling), costs at most the deadline:
the whole exchange shares one monotonic deadline, and each ``connect``/``send``/``recv`` gets what is left.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

DEFAULT_PORT = 28028  # NCCL_RAS_CLIENT_PORT in src/ras/ras_internal.h
DEFAULT_ADDR = f"localhost:{DEFAULT_PORT}"
PROTOCOL = 2  # NCCL_RAS_CLIENT_PROTOCOL
MAX_REPLY_BYTES = 32 * 2**20  # a status of a large job is kilobytes; never grow without bound


class RasError(Exception):
    """The RAS exchange failed; the message says where and what to do."""


class RasUnavailable(RasError):
    """No RAS service at the address: nothing listens there (no NCCL >= 2.24 job, RAS disabled, wrong
    NCCL_RAS_ADDR), its host does not resolve, or what answers does not speak RAS. The address is wrong,
    so the commands treat it as bad input (exit 2), not as a finding about the job."""


class RasUnresolvable(RasUnavailable):
    """The host of the address does not resolve (DNS, /etc/hosts): a typo, not a job problem."""


class NotRas(RasUnavailable):
    """Something listens at the address but answered the handshake as no RAS service would."""


class RasTimeout(RasError):
    """The service accepted the connection but did not finish within the deadline."""

    def __init__(self, message: str, partial: str = "") -> None:
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class RasReply:
    """What the service said: the status body as text, in which format, and the protocol it spoke."""

    addr: str
    body: str
    format: str  # "json" or "text"
    server_protocol: int | None
    elapsed_s: float


def ras_addr_from_env(environ: dict[str, str] | None = None) -> str:
    """``NCCL_RAS_ADDR`` as NCCL reads it (``host:port``), else ``localhost:28028``."""
    env = os.environ if environ is None else environ
    return env.get("NCCL_RAS_ADDR", "").strip() or DEFAULT_ADDR


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a bare ``host`` (default port) -> (host, port); ValueError if bad."""
    text = addr.strip()
    if not text:
        raise ValueError("empty address")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"no host in {addr!r}")
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port {port_text!r} in {addr!r}")
    return host, int(port_text)


class _Conn:
    """A socket whose every operation is bounded by one shared deadline."""

    def __init__(self, sock: socket.socket, deadline: float, addr: str) -> None:
        self.sock, self.deadline, self.addr = sock, deadline, addr
        self.buf = b""

    def _left(self, doing: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RasTimeout(f"NCCL RAS at {self.addr} did not answer in time ({doing})",
                             self.buf.decode(errors="replace"))
        self.sock.settimeout(left)
        return left

    def send_line(self, line: str) -> None:
        data = (line + "\n").encode()
        while data:
            self._left(f"sending {line!r}")
            try:
                sent = self.sock.send(data)
            except TimeoutError:
                raise RasTimeout(f"NCCL RAS at {self.addr} did not take {line!r} in time") from None
            except OSError as exc:  # EPIPE/ECONNRESET: the serving process died between commands
                raise RasError(f"NCCL RAS at {self.addr} dropped the connection ({exc.strerror or exc}) while "
                               f"sending {line!r}") from None
            data = data[sent:]

    def _recv(self, doing: str) -> bytes:
        self._left(doing)
        try:
            return self.sock.recv(65536)
        except TimeoutError:
            raise RasTimeout(f"NCCL RAS at {self.addr} did not answer in time ({doing})",
                             self.buf.decode(errors="replace")) from None
        except OSError as exc:  # ECONNRESET: the serving process died mid-reply
            raise RasError(f"NCCL RAS at {self.addr} dropped the connection ({exc.strerror or exc}) while "
                           f"{doing}") from None

    def read_line(self, doing: str) -> str:
        while b"\n" not in self.buf:
            chunk = self._recv(doing)
            if not chunk:
                raise RasError(f"NCCL RAS at {self.addr} closed the connection while {doing}")
            self.buf += chunk
            if len(self.buf) > 65536:
                raise RasError(f"NCCL RAS at {self.addr} sent a line over 64 KiB while {doing}: not a RAS service?")
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace").rstrip("\r")

    def read_to_eof(self, doing: str) -> str:
        while True:
            chunk = self._recv(doing)
            if not chunk:
                break
            self.buf += chunk
            if len(self.buf) > MAX_REPLY_BYTES:
                raise RasError(f"NCCL RAS at {self.addr} sent over {MAX_REPLY_BYTES} bytes; stopped reading")
        body, self.buf = self.buf, b""
        return body.decode(errors="replace")


def _resolve(host: str, port: int, addr: str, deadline_s: float) -> list[Any]:
    """The addresses ``host`` resolves to (``getaddrinfo`` tuples, in its order), looked up within the deadline.

    A name that does not resolve is named as such (``socket.gaierror``: "Name or service not known"), not
    as a job that is not running; ``getaddrinfo`` has no timeout of its own and a dead name server can
    hold it for tens of seconds, so it runs in a daemon thread that is abandoned at the deadline.
    """
    import threading

    found: list[object] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as exc:  # UnicodeError: a label IDNA cannot encode
            found.append(exc)

    worker = threading.Thread(target=lookup, name="ddpdoctor-ras-resolve", daemon=True)
    worker.start()
    worker.join(max(deadline_s, 0.001))
    if not found:
        raise RasUnresolvable(f"the host {host!r} of the RAS address {addr} did not resolve within {deadline_s:g} s "
                              "(the name service does not answer): use the host's IP address")
    result = found[0]
    if isinstance(result, BaseException):
        why = getattr(result, "strerror", None) or str(result) or type(result).__name__
        raise RasUnresolvable(f"the host {host!r} of the RAS address {addr} does not resolve ({why}): check the "
                              "host name in --addr or NCCL_RAS_ADDR, or use an IP address")
    infos = result if isinstance(result, list) else []
    if not infos:
        raise RasUnresolvable(f"the host {host!r} of the RAS address {addr} resolves to no address")
    return infos


def _connect(infos: list[Any], deadline: float) -> socket.socket:
    """Connect to the first resolved address that accepts (as ``socket.create_connection`` does), each
    attempt bounded by what is left of the deadline; the last error when none accepts."""
    error: OSError = OSError("no address")
    for family, kind, proto, _name, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
            if isinstance(exc, TimeoutError):
                break
    raise error


def query(addr: str, *, deadline_s: float = 5.0, fmt: str = "json", verbose: bool = False,
          ras_timeout_s: int | None = None) -> RasReply:
    """One ``STATUS`` exchange with the RAS service at ``addr``; raises :class:`RasError` subclasses.

    ``fmt="json"`` asks for JSON and falls back to text on NCCL < 2.28.7. ``ras_timeout_s`` is sent as
    ``TIMEOUT n`` (how long NCCL waits for its peers); by default one second less than our deadline, so
    NCCL reports its missing peers before we give up on it.
    """
    host, port = parse_addr(addr)
    start = time.monotonic()
    deadline = start + deadline_s
    infos = _resolve(host, port, addr, deadline_s)
    try:
        sock = _connect(infos, deadline)
    except TimeoutError:
        raise RasTimeout(f"connecting to NCCL RAS at {addr} timed out after {deadline_s:g} s") from None
    except OSError as exc:
        where = "this host" if host in ("localhost", "127.0.0.1", "::1") else host
        raise RasUnavailable(
            f"no NCCL RAS service at {addr} ({exc.strerror or exc}): is an NCCL >= 2.24 job running on {where} "
            "with RAS enabled (NCCL_RAS_ENABLE, default on), and does --addr match its NCCL_RAS_ADDR?"
        ) from None
    with sock:
        conn = _Conn(sock, deadline, addr)
        conn.send_line(f"CLIENT PROTOCOL {PROTOCOL}")
        hello = conn.read_line("waiting for its protocol handshake")
        if not hello.upper().startswith("SERVER PROTOCOL "):
            raise NotRas(f"{addr} is not an NCCL RAS service: it answered {hello[:80]!r} to the handshake "
                         "(NCCL answers 'SERVER PROTOCOL n'); is --addr/NCCL_RAS_ADDR the port of another service?")
        words = hello.split()
        server_protocol = int(words[2]) if len(words) > 2 and words[2].isdigit() else None
        timeout = ras_timeout_s if ras_timeout_s is not None else max(1, int(deadline_s) - 1)
        conn.send_line(f"TIMEOUT {timeout}")
        answer = conn.read_line("setting its timeout")
        if answer.upper() != "OK":
            raise RasError(f"NCCL RAS at {addr} refused 'TIMEOUT {timeout}': {answer[:120]}")
        got = "text"
        if fmt == "json":
            conn.send_line("SET FORMAT json")
            answer = conn.read_line("setting the JSON format")
            # NCCL < 2.28.7 answers "ERROR: Unknown command SET FORMAT json" and keeps the connection.
            got = "json" if answer.upper() == "OK" else "text"
        conn.send_line("VERBOSE STATUS" if verbose else "STATUS")
        body = conn.read_to_eof("sending its status")
    return RasReply(addr=addr, body=body, format=got, server_protocol=server_protocol,
                    elapsed_s=time.monotonic() - start)
