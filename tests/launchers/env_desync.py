"""A script written for torchrun (``init_process_group`` with env://) that desynchronises: rank 0 alone
calls ``barrier()`` after its evaluation while rank 1 goes on into the next step's all_reduce.

Before that it prints, per rank, the torchrun variables it was given, so a test can compare them with
what torchrun would have set (torch/distributed/elastic/agent/server/local_elastic_agent.py).
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
         "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def main() -> None:
    print("torchrun-env " + json.dumps({name: os.environ.get(name) for name in NAMES}, sort_keys=True), flush=True)
    dist.init_process_group("gloo")  # env:// by default: reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    for _step in range(2):
        value = torch.ones(4)
        dist.all_reduce(value)
    if rank == 0:
        dist.barrier()  # BUG: only rank 0 gets here
    value = torch.ones(4)
    dist.all_reduce(value)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
