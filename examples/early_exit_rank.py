"""One rank runs out of batches first and ends cleanly (exit code 0) while the other still waits in a collective.

    ddpdoctor watch --nproc 2 examples/early_exit_rank.py

Each rank reads its own shard, and the shards are uneven (no ``DistributedSampler(drop_last=True)``): rank 1
has one batch fewer. It leaves the loop, ends the process group and exits 0; rank 0 is in its last all_reduce,
whose partner is gone: on gloo it fails with "Connection closed by peer" (on NCCL it would wait for the
watchdog timeout). That failure is only the echo: `watch` names rank 1's early exit as the cause.

The fix: the same number of steps on every rank (``DistributedSampler(drop_last=True)``, or
``torch.distributed.algorithms.Join`` for inputs that are uneven on purpose).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batches = 4 if rank == 0 else 3  # BUG: uneven shards, one all_reduce per batch
    for _ in range(batches):
        grads = torch.ones(4)
        dist.all_reduce(grads)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
