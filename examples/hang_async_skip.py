"""One rank skips one async all_reduce; every rank then blocks outside the collective calls.

This is NCCL's shape of a skipped collective, reproduced on gloo: ``async_op=True`` returns at once (as
NCCL's ``all_reduce`` always does), so no host thread sits in the collective that never completes. Each
rank issues ``--steps`` gradient all_reduces; rank ``--skip-rank`` skips step 3 (a "bad batch"). gloo pairs
the calls in order, so the others' last all_reduce never completes: they block in its ``work.wait()``,
while the skipping rank, whose works all completed, blocks in its next phase (a sleep standing for the
``.item()`` or ``synchronize()`` an NCCL rank would block in).

    ddpdoctor watch --nproc 3 --hang-timeout 10 examples/hang_async_skip.py
    # rank 1 never issued all_reduce #6 (ranks 0,2 issued it at hang_async_skip.py:...)

The fix, as for any skipped collective: decide the skip the same way on every rank, or still call it.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip-rank", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grads = torch.ones(4)
    works = []
    for step in range(args.steps):
        if rank == args.skip_rank and step == 3:
            continue  # BUG: a bad batch skipped on this rank only
        works.append(dist.all_reduce(grads, async_op=True))
    for work in works:
        work.wait()  # the others block here: their last all_reduce has no partner
    time.sleep(600)  # the skipping rank's next phase (on NCCL: .item(), synchronize())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
