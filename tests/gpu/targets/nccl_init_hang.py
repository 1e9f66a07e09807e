"""Rank 0 of 2 creates its NCCL communicator and waits forever for rank 1, which never joins (a probable hang
inside NCCL's init, issue 26).

``python nccl_init_hang.py 0``: ``init_process_group("nccl", device_id=...)`` creates the communicator at once;
with NCCL_DEBUG=INFO NCCL logs ``... - Init START`` (src/init.cc) and then waits in its bootstrap for rank 1.
``python nccl_init_hang.py 1``: only connects to the store (so rank 0's TCPStore stops waiting for it) and
sleeps, never calling NCCL. The test kills both once rank 0's log shows Init START.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    rank = int(sys.argv[1])
    if rank == 1:
        dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 2, False,
                      timeout=timedelta(seconds=60))
        print("rank 1: connected to the store; never joining NCCL", flush=True)
        time.sleep(600)
        return
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    print("rank 0: creating the NCCL communicator", flush=True)
    dist.init_process_group("nccl", rank=0, world_size=2, device_id=device, timeout=timedelta(seconds=600))
    print("rank 0: the communicator was created (it should not have been)", flush=True)


if __name__ == "__main__":
    main()
