"""`port`: MASTER_ADDR:MASTER_PORT reachable from every rank, and not fought over.

What fails in real life: a previous job still holds MASTER_PORT (``RuntimeError: The server socket has
failed to listen on any local network address. ... [errno: 98 - Address already in use]``); a rank whose
MASTER_ADDR is wrong or firewalled waits and dies with ``The client socket has timed out after 1800000ms
while trying to connect to (10.0.0.1, 29500)``; a MASTER_PORT inside the kernel's ephemeral range is
sometimes taken by an outgoing connection, so the job fails only now and then.
Reproduce by hand: ``python -m http.server 29500 & ddpdoctor check --master-port 29500``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Mapping

from ddpdoctor import ports
from ddpdoctor.check import Check, CheckContext, all_findings, collapse
from ddpdoctor.findings import FAIL, PASS, WARN, Finding, RankInfo
from ddpdoctor.ranks import format_rank_list

REACHED = "reached MASTER_ADDR:MASTER_PORT"
# A connect slower than this on a cluster network means a congested or misrouted path to rank 0's host.
SLOW_CONNECT_MS = 200.0


def _connect_ms(addr: str, port: int, timeout_s: float) -> float:
    start = time.perf_counter()
    with socket.create_connection((addr, port), timeout=timeout_s):
        pass
    return (time.perf_counter() - start) * 1000.0


def _own_process_tree() -> set[int]:
    """This process and its ancestors: the launcher that hosts our store is one of them."""
    import psutil

    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return pids


def _is_this_host(ip: str) -> bool:
    from ddpdoctor.env import facts as envinfo

    return ip.startswith("127.") or any(ip in addrs for addrs in envinfo.interfaces().values())


def _run(ctx: CheckContext) -> list[Finding]:
    findings: list[Finding] = []
    try:
        resolved = socket.gethostbyname(ctx.master_addr)
    except OSError as exc:
        return [ctx.finding(FAIL, f"MASTER_ADDR {ctx.master_addr!r} does not resolve: {exc}",
                            "set MASTER_ADDR to rank 0's hostname or IP as every node resolves it")]
    try:
        connect_ms = _connect_ms(ctx.master_addr, ctx.master_port, min(5.0, max(0.5, ctx.remaining_s())))
    except OSError as exc:
        findings.append(ctx.finding(
            FAIL, f"cannot reach MASTER_ADDR:MASTER_PORT {ctx.master_addr}:{ctx.master_port}: {exc}",
            f"from {ctx.host}, check the address (it must be rank 0's host), routes and firewalls for "
            f"TCP port {ctx.master_port}", master_addr=ctx.master_addr, resolved=resolved))
        return findings
    findings.append(ctx.finding(PASS, REACHED, connect_ms=round(connect_ms, 3), resolved=resolved))
    if ctx.local_rank == 0:
        own = _own_process_tree()
        strangers = [h for h in ports.holders(ctx.master_port) if h.pid is not None and h.pid not in own]
        if strangers and _is_this_host(resolved):
            findings.append(ctx.finding(
                WARN, f"MASTER_PORT {ctx.master_port} is also held by " + "; ".join(h.describe() for h in strangers),
                f"another job may answer on this port; pick a free one (e.g. {ports.free_port()})"))
        span = ports.ephemeral_range()
        # Under torchrun the agent has bound the port before any rank starts (with c10d rendezvous it
        # even picks it from the ephemeral range itself): the race is over and the advice would be noise.
        launcher_owns_port = ctx.launcher in ("torchrun", "local")
        if span and span[0] <= ctx.master_port <= span[1] and not launcher_owns_port:
            findings.append(ctx.finding(
                WARN, f"MASTER_PORT {ctx.master_port} is inside the ephemeral range {span[0]}-{span[1]}",
                "an outgoing connection can take it first and make the job fail now and then with "
                "'Address already in use'; use a port below the range, e.g. 29500"))
    return findings


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    reached = {f.ranks[0]: f.details for f in all_findings(findings_by_rank) if f.summary == REACHED}
    others = [f for f in all_findings(findings_by_rank) if f.summary != REACHED]
    result: list[Finding] = []
    if reached:
        times = {r: d["connect_ms"] for r, d in reached.items()}
        slowest = max(times, key=lambda r: times[r])
        resolved = {r: d["resolved"] for r, d in reached.items()}
        if len(set(resolved.values())) > 1:
            groups: dict[str, list[int]] = {}
            for rank, ip in resolved.items():
                groups.setdefault(ip, []).append(rank)
            result.append(Finding(
                "port", WARN, "MASTER_ADDR resolves differently across ranks: "
                + "; ".join(f"{ip} on ranks {format_rank_list(r)}" for ip, r in groups.items()),
                sorted(reached), "use rank 0's IP address as MASTER_ADDR so every node means the same host"))
        status = WARN if times[slowest] > SLOW_CONNECT_MS else PASS
        result.append(Finding(
            "port", status, f"every reporting rank reached the master port; slowest connect "
            f"{times[slowest]:.1f} ms (rank {slowest})", sorted(reached),
            "a slow connect to rank 0's host points at a congested or misrouted path" if status == WARN else "",
            {"connect_ms": {str(r): t for r, t in times.items()}}))
    return result + collapse(others)


CHECK = Check(id="port", title="Master address and port reachable, port not contested", run=_run, combine=_combine)
