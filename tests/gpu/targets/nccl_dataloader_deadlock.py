"""A one-rank NCCL DDP loop whose DataLoader worker deadlocks in ``__getitem__`` after ``--steps`` steps.

The rank's host thread waits for the batch (no collective anywhere): ``watch`` must name the DataLoader,
the worker's pid and the worker's own stack, ending at the lock in ``__getitem__``.
"""

from __future__ import annotations

import argparse
import os
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

_LOCK = threading.Lock()


class StuckAfter(Dataset[torch.Tensor]):
    def __init__(self, size: int, stuck_at: int) -> None:
        self.size, self.stuck_at = size, stuck_at

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= self.stuck_at:
            _LOCK.acquire()
            _LOCK.acquire()  # DEADLOCK: a second acquire of a non-reentrant lock
        return torch.randn(64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    device = torch.device("cuda", torch.cuda.current_device())
    model = DDP(torch.nn.Linear(64, 1).to(device), device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(StuckAfter(8 * (args.steps + 4), 8 * args.steps), batch_size=8, num_workers=2)
    for step, batch in enumerate(loader):
        opt.zero_grad()
        model(batch.to(device)).mean().backward()
        opt.step()
        print(f"step {step} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
