"""One rank dies mid-run; `ddpdoctor watch` must call it a crash (with how it died), not a hang.

    ddpdoctor watch --nproc 2 examples/crash_rank.py --mode raise     # rank 1 raises at step 3
    ddpdoctor watch --nproc 2 examples/crash_rank.py --mode kill      # rank 1 SIGKILLs itself (like the OOM killer)
    ddpdoctor watch --nproc 2 examples/crash_rank.py --crash-rank all # every rank raises (a bug all ranks hit)

The other ranks are in the next all_reduce when it happens; on gloo they then fail with "Connection closed
by peer", on NCCL they would wait for the watchdog timeout.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.distributed as dist


def load_batch(rank: int, step: int, mode: str, crash_rank: str) -> torch.Tensor:
    if crash_rank in ("all", str(rank)) and step == 3:
        if mode == "raise":
            raise ValueError(f"corrupt sample in batch {step}")
        os.kill(os.getpid(), signal.SIGKILL)
    return torch.randn(8)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("raise", "kill"), default="raise")
    parser.add_argument("--crash-rank", default="1", help="the rank that fails, or 'all'")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(6):
        batch = load_batch(rank, step, args.mode, args.crash_rank)
        dist.all_reduce(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
