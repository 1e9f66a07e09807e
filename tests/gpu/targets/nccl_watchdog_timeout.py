"""One NCCL rank whose all_reduce never finishes in time: the watchdog times it out and dumps the Flight Recorder.

A kernel that spins for a minute (``torch.cuda._sleep``) is queued on the compute stream first; NCCL's
stream waits for it, so the all_reduce after it cannot complete -- what a rank whose GPU is stuck looks
like from the collective. With a 5 s process-group timeout ProcessGroupNCCL's watchdog reports
``Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, ...)``, writes the
Flight Recorder dump to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (run with TORCH_FR_BUFFER_SIZE,
TORCH_NCCL_DUMP_ON_TIMEOUT=1 and a short TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC) and takes the process down.
Run under a one-rank launcher environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timedelta(seconds=5), device_id=device)
    t = torch.ones(1024, device=device)
    dist.all_reduce(t)  # #1 completes
    torch.cuda.synchronize()
    print("first all_reduce done; the GPU is now busy for a minute", flush=True)
    torch.cuda._sleep(2_000_000_000 * 60)  # about a minute of spinning at ~2 GHz
    dist.all_reduce(t)  # #2 waits behind it: the watchdog times it out after 5 s
    time.sleep(120)  # the watchdog ends the process long before this
    print("the watchdog did not fire", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
