"""Is `ddpdoctor bench` what limits the measurement? Its all_reduce busbw against a bare dist.all_reduce loop.

Run: ``python benchmarks/bench_vs_raw.py [--nproc 2] [--rounds 3] [--max-mib 256]``. It starts the ranks
itself (torchrun), and on each rank alternates, size by size and round by round, between

- ``ddpdoctor.bench.measure_row``: the very function whose rows ``ddpdoctor bench`` prints (barrier,
  warmup, timed loop, each rank's time combined, then the untimed correctness call), and
- a bare loop: barrier, the same warmup, ``dist.all_reduce`` ``iters`` times under ``time.perf_counter``,

so drifts in machine load hit both alike. A second bare loop in each round gives the noise floor (bare vs
bare). It prints the median busbw of each and the median of the per-round ratios per size (target:
ddpdoctor/bare >= 0.97 at every size >= 1 MiB). It prints numbers; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def bare_busbw(size: int, iters: int, warmup: int) -> float:
    """busbw of a plain all_reduce loop, timed like nccl-tests, averaged over ranks like the bench."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    x = torch.ones(size // 4, dtype=torch.float32)
    dist.barrier()
    for _ in range(warmup):
        dist.all_reduce(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    t = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(t)
    avg_s = float(t) / n
    return size / avg_s / 1e9 * 2 * (n - 1) / n


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from ddpdoctor.bench import measure_row

    dist.init_process_group("gloo")
    sizes = [(1 << 20) * (4 ** i) for i in range(10) if 4 ** i <= args.max_mib]
    tool: dict[int, list[float]] = {s: [] for s in sizes}
    bare: dict[int, list[float]] = {s: [] for s in sizes}
    bare2: dict[int, list[float]] = {s: [] for s in sizes}
    kinds = ("tool", "bare", "bare2")
    for rnd in range(args.rounds):
        for size in sizes:
            # Rotate which goes first, so none always runs on a warmer cache or a quieter machine.
            for which in kinds[rnd % 3:] + kinds[:rnd % 3]:
                if which == "tool":
                    row = measure_row("all_reduce", size, "float", args.iters, args.warmup, True,
                                      torch.device("cpu"))
                    assert row.wrong == 0
                    tool[size].append(row.busbw_gbps)
                else:
                    (bare if which == "bare" else bare2)[size].append(bare_busbw(size, args.iters, args.warmup))
    if dist.get_rank() == 0:
        print(f"all_reduce, {dist.get_world_size()} ranks, gloo, iters {args.iters}, warmup {args.warmup}, "
              f"{args.rounds} interleaved rounds (median busbw)")
        print(f"{'size':>10} {'ddpdoctor GB/s':>15} {'bare GB/s':>10} {'ddpdoctor/bare':>15} "
              f"{'bare/bare (noise)':>18}")
        for size in sizes:
            t, b = statistics.median(tool[size]), statistics.median(bare[size])
            ratio = statistics.median(x / y for x, y in zip(tool[size], bare[size], strict=True))
            noise = statistics.median(x / y for x, y in zip(bare2[size], bare[size], strict=True))
            print(f"{size >> 20:>6} MiB {t:>15.3f} {b:>10.3f} {ratio:>15.3f} {noise:>18.3f}")
        sys.stdout.flush()
    dist.barrier()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc),
           "--standalone", os.path.abspath(__file__), "--rank", "--rounds", str(args.rounds),
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--max-mib", str(args.max_mib)]
    sys.exit(subprocess.call(cmd, timeout=3600))


if __name__ == "__main__":
    main()
