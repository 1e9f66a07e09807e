"""The DDP tutorial's launch style on gloo: the script starts its own ranks with ``mp.spawn``.

Written as PyTorch's "Getting Started with Distributed Data Parallel" tutorial writes it
(https://pytorch.org/tutorials/intermediate/ddp_tutorial.html: ``setup(rank, world_size)`` sets
MASTER_ADDR/MASTER_PORT and calls ``init_process_group("gloo", rank=rank, world_size=world_size)``;
``mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)``).

    python examples/spawn_ddp.py                          # 2 ranks, trains, exits 0
    ddpdoctor watch examples/spawn_ddp.py                 # runs it once, watches both spawned ranks
    ddpdoctor watch examples/spawn_ddp.py --bug same-rank # every process passes rank=0
    ddpdoctor watch --hang-timeout 5 examples/spawn_ddp.py --bug skip-collective

``--bug same-rank``: every process calls ``init_process_group(rank=0)`` (a constant where the process
index belongs); plain python fails with ``EADDRINUSE`` on the store port in one process and a rendezvous
timeout in the other. ``--bug skip-collective``: the last rank skips the last all_reduce of the loss and
meets the others' all_reduce with its barrier.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank: int, world_size: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def demo_basic(rank: int, world_size: int, port: int, bug: str, steps: int) -> None:
    claimed = 0 if bug == "same-rank" else rank
    setup(claimed, world_size, port)  # BUG(same-rank): every process claims rank 0
    torch.manual_seed(rank)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.ReLU(), torch.nn.Linear(10, 5)))
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    for step in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5))
        loss.backward()
        optimizer.step()
        if bug == "skip-collective" and rank == world_size - 1 and step == steps - 1:
            continue  # BUG(skip-collective): this rank skips the last loss all_reduce
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # the logged loss, averaged
    dist.barrier()
    if rank == 0:
        print(f"SPAWN_DDP_OK world_size={world_size} steps={steps}", flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bug", choices=["none", "same-rank", "skip-collective"], default="none")
    parser.add_argument("--port", type=int, default=0, help="MASTER_PORT (0: a free one; the tutorial uses 12355)")
    args = parser.parse_args()
    port = args.port or free_port()
    mp.spawn(demo_basic, args=(args.world_size, port, args.bug, args.steps), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
