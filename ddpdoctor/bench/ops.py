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

import time
from collections.abc import Callable
from typing import Any

from ddpdoctor.bench.analysis import DTYPES, OPS

# Largest integer each dtype holds exactly (for the sums of reductions).
_EXACT_MAX = {"float": 1 << 24, "half": 2048, "bfloat16": 256, "double": 1 << 53, "int8": 127,
              "uint8": 255, "int32": (1 << 31) - 1, "int64": (1 << 63) - 1}
_REDUCTION_MODULI = (13, 11, 7, 5, 3, 2)
_PLAIN_MODULUS = 101
_REDUCTIONS = ("all_reduce", "reduce_scatter")


def torch_dtype(dtype: str) -> Any:
    import torch

    return getattr(torch, DTYPES[dtype])


def modulus(op: str, dtype: str, nranks: int) -> int:
    """K for v(r, g): as large as possible while a sum over ``nranks`` stays exact in ``dtype``."""
    if op not in _REDUCTIONS:
        return _PLAIN_MODULUS
    for k in _REDUCTION_MODULI:
        if nranks * (k - 1) <= _EXACT_MAX[dtype]:
            return k
    return 1  # every value 0: still checks that nothing non-zero arrives


def pattern(rank: int, start: int, length: int, k: int, dtype: str, device: Any) -> Any:
    """v(rank, g) for g in [start, start + length), as ``dtype`` on ``device``."""
    import torch

    g = torch.arange(start, start + length, dtype=_index_dtype(start + length + 7 * rank), device=device)
    return ((g + 7 * rank) % k).to(torch_dtype(dtype))


def _index_dtype(largest: int) -> Any:
    """int32 indices while they fit: half the memory and time of int64 on 256 MiB buffers."""
    import torch

    return torch.int32 if largest < (1 << 31) - 1 else torch.int64


def reduced(nranks: int, start: int, length: int, k: int, dtype: str, device: Any) -> Any:
    """sum over r < nranks of v(r, g): one pass per distinct (7 r mod k), at most k passes."""
    import torch

    index = _index_dtype(start + length + k)
    g = torch.arange(start, start + length, dtype=index, device=device)
    total = torch.zeros(length, dtype=_index_dtype(nranks * k), device=device)
    shifts: dict[int, int] = {}
    for r in range(nranks):
        shifts[(7 * r) % k] = shifts.get((7 * r) % k, 0) + 1
    for shift, times in shifts.items():
        total += times * ((g + shift) % k)
    return total.to(torch_dtype(dtype))


def chunk(op: str, count: int, nranks: int) -> int:
    return count // nranks if OPS[op].scaled_by_nranks else count


def make_input(op: str, rank: int, nranks: int, count: int, dtype: str, device: Any) -> Any:
    """This rank's send buffer for a row of ``count`` elements."""
    import torch

    k = modulus(op, dtype, nranks)
    c = chunk(op, count, nranks)
    if op == "all_gather":
        return pattern(rank, rank * c, c, k, dtype, device)
    if op == "all_to_all":
        # Chunk j goes to rank j, which expects v(rank, j*c + i) from us.
        return torch.cat([pattern(rank, j * c, c, k, dtype, device) for j in range(nranks)]) if c else \
            torch.empty(0, dtype=torch_dtype(dtype), device=device)
    return pattern(rank, 0, count, k, dtype, device)


def expected_output(op: str, rank: int, nranks: int, count: int, dtype: str, device: Any) -> Any:
    """What this rank's result buffer must hold after one correct call on fresh inputs."""
    import torch

    k = modulus(op, dtype, nranks)
    c = chunk(op, count, nranks)
    if op == "all_reduce":
        return reduced(nranks, 0, count, k, dtype, device)
    if op == "reduce_scatter":
        return reduced(nranks, rank * c, c, k, dtype, device)
    if op == "all_gather":
        return torch.cat([pattern(r, r * c, c, k, dtype, device) for r in range(nranks)]) if c else \
            torch.empty(0, dtype=torch_dtype(dtype), device=device)
    if op == "all_to_all":
        return torch.cat([pattern(r, rank * c, c, k, dtype, device) for r in range(nranks)]) if c else \
            torch.empty(0, dtype=torch_dtype(dtype), device=device)
    if op == "broadcast":
        return pattern(OPS[op].root, 0, count, k, dtype, device)
    if op == "sendrecv":
        return pattern((rank - 1) % nranks, 0, count, k, dtype, device)
    raise ValueError(op)


def count_wrong(op: str, rank: int, nranks: int, count: int, dtype: str, output: Any) -> int:
    """Elements of ``output`` that differ from the exact expected result (nccl-tests' #wrong)."""
    expected = expected_output(op, rank, nranks, count, dtype, output.device)
    if output.shape != expected.shape:
        return int(max(output.numel(), expected.numel()))
    return int((output != expected).sum().item())


class OpRunner:
    """The buffers of one op at one size on this rank, and one call of the op on them."""

    def __init__(self, op: str, count: int, dtype: str, rank: int, nranks: int, device: Any) -> None:
        import torch

        self.op, self.count, self.dtype, self.rank, self.nranks = op, count, dtype, rank, nranks
        self.device = device
        self.input = make_input(op, rank, nranks, count, dtype, device)
        c = chunk(op, count, nranks)
        out_len = {"all_gather": count, "reduce_scatter": c, "all_to_all": count, "sendrecv": count}
        self.output = (torch.empty(out_len[op], dtype=self.input.dtype, device=device)
                       if op in out_len else self.input)
        self.call = self._bind()

    def _bind(self) -> Callable[[], object]:
        import torch.distributed as dist

        op, inp, out = self.op, self.input, self.output
        if op == "all_reduce":
            return lambda: dist.all_reduce(inp)
        if op == "broadcast":
            return lambda: dist.broadcast(inp, src=OPS[op].root)
        if op == "all_gather":
            # all_gather_single replaces the deprecated all_gather_into_tensor in recent PyTorch.
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return lambda: gather(out, inp)
        if op == "reduce_scatter":
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return lambda: scatter(out, inp)
        if op == "all_to_all":
            return lambda: dist.all_to_all_single(out, inp)
        if op == "sendrecv":
            if self.nranks == 1:
                return lambda: out.copy_(inp)
            nxt, prv = (self.rank + 1) % self.nranks, (self.rank - 1) % self.nranks
            return lambda: exchange(inp, nxt, out, prv)
        raise ValueError(op)

    def refill(self) -> None:
        """Fresh inputs (the timed all_reduce summed in place) and a poisoned output for the check."""
        self.input.copy_(make_input(self.op, self.rank, self.nranks, self.count, self.dtype, self.device))
        if self.output is not self.input:
            self.output.fill_(0)

    def wrong(self) -> int:
        """One untimed call on fresh inputs, checked element by element."""
        self.refill()
        self.call()
        return count_wrong(self.op, self.rank, self.nranks, self.count, self.dtype, self.output)


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
               barrier: Callable[[], None] | None = None) -> float:
    """Microseconds per call: barrier, warmup, barrier, ``iters`` calls (CUDA events on GPU)."""
    import torch

    sync = barrier if barrier is not None else (lambda: None)
    sync()
    for _ in range(warmup):
        call()
    cuda = getattr(device, "type", str(device)) == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    sync()
    if cuda:
        start_ev = torch.cuda.Event(enable_timing=True)
        end_ev = torch.cuda.Event(enable_timing=True)
        start_ev.record()
        for _ in range(iters):
            call()
        end_ev.record()
        end_ev.synchronize()
        return float(start_ev.elapsed_time(end_ev)) * 1000.0 / max(1, iters)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - start) * 1e6 / max(1, iters)


def world_barrier() -> Callable[[], None]:
    """A barrier on the process group under test, told this rank's GPU (no device guess on NCCL)."""
    from ddpdoctor.runtime.device import bound_barrier

    return lambda: bound_barrier()
