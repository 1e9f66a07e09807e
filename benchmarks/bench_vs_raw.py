"""Is `ddpdoctor bench` what limits the measurement? Its all_reduce rows against a plain dist.all_reduce loop.

Run: ``python benchmarks/bench_vs_raw.py [--nproc 2] [--rounds 5] [--max-mib 256] [--backend auto|gloo|nccl]``.
It starts the ranks itself (torchrun; on NCCL one rank per GPU, ``--nproc 1`` on a one-GPU machine) and in
one process per rank alternates, size by size and round by round, between

- ``ddpdoctor.bench.measure_row``: the very function whose rows ``ddpdoctor bench`` prints (its buffers,
  barrier, warmup, timed loop, the untimed correctness call, each rank's time combined), and
- a plain loop, written the way a user would time it: ``torch.ones``, barrier, the same warmup, barrier,
  ``dist.all_reduce`` ``iters`` times under ``time.perf_counter`` (gloo) or between two CUDA events (NCCL:
  nccl-tests' way), each rank's time averaged over the ranks like the bench does,

so drifts in machine load hit both alike; the first of each round rotates. A second plain loop in each
round gives the noise floor (plain vs plain). It prints, per size, the median time of each and the median
of the per-round ratios plain time / bench time (1.00 = the same; target: >= 0.97 at every size). It prints
numbers; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any


def plain_time_us(size: int, iters: int, warmup: int, device: Any) -> float:
    """Microseconds per plain all_reduce, averaged over ranks (nccl-tests' -a 1, as the bench row)."""
    import torch
    import torch.distributed as dist

    x = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.barrier()
    for _ in range(warmup):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        mine = start.elapsed_time(end) * 1000.0 / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        mine = (time.perf_counter() - t0) * 1e6 / iters
    t = torch.tensor([mine], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from ddpdoctor.bench import measure_row

    backend = args.backend if args.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    sizes = [(1 << 20) * (4 ** i) for i in range(10) if 4 ** i <= args.max_mib]
    times: dict[tuple[str, int], list[float]] = {}
    kinds = ("bench", "plain", "plain2")
    for rnd in range(args.rounds):
        for size in sizes:
            # Rotate which goes first, so none always runs on a warmer cache or a quieter machine.
            for which in kinds[rnd % 3:] + kinds[:rnd % 3]:
                if which == "bench":
                    row = measure_row("all_reduce", size, "float", args.iters, args.warmup, True, device)
                    assert row.wrong == 0, row
                    t = row.time_us
                else:
                    t = plain_time_us(size, args.iters, args.warmup, device)
                times.setdefault((which, size), []).append(t)
    if dist.get_rank() == 0:
        print(f"all_reduce, {dist.get_world_size()} rank(s), {backend}, iters {args.iters}, warmup {args.warmup}, "
              f"{args.rounds} interleaved rounds (medians)")
        print(f"{'size':>10} {'bench us':>11} {'plain us':>11} {'plain/bench':>12} {'plain/plain (noise)':>20}")
        for size in sizes:
            b, p, p2 = (times[(k, size)] for k in kinds)
            ratio = statistics.median(x / y for x, y in zip(p, b, strict=True))
            noise = statistics.median(x / y for x, y in zip(p2, p, strict=True))
            print(f"{size >> 20:>6} MiB {statistics.median(b):>11.1f} {statistics.median(p):>11.1f} "
                  f"{ratio:>11.3f}x {noise:>19.3f}x")
        sys.stdout.flush()
    dist.barrier()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nproc", type=int, default=None, help="ranks (default: 2 on gloo, one per GPU on NCCL)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return
    nproc = args.nproc
    if nproc is None:
        import torch

        gpu = args.backend != "gloo" and torch.cuda.is_available()
        nproc = torch.cuda.device_count() if gpu else 2
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
           os.path.abspath(__file__), "--rank", "--rounds", str(args.rounds), "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--max-mib", str(args.max_mib), "--backend", args.backend]
    sys.exit(subprocess.call(cmd, timeout=3600))


if __name__ == "__main__":
    main()
