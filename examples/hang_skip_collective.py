"""A collective skipped on one rank by a data-dependent branch.

One rank sees a "bad batch" at step 3 and ``continue``s before the gradient all_reduce. From then on its
collectives are shifted by one: its final barrier meets the others' last all_reduce, and the job hangs
(or, on gloo, sometimes mis-pairs data silently).

    torchrun --nproc-per-node 2 examples/hang_skip_collective.py         # hangs
    ddpdoctor watch --nproc 2 --hang-timeout 5 examples/hang_skip_collective.py
    # collective #7: ranks 0 in all_reduce at hang_skip_collective.py:33; rank 1 in barrier at ...:35

``--skip-rank`` picks the rank that skips (default: the last one). The fix: make the decision the same on
every rank (all_reduce a "skip" flag first), or still call the collective with a zero tensor.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist


def bad_batch(rank: int, step: int, skip_rank: int) -> bool:
    return rank == skip_rank and step == 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    skip_rank = args.skip_rank if args.skip_rank >= 0 else world - 1
    grad = torch.zeros(16)
    for step in range(6):
        grad.normal_()
        if bad_batch(rank, step, skip_rank):
            continue  # BUG: skips the all_reduce below on this rank only
        dist.all_reduce(grad)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
