"""A DDP loop that runs to the end but carries the four training-loop pitfalls `ddpdoctor watch` warns about.

    ddpdoctor watch --nproc 2 examples/pitfalls_loop.py

1. a DataLoader without a DistributedSampler: every rank trains on the same batches;
2. a shuffling DistributedSampler whose set_epoch is never called: every epoch has the same order;
3. torch.save to one path from every rank: concurrent writers;
4. DDP(find_unused_parameters=True) while every parameter is used: a graph traversal per step for nothing.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "pitfalls_loop_ckpt.pt"))
    args = parser.parse_args()
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    plain_loader = DataLoader(data, batch_size=8, shuffle=True)  # pitfall 1
    sampler = DistributedSampler(data, shuffle=True)
    sharded_loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(4, 1), find_unused_parameters=True)  # pitfall 4
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _epoch in range(2):  # pitfall 2: no sampler.set_epoch(epoch)
        for loader in (plain_loader, sharded_loader):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    torch.save(model.module.state_dict(), args.out)  # pitfall 3: every rank writes
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
