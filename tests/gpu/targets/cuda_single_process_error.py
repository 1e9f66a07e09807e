"""A single-process CUDA script (no launcher, no process group) that fails on the GPU: ``assert`` indexes out
of bounds (a device-side assert), ``oom`` allocates more than the GPU has. Issue 26: such a log is no DDP
problem (``ddpdoctor explain`` exits 0); the same failure in a rank of a job is one.
"""

from __future__ import annotations

import sys

import torch


def main() -> None:
    device = torch.device("cuda", 0)
    if sys.argv[1] == "assert":
        table = torch.zeros(10, device=device)
        index = torch.tensor([12], device=device)
        print(table[index].sum().item())  # the kernel asserts; .item() raises "device-side assert triggered"
    else:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.empty(int(total * 2), dtype=torch.uint8, device=device)  # torch.OutOfMemoryError


if __name__ == "__main__":
    main()
