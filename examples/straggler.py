"""A healthy DDP job with one slow rank: every step, ``--slow-rank`` sleeps ``--delay`` seconds more
than the others (as a rank with a slower data shard, host or disk does), so the others wait for it in
DDP's gradient all_reduce. Nothing hangs and nothing fails: the job is just slower than it should be.

    torchrun --nproc-per-node 3 examples/straggler.py
    ddpdoctor watch --nproc 3 examples/straggler.py --slow-rank 1 --delay 0.05
    # warning: rank 1 is the straggler: the others wait 50 ms per step for it (9x % of the step)

``--spike-step`` makes every rank but the slow one sleep once, longer (a single slow step is not a
straggler).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--spike-step", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x, y = torch.randn(16, 32), torch.randn(16, 1)
        if rank == args.slow_rank:
            time.sleep(args.delay)  # the straggler: its batch takes longer to arrive, every step
        elif step == args.spike_step:
            time.sleep(10 * args.delay)  # one slow step on the other ranks: not a straggler
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    dist.barrier()
    if rank == 0:
        print(f"STRAGGLER_DONE steps={args.steps}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
