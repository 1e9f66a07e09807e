import os

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
r = dist.get_rank()
mode = os.environ["MODE"]
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
    def forward(self, x):
        return self.a(x)
if mode == "model":
    m = nn.Linear(4, 4) if r == 0 else nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    ddp = nn.parallel.DistributedDataParallel(m)
elif mode == "unused":
    ddp = nn.parallel.DistributedDataParallel(M())
    for _ in range(3):
        ddp(torch.ones(2, 4)).sum().backward()
elif mode == "findunused":
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 4), find_unused_parameters=True)
    for _ in range(3):
        ddp(torch.ones(2, 4)).sum().backward()
dist.destroy_process_group()
