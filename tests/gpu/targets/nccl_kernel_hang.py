"""A one-rank NCCL DDP training loop whose step ``--hang-step`` waits behind a GPU kernel that never ends.

What issue 25 saw on an H100: the host sits in ``torch.cuda.synchronize()`` while the step's all_reduce is
queued on the GPU behind the kernel (``torch.cuda._sleep(cycles)`` spins for that many GPU clock cycles:
1e13 cycles is more than an hour at any GPU's clocks; an H100's or an H200's top SM clock is about 2 GHz).
``watch`` must report it within ``--hang-timeout`` + 10 s: rank 0 waiting for the GPU at the
``synchronize()`` line, with the all_reduce pending on it.

    ddpdoctor watch --nproc 1 --hang-timeout 15 tests/gpu/targets/nccl_kernel_hang.py
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

NEVER_ENDS = 10_000_000_000_000  # GPU clock cycles


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang-step", type=int, default=5)
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    device = torch.device("cuda", torch.cuda.current_device())
    model = DDP(torch.nn.Linear(64, 64).to(device), device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64, device=device)
    for step in range(args.hang_step + 1):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if step == args.hang_step:
            torch.cuda._sleep(NEVER_ENDS)  # a kernel that never ends, queued before the all_reduce
        logged = x.sum()
        dist.all_reduce(logged)  # enqueued behind the kernel: it never runs
        torch.cuda.synchronize()  # HANG: the host waits here for the GPU
        print(f"step {step} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
