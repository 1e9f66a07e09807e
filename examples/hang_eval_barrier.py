"""The classic DDP hang: rank 0 evaluates and calls ``dist.barrier()`` inside ``if rank == 0``.

Rank 0 waits in the barrier; every other rank has already moved on into the next epoch and waits in
DDP's gradient all_reduce inside ``loss.backward()``, so nobody ever returns (NCCL would give up after
its 10-30 minute watchdog timeout with "Watchdog caught collective operation timeout").

    torchrun --nproc-per-node 2 examples/hang_eval_barrier.py            # hangs
    ddpdoctor watch --nproc 2 --hang-timeout 5 examples/hang_eval_barrier.py
    # collective #3: rank 0 in barrier at hang_eval_barrier.py:39; rank 1 in backward at hang_eval_barrier.py:33

The fix: call the barrier on every rank (outside the ``if``), or evaluate on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def evaluate(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(model(torch.randn(8, 4)).mean())


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(4, 1))
    for epoch in range(3):
        for _step in range(2):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
        if rank == 0:
            score = evaluate(model)
            print(f"epoch {epoch}: eval {score:.3f}", flush=True)
            dist.barrier()  # BUG: only rank 0 gets here
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
