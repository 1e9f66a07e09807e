"""A process blocked in ``torch.cuda.synchronize()`` behind a minute of GPU work (for `ddpdoctor stacks`).

``torch.cuda._sleep(cycles)`` queues a kernel that spins for that many GPU clock cycles, so the host thread
sits in the CUDA driver's synchronize -- where a rank waiting for a stuck kernel or NCCL collective sits.
Prints "ready" just before it blocks; the test kills it.
"""

from __future__ import annotations

import torch


def wait_for_gpu() -> None:
    torch.cuda.synchronize()


def main() -> None:
    torch.cuda.init()
    for _ in range(60):  # about 1e9 cycles each: a second or so per kernel at ~1-2 GHz
        torch.cuda._sleep(1_000_000_000)
    print("ready", flush=True)
    wait_for_gpu()


if __name__ == "__main__":
    main()
