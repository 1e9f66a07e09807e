"""A DDP rank that indexes a CUDA tensor out of bounds: the kernel's assert fires (``CUDA error: device-side
assert triggered``).

Run under torchrun, as a training job is. The driver also records the fault in the kernel log as an
application Xid (13 and 43 on current GPUs), which a later ``ddpdoctor check`` must judge as an old
application fault, not a sick GPU.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def main() -> None:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    values = torch.arange(4, device=device)
    index = torch.tensor([10], device=device)
    print(values[index].tolist(), flush=True)  # the .tolist() synchronises: the error surfaces here


if __name__ == "__main__":
    main()
