"""Measuring on every rank: one size of one collective, and the pairwise link test, combined across ranks.

Shared by ``ddpdoctor bench`` (:mod:`ddpdoctor.bench.driver`) and the ``bandwidth`` check: both call these
inside an initialised process group, every rank the same sequence. torch is imported when measuring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ddpdoctor.bench.analysis import OPS, PairResult, Row, combine_row, pair_schedule, row_count


def gather(value: Any) -> list[Any]:
    """Every rank's ``value``, on every rank (small Python objects: timings, counts)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def measure_row(op: str, size: int, dtype: str, iters: int, warmup: int, check: bool, device: Any) -> Row:
    """One size of one op, timed on every rank and combined (avg, max, slowest rank, summed #wrong)."""
    import torch.distributed as dist

    from ddpdoctor.bench.ops import OpRunner, timed_loop, world_barrier

    rank, nranks = dist.get_rank(), dist.get_world_size()
    count = row_count(size, dtype, op, nranks)
    runner = OpRunner(op, count, dtype, rank, nranks, device)
    time_us = timed_loop(runner.call, iters, warmup, device, world_barrier())
    wrong = runner.wrong() if check else None
    per_rank = gather((time_us, wrong))
    element = runner.input.element_size()
    return combine_row(op, count * element, count, dtype, [t for t, _ in per_rank],
                       None if not check else [w for _, w in per_rank], requested=size)


def measure_pairs(hosts: Mapping[int, str], size: int, dtype: str, iters: int, warmup: int,
                  device: Any) -> list[PairResult]:
    """Bidirectional sendrecv between pairs of ranks, round by round (disjoint pairs run together).

    busbw of a pair = S / t with S the bytes sent each way (nccl-tests' sendrecv factor 1); the pair's
    time is the slower of its two ranks'.
    """
    import torch
    import torch.distributed as dist

    from ddpdoctor.bench.ops import make_input, timed_loop

    rank, nranks = dist.get_rank(), dist.get_world_size()
    count = max(1, row_count(size, dtype, "sendrecv", nranks))
    send = make_input("sendrecv", rank, nranks, count, dtype, device)
    recv = torch.empty_like(send)
    mine: dict[str, float] = {}
    for pairs in pair_schedule(hosts):
        dist.barrier()
        for a, b in pairs:
            if rank in (a, b):
                peer = b if rank == a else a
                mine[f"{a},{b}"] = timed_loop(_exchange_with(send, recv, peer), iters, warmup, device)
    dist.barrier()
    times: dict[str, float] = {}
    for theirs in gather(mine):
        for key, t in theirs.items():
            times[key] = max(times.get(key, 0.0), t)
    spec = OPS["sendrecv"]
    nbytes = count * send.element_size()
    results = []
    for key, t in times.items():
        a, b = (int(x) for x in key.split(","))
        results.append(PairResult(a, b, hosts[a], hosts[b], spec.busbw_gbps(nbytes, 2, t), t))
    return results


def _exchange_with(send: Any, recv: Any, peer: int) -> Callable[[], None]:
    from ddpdoctor.bench.ops import exchange

    return lambda: exchange(send, peer, recv, peer)
