"""`connectivity`: the process group under test really moves correct data between every pair of ranks.

What fails in real life: a firewall lets the rendezvous through but blocks the ports NCCL/gloo open
between ranks; one NIC or link is down, so ranks on one node cannot reach one other node; two ranks
picked the same GPU. How it shows up: the first collective hangs until the watchdog fires (``Watchdog
caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE ...``), gloo raises
``Connection reset by peer`` / ``Timed out waiting ... for recv operation``, NCCL says ``Duplicate GPU
detected : rank 1 and rank 0 both on CUDA device 1000``.
Reproduce by hand: ``GLOO_SOCKET_IFNAME=lo`` on one node of a two-node job, or kill one rank mid-run.

Steps: barrier, all_reduce of values whose sum is known exactly, broadcast from rank 0, all_gather of
hostnames, then a ring of point-to-point send/recv (rank i -> i+1) so a broken link is named as a pair.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ddpdoctor.check import COLLECTIVE_FAILED, Check, CheckContext, all_findings, collapse
from ddpdoctor.errors import short_error
from ddpdoctor.findings import FAIL, PASS, Finding, RankInfo
from ddpdoctor.runtime.device import barrier_kwargs

HEALTHY = "collectives and ring send/recv correct"
N = 1024


def _wait(work: Any, ctx: CheckContext) -> None:
    """Wait for an async op no longer than the check's deadline (gloo honours the timeout)."""
    work.wait(timeout=timedelta(seconds=max(0.5, ctx.remaining_s())))


def _run(ctx: CheckContext) -> list[Finding]:
    import torch
    import torch.distributed as dist

    device = torch.device(ctx.device)
    n, rank = ctx.world_size, ctx.rank
    timings: dict[str, float] = {}
    step = "barrier"

    def timed(name: str, start: float) -> None:
        timings[name] = round((time.perf_counter() - start) * 1e6, 1)

    try:
        start = time.perf_counter()
        _wait(dist.barrier(async_op=True, **barrier_kwargs(ctx.backend, ctx.device)), ctx)
        timed("barrier_us", start)

        step = "all_reduce"
        tensor = torch.full((N,), float(rank + 1), device=device)
        start = time.perf_counter()
        _wait(dist.all_reduce(tensor, async_op=True), ctx)
        timed("all_reduce_us", start)
        expected = n * (n + 1) / 2
        if not bool(torch.all(tensor == expected)):
            got = float(tensor[0])
            return [ctx.finding(FAIL, f"all_reduce returned wrong values (expected {expected:g}, got {got:g})",
                                "wrong sums mean corrupted transfers: check NIC offload settings, "
                                "NCCL_PROTO/NCCL_ALGO overrides and GPU memory errors")]

        step = "broadcast"
        tensor = torch.arange(N, dtype=torch.float32, device=device) if rank == 0 else torch.zeros(N, device=device)
        start = time.perf_counter()
        _wait(dist.broadcast(tensor, src=0, async_op=True), ctx)
        timed("broadcast_us", start)
        if not bool(torch.equal(tensor.cpu(), torch.arange(N, dtype=torch.float32))):
            return [ctx.finding(FAIL, "broadcast from rank 0 delivered wrong values",
                                "check the link between this rank and rank 0")]

        step = "all_gather"
        names = [torch.zeros(64, dtype=torch.uint8, device=device) for _ in range(n)]
        mine = torch.zeros(64, dtype=torch.uint8, device=device)
        encoded = ctx.host.encode()[:64]
        mine[: len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8)
        start = time.perf_counter()
        _wait(dist.all_gather(names, mine, async_op=True), ctx)
        timed("all_gather_us", start)
        hosts = [bytes(row.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for row in names]
        if hosts[rank] != ctx.host[:64]:
            return [ctx.finding(FAIL, "all_gather returned a wrong entry for this rank",
                                "wrong data in all_gather: check the transport (NCCL_PROTO, NIC offloads)")]

        details: dict[str, Any] = {"hosts": hosts, **timings}
        if n > 1:
            step = "ring send/recv"
            nxt, prv = (rank + 1) % n, (rank - 1) % n
            out = torch.full((N,), float(rank), device=device)
            inbox = torch.full((N,), -1.0, device=device)
            start = time.perf_counter()
            ops = [dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, inbox, prv)]
            for work in dist.batch_isend_irecv(ops):
                _wait(work, ctx)
            timed("ring_us", start)
            details["ring_us"] = timings["ring_us"]
            if not bool(torch.all(inbox == float(prv))):
                return [ctx.finding(FAIL, f"ring: data from rank {prv} arrived corrupted",
                                    f"check the link {prv} -> {rank}", pair=[prv, rank])]
        return [ctx.finding(PASS, HEALTHY, **details)]
    except Exception as exc:  # a collective that fails is the finding, named by its step
        peer = ""
        if step == "ring send/recv":
            peer = f" (ring link {(rank - 1) % n} -> {rank} or {rank} -> {(rank + 1) % n})"
        return [ctx.finding(FAIL, f"{step} failed{peer}: {short_error(exc)}",
                            "a rank died or a link is blocked: see the other findings for ranks that did not "
                            "report; check firewalls and NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME",
                            kind=COLLECTIVE_FAILED, step=step, error=str(exc)[:2000])]


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    findings = all_findings(findings_by_rank)
    healthy = [f for f in findings if f.summary == HEALTHY]
    result: list[Finding] = []
    if healthy:
        # Two ranks on one GPU are the gpu check's finding (NCCL trips on it before any collective here).
        slowest = max(healthy, key=lambda f: float(f.details.get("all_reduce_us", 0.0)))
        result.append(Finding(
            "connectivity", PASS, f"barrier, all_reduce, broadcast, all_gather and ring send/recv correct; "
            f"slowest all_reduce {float(slowest.details.get('all_reduce_us', 0.0)) / 1000:.2f} ms "
            f"(rank {slowest.ranks[0]})", sorted(r for f in healthy for r in f.ranks),
            details={"per_rank": {str(f.ranks[0]): f.details for f in healthy}}))
    return result + collapse([f for f in findings if f.summary != HEALTHY])


CHECK = Check(id="connectivity", title="Collectives and point-to-point correct between all ranks",
              run=_run, combine=_combine, needs_process_group=True)
