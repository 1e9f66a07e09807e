"""A one-rank NCCL job that fails the way the environment makes it (for `ddpdoctor explain` on real output).

The test sets the environment: ``NCCL_SOCKET_IFNAME`` naming no interface (NCCL's bootstrap finds none),
``CUDA_VISIBLE_DEVICES=""`` (the rank sees no GPU), or two ranks on one GPU under torchrun (NCCL refuses a
duplicate GPU). It initialises the default NCCL group on this rank's GPU and runs one all_reduce, so NCCL
creates its communicator and prints whatever it prints; the exception ends the process with its traceback.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", int(os.environ.get("DDPDOCTOR_TEST_DEVICE", local_rank)))
    dist.init_process_group("nccl", timeout=timedelta(seconds=60))
    torch.cuda.set_device(device)
    x = torch.ones(4, device=device)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"rank {dist.get_rank()} all_reduce {x.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
