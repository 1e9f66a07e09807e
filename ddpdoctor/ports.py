"""Who holds a TCP port, whether a port is free, and a free one to suggest instead.

Used before anything binds (self-launch) and by the ``port`` check. A port held by another job is the
classic ``EADDRINUSE`` / "The server socket has failed to listen on any local network address" crash of
``init_process_group``; naming the holder (pid and command line) turns it into a one-line fix.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class PortHolder:
    """A process listening on a port (pid None when the OS will not say whose socket it is)."""

    pid: int | None
    cmdline: str
    address: str

    def describe(self) -> str:
        who = f"pid {self.pid} ({self.cmdline})" if self.pid is not None else "a process ddpdoctor may not inspect"
        return f"{who} listening on {self.address}"


def port_is_free(port: int, host: str = "") -> bool:
    """True when a server could bind ``port`` now (as TCPStore would, with SO_REUSEADDR)."""
    for family, addr in ((socket.AF_INET, host or "0.0.0.0"), (socket.AF_INET6, host or "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            # EADDRNOTAVAIL for an IPv6-less host: that family simply does not apply.
        finally:
            sock.close()
    return True


def holders(port: int) -> list[PortHolder]:
    """Processes listening on ``port`` on this host (pids need privileges for other users' sockets)."""
    import psutil

    found: list[PortHolder] = []
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return found
    for conn in connections:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        cmdline = "?"
        if conn.pid is not None:
            try:
                cmdline = " ".join(psutil.Process(conn.pid).cmdline()) or psutil.Process(conn.pid).name()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                cmdline = "?"
        found.append(PortHolder(conn.pid, cmdline[:200], f"{conn.laddr.ip}:{conn.laddr.port}"))
    return found


def free_port(host: str = "", span: range = range(29500, 30000)) -> int:
    """A free port, preferably in torch's customary 29500-29999 (``span``) and so outside the ephemeral range
    (where an outgoing connection could take it before the store binds)."""
    import random

    candidates = list(span)
    random.shuffle(candidates)
    for port in candidates[:50]:
        if port_is_free(port, host):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host or "0.0.0.0", 0))
        return int(sock.getsockname()[1])


def ephemeral_range() -> tuple[int, int] | None:
    """Linux's ip_local_port_range: ports the kernel hands to outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low, high = handle.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def busy_port_message(port: int) -> str:
    """One paragraph: who holds the port and which one to use instead."""
    found = holders(port)
    who = "; ".join(h.describe() for h in found) if found else "another process (not visible to this user)"
    return (f"MASTER_PORT {port} is already in use on {socket.gethostname()} by {who}. "
            f"Use a free port, e.g. --master-port {free_port()} (or export MASTER_PORT), "
            "or stop the process that holds it.")
