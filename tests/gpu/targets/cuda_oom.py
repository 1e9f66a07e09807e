"""A DDP rank that asks its GPU for far more memory than it has: ``torch.OutOfMemoryError: CUDA out of memory``.

Run under torchrun (one rank per GPU), as a training job is: the log then carries torchrun's failure summary.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def main() -> None:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    free, total = torch.cuda.mem_get_info(device)
    print(f"rank {dist.get_rank()}: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB", flush=True)
    torch.empty(total, dtype=torch.float32, device=device)  # 4 bytes per byte of the GPU: 4x its memory


if __name__ == "__main__":
    main()
