"""Measuring on every rank: one size of one collective, and the pairwise link test, combined across ranks.

Shared by ``ddpdoctor bench`` (:mod:`ddpdoctor.bench.driver`) and the ``bandwidth`` check: both call these
inside an initialised process group, every rank the same sequence. torch is imported when measuring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ddpdoctor.bench.analysis import OPS, PairResult, Row, combine_row, pair_schedule, row_count, suspects


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


# A suspect link is measured this many more times, in rounds shaped like the one that found it.
REPEATS = 2
# At most this many distinct rounds are measured again (a bounded cost whatever the first look found).
MAX_REPEATED_ROUNDS = 4


def measure_pairs(hosts: Mapping[int, str], size: int, dtype: str, iters: int, warmup: int,
                  device: Any, repeats: int = REPEATS) -> list[PairResult]:
    """Bidirectional sendrecv between pairs of ranks, round by round (disjoint pairs run together).

    busbw of a pair = S / t with S the bytes sent each way (nccl-tests' sendrecv factor 1); the pair's
    time is the slower of its two ranks'. After the plan (:func:`pair_schedule`), the rounds holding a
    pair that a first look would blame (:func:`suspects`) run ``repeats`` more times, whole: the suspect
    is measured against itself, and the other pairs of its round, measured again beside it under the
    same load, give the run's own spread. Every rank computes the same suspects from the gathered
    numbers, so every rank runs the same rounds.
    """
    import torch

    from ddpdoctor.bench.ops import make_input

    rank, nranks = _rank_and_size()
    count = max(1, row_count(size, dtype, "sendrecv", nranks))
    send = make_input("sendrecv", rank, nranks, count, dtype, device)
    recv = torch.empty_like(send)
    spec = OPS["sendrecv"]
    nbytes = count * send.element_size()
    plan = pair_schedule(hosts)
    samples: dict[tuple[int, int], list[float]] = {}
    for key, t in _run_rounds(plan, rank, send, recv, iters, warmup, device).items():
        samples.setdefault(key, []).append(t)

    wanted: set[tuple[int, int]] = set()

    def results() -> list[PairResult]:
        out = []
        for (a, b), times in sorted(samples.items()):
            bws = [spec.busbw_gbps(nbytes, 2, t) for t in times]
            best = max(range(len(bws)), key=lambda i: bws[i])
            out.append(PairResult(a, b, hosts[a], hosts[b], bws[best], times[best], bws, (a, b) in wanted))
        return out

    wanted |= set(suspects(results()))
    again = [r for r in plan if wanted & set(r)][:MAX_REPEATED_ROUNDS]
    for _ in range(repeats if again else 0):
        for key, t in _run_rounds(again, rank, send, recv, iters, warmup, device).items():
            samples[key].append(t)
    return results()


def _rank_and_size() -> tuple[int, int]:
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def _run_rounds(rounds: list[list[tuple[int, int]]], rank: int, send: Any, recv: Any, iters: int, warmup: int,
                device: Any) -> dict[tuple[int, int], float]:
    """Each round's pairs exchange together; every pair's time (the slower end's), on every rank."""
    from ddpdoctor.bench.ops import timed_loop
    from ddpdoctor.runtime.device import bound_barrier

    mine: dict[str, float] = {}
    for pairs in rounds:
        bound_barrier()
        for a, b in pairs:
            if rank in (a, b):
                peer = b if rank == a else a
                mine[f"{a},{b}"] = timed_loop(_exchange_with(send, recv, peer), iters, warmup, device)
    bound_barrier()
    times: dict[tuple[int, int], float] = {}
    for theirs in gather(mine):
        for key, t in theirs.items():
            a, b = (int(x) for x in key.split(","))
            times[(a, b)] = max(times.get((a, b), 0.0), t)
    return times


def _exchange_with(send: Any, recv: Any, peer: int) -> Callable[[], None]:
    from ddpdoctor.bench.ops import exchange

    return lambda: exchange(send, peer, recv, peer)
