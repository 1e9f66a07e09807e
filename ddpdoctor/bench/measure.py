"""Measuring on every rank: one size of one collective, and the pairwise link test, combined across ranks.

Shared by ``ddpdoctor bench`` (:mod:`ddpdoctor.bench.driver`) and the ``bandwidth`` check: both call these
inside an initialised process group, every rank the same sequence. torch is imported when measuring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ddpdoctor.bench.analysis import OPS, Row, Timing, combine_timing, make_row, row_count
from ddpdoctor.bench.pairs import PairResult, pair_schedule, suspects, undecided


def gather(value: Any) -> list[Any]:
    """Every rank's ``value``, on every rank (small Python objects: timings, counts)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def measure_row(op: str, size: int, dtype: str, iters: int, warmup: int, check: bool | int, device: Any, *,
                redop: str | None = None, root: int = 0, average: int = 1, blocking: int = 0,
                cputime: bool = False, timestamp: Callable[[], str] | None = None) -> Row:
    """One size of one op, timed on every rank and combined (avg, max, slowest rank, summed #wrong).

    Each layout torch.distributed offers for the op is measured in nccl-tests' order, out-of-place then
    in-place, each on its own buffers: :func:`ddpdoctor.bench.ops.timed_loop`, then ``check`` untimed
    checked calls (``True`` is one). All ranks' numbers travel in one ``all_gather_object`` at the end.
    """
    import torch.distributed as dist

    from ddpdoctor.bench.ops import OpRunner, timed_loop, world_barrier

    spec = OPS[op]
    redop = redop or spec.redop
    rank, nranks = dist.get_rank(), dist.get_world_size()
    count = row_count(size, dtype, op, nranks)
    calls = int(check)
    mine: dict[str, tuple[float, int | None]] = {}
    element = 0
    for layout, in_place in (("out_of_place", False), ("in_place", True)):
        if not (spec.in_place if in_place else spec.out_of_place):
            continue
        runner = OpRunner(op, count, dtype, rank, nranks, device, redop=redop if spec.reduces else "sum", root=root,
                          in_place=in_place)
        element = runner.input.element_size()
        time_us = timed_loop(runner.call, iters, warmup, device, world_barrier(), blocking=blocking, cputime=cputime)
        mine[layout] = (time_us, runner.wrong(calls) if calls else None)
        del runner  # its buffers go before the next layout's are made
    per_rank: list[dict[str, tuple[float, int | None]]] = gather(mine)
    timings: dict[str, Timing] = {}
    for layout in mine:
        times = [theirs[layout][0] for theirs in per_rank]
        wrong = None if not calls else [theirs[layout][1] for theirs in per_rank]
        timings[layout] = combine_timing(op, count * element, times, wrong, average)
    return make_row(op, count * element, count, dtype, timings.get("out_of_place"), timings.get("in_place"),
                    requested=size, redop=redop, root=root if op == "broadcast" else spec.root,
                    timestamp=timestamp() if timestamp else "")


def probe_combinations(combos: list[tuple[str, str, str]], device: Any, root: int = 0) -> dict[tuple[str, str, str], str]:
    """Run each (op, dtype, redop) once on the smallest buffer; what the backend refused, with its error.

    Backends differ in what they reduce (gloo in torch 2.13 averages floating types but raises "result type
    Float can't be cast to the desired output type Int" for integers; older gloo refuses ReduceOp.AVG).
    The refusal comes on every rank alike (it is the same code on the same types), so every rank goes on
    to the gather; the driver leaves those combinations out and says so.
    """
    import torch.distributed as dist

    from ddpdoctor.bench.ops import OpRunner

    rank, nranks = dist.get_rank(), dist.get_world_size()
    failed: dict[str, str] = {}
    for op, dtype, redop in combos:
        spec = OPS[op]
        try:
            runner = OpRunner(op, nranks, dtype, rank, nranks, device, redop=redop if spec.reduces else "sum",
                              root=root, in_place=not spec.out_of_place)
            runner.call()
        except (RuntimeError, ValueError, TypeError) as exc:
            from ddpdoctor.errors import typed_error

            failed[f"{op}|{dtype}|{redop}"] = typed_error(exc)
    merged: dict[tuple[str, str, str], str] = {}
    for theirs in gather(failed):
        for key, why in theirs.items():
            op, dtype, redop = key.split("|")
            merged.setdefault((op, dtype, redop), why)
    return merged


# A suspect link is measured this many more times, in rounds shaped like the one that found it.
REPEATS = 2
# At most this many distinct rounds are measured again (a bounded cost whatever the first look found).
MAX_REPEATED_ROUNDS = 4
# While the run's own noise keeps a suspect from being judged, its rounds run again, at most this many times.
MAX_EXTRA_REPEATS = 3


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
    # Still undecided (the run's noise hides what a first look blamed): more samples settle it either way,
    # a bounded number of times. Every rank has the same numbers, so every rank decides alike.
    for _ in range(MAX_EXTRA_REPEATS if again else 0):
        unsettled = set(undecided(results()))
        if not unsettled:
            break
        for key, t in _run_rounds([r for r in again if unsettled & set(r)], rank, send, recv, iters, warmup,
                                  device).items():
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
