"""Asks the GPU for far more memory than it has: PyTorch's ``torch.OutOfMemoryError: CUDA out of memory``."""

from __future__ import annotations

import torch


def main() -> None:
    free, total = torch.cuda.mem_get_info(0)
    print(f"GPU 0: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB", flush=True)
    torch.empty(total, dtype=torch.float32, device="cuda:0")  # 4 bytes per byte of the GPU: 4x its memory


if __name__ == "__main__":
    main()
