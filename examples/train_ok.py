"""A healthy small DDP training loop on gloo (CPU): what `ddpdoctor watch` should pass through untouched.

    torchrun --nproc-per-node 2 examples/train_ok.py
    ddpdoctor watch --nproc 2 examples/train_ok.py --epochs 2
    ddpdoctor watch --nproc 2 examples/train_ok.py --exit-code 3     # watch exits 3 as well

Every rank trains on its own shard (DistributedSampler + set_epoch), the logged loss is averaged with an
explicit all_reduce, only rank 0 saves. ``--steps`` caps the steps per epoch (the overhead benchmark uses it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--save-dir", default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 16), torch.randn(args.samples, 1))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    steps = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(1)
        for step, (x, y) in enumerate(loader):
            if args.steps and step >= args.steps:
                break
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            total += logged / world
            steps += 1
        if rank == 0:
            print(f"epoch {epoch}: mean loss {total.item() / max(1, len(loader)):.4f}", flush=True)
    elapsed = time.perf_counter() - start
    dist.barrier()
    if rank == 0:
        path = os.path.join(args.save_dir or tempfile.gettempdir(), f"train_ok_{os.getpid()}.pt")
        torch.save(model.module.state_dict(), path)
        os.unlink(path)
        print(f"TRAIN_OK steps={steps} step_time_us={elapsed / max(1, steps) * 1e6:.1f}", flush=True)
    dist.destroy_process_group()
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
