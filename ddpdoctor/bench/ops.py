"""The collectives of `ddpdoctor bench`, their timing, and inputs whose correct result is known exactly.

Every element starts as ``v(r, g) = (7 r + g) mod K`` for rank r and global element index g, so each
rank's data and each chunk's position are distinct: a chunk delivered to the wrong place, a stale buffer
or a flipped bit changes the result. Reductions add n such integers, so K is chosen per dtype and world
size to keep every partial sum an exactly representable integer (bfloat16 holds integers up to 256,
float16 up to 2048, int8 up to 127): the sum is then exact in any order the backend adds.

Timing follows nccl-tests: barrier, warmup iterations, barrier, then the timed loop of ``iters`` calls;
on CUDA between two events recorded on the current stream (the calls are asynchronous, PyTorch CUDA
semantics docs), on CPU with ``time.perf_counter`` (gloo's calls block until done). Correctness is
checked on one more, untimed, call with fresh inputs (the timed all_reduce keeps summing in place).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from ddpdoctor.bench.analysis import DTYPES, OPS, REDOPS

# Largest integer each dtype holds exactly (for the sums and products of reductions).
_EXACT_MAX = {"float": 1 << 24, "half": 2048, "bfloat16": 256, "double": 1 << 53, "int8": 127,
              "uint8": 255, "int32": (1 << 31) - 1, "int64": (1 << 63) - 1}
_REDUCTION_MODULI = (13, 11, 7, 5, 3, 2)
_PLAIN_MODULUS = 101
_REDUCTIONS = ("all_reduce", "reduce_scatter")
_INTEGER = ("int8", "uint8", "int32", "int64")


def torch_dtype(dtype: str) -> Any:
    import torch

    return getattr(torch, DTYPES[dtype])


def reduce_op(redop: str) -> Any:
    """The torch.distributed.ReduceOp of an nccl-tests -o name."""
    import torch.distributed as dist

    return getattr(dist.ReduceOp, REDOPS[redop])


def modulus(op: str, dtype: str, nranks: int, redop: str = "sum") -> int:
    """K for v(r, g): as large as possible while the reduction over ``nranks`` stays exact in ``dtype``.

    A sum (and avg, a sum divided) of n values below K is below n (K - 1); a product below (K - 1)^n; min
    and max stay below K, like the values of the ops that do not reduce.
    """
    if op not in _REDUCTIONS or redop in ("min", "max"):
        return _PLAIN_MODULUS
    for k in _REDUCTION_MODULI:
        bound = (k - 1) ** nranks if redop == "prod" else nranks * (k - 1)
        if bound <= _EXACT_MAX[dtype]:
            return k
    return 2 if redop == "prod" else 1  # prod of 0s and 1s is exact; K 1: every value 0, still checked


def pattern(rank: int, start: int, length: int, k: int, dtype: str, device: Any, shift: int = 0) -> Any:
    """v(rank, g) = (g + 7 rank + shift) mod k for g in [start, start + length), as ``dtype`` on ``device``.

    ``shift`` gives each checked call (nccl-tests' ``-c N``) different data, as nccl-tests' ``rep`` does.
    """
    import torch

    g = torch.arange(start, start + length, dtype=_index_dtype(start + length + 7 * rank + shift), device=device)
    return ((g + (7 * rank + shift)) % k).to(torch_dtype(dtype))


def _index_dtype(largest: int) -> Any:
    """int32 indices while they fit: half the memory and time of int64 on 256 MiB buffers."""
    import torch

    return torch.int32 if largest < (1 << 31) - 1 else torch.int64


def reduced(nranks: int, start: int, length: int, k: int, dtype: str, device: Any, redop: str = "sum",
            shift: int = 0) -> Any:
    """The reduction over r < nranks of v(r, g): one pass per distinct (7 r + shift) mod k, at most k passes.

    avg is the exact sum divided by n, truncated for integer types (NCCL's ncclAvg divides the sum of
    integers); for floating types :func:`count_wrong` allows the rounding of NCCL's pre-multiplied sum.
    """
    import torch

    index = _index_dtype(start + length + k + shift)
    g = torch.arange(start, start + length, dtype=index, device=device)
    shifts: dict[int, int] = {}
    for r in range(nranks):
        key = (7 * r + shift) % k
        shifts[key] = shifts.get(key, 0) + 1
    if redop in ("sum", "avg"):
        total = torch.zeros(length, dtype=torch.float64 if redop == "avg" else _index_dtype(nranks * k), device=device)
        for s, times in shifts.items():
            total += times * ((g + s) % k)
        if redop == "avg":
            total = torch.div(total, nranks, rounding_mode="floor") if dtype in _INTEGER else total / nranks
        return total.to(torch_dtype(dtype))
    if redop == "prod":
        product = torch.ones(length, dtype=torch.float64, device=device)
        for s, times in shifts.items():
            product *= ((g + s) % k).to(torch.float64) ** times
        return product.to(torch_dtype(dtype))
    values = [(g + s) % k for s in shifts]
    out = values[0]
    for v in values[1:]:
        out = torch.maximum(out, v) if redop == "max" else torch.minimum(out, v)
    return out.to(torch_dtype(dtype))


def chunk(op: str, count: int, nranks: int) -> int:
    return count // nranks if OPS[op].scaled_by_nranks else count


def make_input(op: str, rank: int, nranks: int, count: int, dtype: str, device: Any, redop: str = "sum",
               root: int = 0, shift: int = 0) -> Any:
    """This rank's send buffer for a row of ``count`` elements."""
    import torch

    k = modulus(op, dtype, nranks, redop)
    c = chunk(op, count, nranks)
    if op == "all_gather":
        return pattern(rank, rank * c, c, k, dtype, device, shift)
    if op == "all_to_all":
        # Chunk j goes to rank j, which expects v(rank, j*c + i) from us.
        return torch.cat([pattern(rank, j * c, c, k, dtype, device, shift) for j in range(nranks)]) if c else \
            torch.empty(0, dtype=torch_dtype(dtype), device=device)
    return pattern(rank, 0, count, k, dtype, device, shift)


def expected_output(op: str, rank: int, nranks: int, count: int, dtype: str, device: Any, redop: str = "sum",
                    root: int = 0, shift: int = 0) -> Any:
    """What this rank's result buffer must hold after one correct call on fresh inputs."""
    import torch

    k = modulus(op, dtype, nranks, redop)
    c = chunk(op, count, nranks)
    if op == "all_reduce":
        return reduced(nranks, 0, count, k, dtype, device, redop, shift)
    if op == "reduce_scatter":
        return reduced(nranks, rank * c, c, k, dtype, device, redop, shift)
    if op == "all_gather":
        return torch.cat([pattern(r, r * c, c, k, dtype, device, shift) for r in range(nranks)]) if c else \
            torch.empty(0, dtype=torch_dtype(dtype), device=device)
    if op == "all_to_all":
        return torch.cat([pattern(r, rank * c, c, k, dtype, device, shift) for r in range(nranks)]) if c else \
            torch.empty(0, dtype=torch_dtype(dtype), device=device)
    if op == "broadcast":
        return pattern(root, 0, count, k, dtype, device, shift)
    if op == "sendrecv":
        return pattern((rank - 1) % nranks, 0, count, k, dtype, device, shift)
    raise ValueError(op)


def count_wrong(op: str, rank: int, nranks: int, count: int, dtype: str, output: Any, redop: str = "sum",
                root: int = 0, shift: int = 0) -> int:
    """Elements of ``output`` that differ from the exact expected result (nccl-tests' #wrong).

    Exact equality everywhere but avg in a floating type: NCCL computes it as a sum of values each
    pre-multiplied by 1/n, which rounds; up to n roundings of the dtype's precision are allowed there.
    """
    import torch

    expected = expected_output(op, rank, nranks, count, dtype, output.device, redop, root, shift)
    if output.shape != expected.shape:
        return int(max(output.numel(), expected.numel()))
    if redop == "avg" and dtype not in _INTEGER:
        eps = torch.finfo(output.dtype).eps
        limit = nranks * eps * expected.to(torch.float64).abs().clamp(min=1.0)
        return int(((output.to(torch.float64) - expected.to(torch.float64)).abs() > limit).sum().item())
    return int((output != expected).sum().item())


class OpRunner:
    """The buffers of one op at one size on this rank, in one layout, and one call of the op on them.

    Out of place: separate send and receive buffers. In place, as nccl-tests lays it out
    (``sendInplaceOffset``/``recvInplaceOffset`` in its src/*.cu): all_reduce and broadcast work on one
    tensor; all_gather's input is this rank's chunk of the output; reduce_scatter's output is this rank's
    chunk of the input. Every buffer is allocated once, here, before the timed loop.
    """

    def __init__(self, op: str, count: int, dtype: str, rank: int, nranks: int, device: Any, *,
                 redop: str = "sum", root: int = 0, in_place: bool | None = None) -> None:
        import torch

        spec = OPS[op]
        self.in_place = spec.in_place and not spec.out_of_place if in_place is None else in_place
        if (self.in_place and not spec.in_place) or (not self.in_place and not spec.out_of_place):
            raise ValueError(f"{op} has no {'in-place' if self.in_place else 'out-of-place'} form in torch.distributed")
        self.op, self.count, self.dtype, self.rank, self.nranks = op, count, dtype, rank, nranks
        self.device, self.redop, self.root = device, redop, root
        c = chunk(op, count, nranks)
        empty = functools.partial(torch.empty, dtype=torch_dtype(dtype), device=device)
        # The buffers first, then their values written into them: computing the values allocates temporaries
        # as large as the buffer, and a buffer allocated among them lands elsewhere in the heap than the
        # plain loop's. On gloo at 16 MiB that placement alone cost 15 % per call (benchmarks/bench_vs_raw.py,
        # docs/performance.md); allocated first, the buffer sits where ``torch.ones(n)`` would.
        if self.in_place and op == "all_gather":
            self.output = empty(count)
            self.input = self.output[rank * c:(rank + 1) * c]
        elif self.in_place and op == "reduce_scatter":
            self.input = empty(count)
            self.output = self.input[rank * c:(rank + 1) * c]
        elif self.in_place:
            self.input = self.output = empty(count)
        else:
            out_len = {"all_gather": count, "reduce_scatter": c, "all_to_all": count, "sendrecv": count}[op]
            self.input = empty(c if op == "all_gather" else count)
            self.output = empty(out_len)
        self.refill()
        self.call = self._bind()

    def _bind(self) -> Callable[[], object]:
        """The one call the timed loop repeats: the torch.distributed function itself, arguments bound
        with functools.partial (no Python frame of ours between the loop and the collective)."""
        import torch.distributed as dist

        op, inp, out = self.op, self.input, self.output
        # sum is the default op: the call is then exactly the plain `dist.all_reduce(tensor)`.
        reduction = {} if self.redop == "sum" else {"op": reduce_op(self.redop)}
        if op == "all_reduce":
            return functools.partial(dist.all_reduce, inp, **reduction)
        if op == "broadcast":
            return functools.partial(dist.broadcast, inp, self.root)
        if op == "all_gather":
            # all_gather_single replaces the deprecated all_gather_into_tensor in recent PyTorch.
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return functools.partial(gather, out, inp)
        if op == "reduce_scatter":
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return functools.partial(scatter, out, inp, **reduction)
        if op == "all_to_all":
            return functools.partial(dist.all_to_all_single, out, inp)
        if op == "sendrecv":
            if self.nranks == 1:
                return functools.partial(out.copy_, inp)
            nxt, prv = (self.rank + 1) % self.nranks, (self.rank - 1) % self.nranks
            return functools.partial(exchange, inp, nxt, out, prv)
        raise ValueError(op)

    def refill(self, shift: int = 0) -> None:
        """Fresh inputs (the timed reductions summed in place) and a poisoned output for the check."""
        fresh = make_input(self.op, self.rank, self.nranks, self.count, self.dtype, self.device, self.redop,
                           self.root, shift)
        if (self.in_place and self.op == "all_gather") or (self.output is not self.input and not self.in_place):
            self.output.fill_(0)
        if self.op == "broadcast" and self.rank != self.root:
            # What a broadcast that never arrived leaves: a value no rank's pattern holds (they are < K).
            self.input.fill_(modulus(self.op, self.dtype, self.nranks, self.redop))
        else:
            self.input.copy_(fresh)

    def wrong(self, calls: int = 1) -> int:
        """``calls`` untimed calls, each on fresh inputs with different values, checked element by element;
        stops at the first call with wrong elements (as nccl-tests' ``-c N``)."""
        for i in range(calls):
            shift = i + 1
            self.refill(shift)
            self.call()
            bad = count_wrong(self.op, self.rank, self.nranks, self.count, self.dtype, self.output, self.redop,
                              self.root, shift)
            if bad:
                return bad
        return 0


def exchange(send: Any, dst: int, recv: Any, src: int) -> None:
    """Send to ``dst`` while receiving from ``src`` (nccl-tests sendrecv), waiting for both."""
    import torch.distributed as dist

    ops = [dist.P2POp(dist.isend, send, dst), dist.P2POp(dist.irecv, recv, src)]
    for work in dist.batch_isend_irecv(ops):
        # Bounded without a timeout argument: gloo's Send/RecvWork::wait(kNoTimeout) waits on its unbound
        # buffer with the context timeout, which is the process group's (--timeout, init_process_group);
        # NCCL's wait() only orders the current stream and its watchdog aborts at that same timeout.
        work.wait()


def timed_loop(call: Callable[[], object], iters: int, warmup: int, device: Any,
               barrier: Callable[[], None] | None = None, *, blocking: int = 0, cputime: bool = False) -> float:
    """Microseconds per call, as nccl-tests times it: barrier, warmup, barrier, ``iters`` calls.

    On CUDA the calls are asynchronous (PyTorch CUDA semantics docs): the time is between two events on the
    current stream, which every synchronous torch.distributed call makes wait for its collective. On CPU,
    gloo's calls return when done, and ``time.perf_counter`` is read around the loop. Nothing but the
    calls runs between the two readings unless ``blocking`` asks for it (nccl-tests' ``-z``): 1 waits for
    each call and holds a barrier after it, 2 only waits, 3 waits and holds the barrier outside the time.
    ``cputime`` (nccl-tests' ``-C``) reports the host's time to issue the calls instead of the latency.
    """
    import torch

    sync = barrier if barrier is not None else (lambda: None)
    sync()
    for _ in range(warmup):
        call()
    cuda = getattr(device, "type", str(device)) == "cuda"
    wait: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    wait()
    sync()
    if blocking == 3:
        return _timed_excluding_barrier(call, iters, wait, sync, cuda)
    if cuda and not cputime:
        start_ev = torch.cuda.Event(enable_timing=True)
        end_ev = torch.cuda.Event(enable_timing=True)
        start_ev.record()
        if blocking:
            for _ in range(iters):
                call()
                wait()
                if blocking == 1:
                    sync()
        else:
            for _ in range(iters):
                call()
        end_ev.record()
        end_ev.synchronize()
        return float(start_ev.elapsed_time(end_ev)) * 1000.0 / max(1, iters)
    if blocking:
        start = time.perf_counter()
        for _ in range(iters):
            call()
            wait()
            if blocking == 1:
                sync()
        elapsed = time.perf_counter() - start
    else:
        start = time.perf_counter()
        for _ in range(iters):
            call()
        elapsed = time.perf_counter() - start
    if cuda:
        wait()  # -C: the host's time is read before the GPU finishes, as nccl-tests' cputime is
    return elapsed * 1e6 / max(1, iters)


def _timed_excluding_barrier(call: Callable[[], object], iters: int, wait: Callable[[], None],
                             sync: Callable[[], None], cuda: bool) -> float:
    """nccl-tests' ``-z 3``: each call waited for, then a barrier that is not timed."""
    total = 0.0
    for _ in range(iters):
        start = time.perf_counter()
        call()
        wait()
        total += time.perf_counter() - start
        sync()
    return total * 1e6 / max(1, iters)


def world_barrier() -> Callable[[], None]:
    """A barrier on the process group under test, told this rank's GPU (no device guess on NCCL)."""
    from ddpdoctor.runtime.device import bound_barrier

    return lambda: bound_barrier()
