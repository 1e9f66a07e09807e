"""Indexes a CUDA tensor out of bounds: the kernel's assert fires (``CUDA error: device-side assert triggered``).

The driver also records it in the kernel log as an application Xid (13 and 43 on current GPUs), which a
later ``ddpdoctor check`` must judge as an old application fault, not a sick GPU.
"""

from __future__ import annotations

import torch


def main() -> None:
    values = torch.arange(4, device="cuda:0")
    index = torch.tensor([10], device="cuda:0")
    print(values[index].tolist(), flush=True)  # the .tolist() synchronises: the error surfaces here


if __name__ == "__main__":
    main()
