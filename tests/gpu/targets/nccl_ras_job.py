"""One NCCL rank that initialises a communicator, runs a few all_reduces, prints "ready" and waits.

While it waits, NCCL's RAS thread (NCCL >= 2.24) answers on ``NCCL_RAS_ADDR``; the test asks it with
``ddpdoctor ras`` and then kills this process.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def main() -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    t = torch.ones(1024, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    print("ready", flush=True)
    time.sleep(300)


if __name__ == "__main__":
    main()
