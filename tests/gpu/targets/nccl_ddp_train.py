"""A small DDP training loop on NCCL, one GPU per rank: what `ddpdoctor watch` must pass through untouched.

    ddpdoctor watch --nproc 1 tests/gpu/targets/nccl_ddp_train.py --steps 20
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)  # bound: PyTorch does not guess (nor warn)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device),
                device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64, device=device), torch.randn(32, 1, device=device)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
    torch.cuda.synchronize()
    if dist.get_rank() == 0:
        print(f"done: {args.steps} steps, loss {logged.item() / dist.get_world_size():.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
