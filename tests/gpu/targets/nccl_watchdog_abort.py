"""One NCCL rank whose all_reduce the watchdog times out, and then aborts the process (issue 26: the timeout
must be reported before the SIGABRT it causes).

A kernel that spins for a minute (``torch.cuda._sleep``) is queued first; NCCL's stream waits for it, so the
all_reduce behind it cannot finish: what a rank whose GPU is stuck looks like from the collective. With a 5 s
process-group timeout ProcessGroupNCCL's watchdog logs ``Watchdog caught collective operation timeout`` and
"To avoid data inconsistency, we are taking the entire process down." and aborts: under torchrun the failure
summary then says ``exitcode : -6`` and ``Signal 6 (SIGABRT) received by PID``. Run it under torchrun.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timedelta(seconds=5), device_id=device)
    t = torch.ones(1024, device=device)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print("step 0 done; the GPU is now busy for a minute", flush=True)
    torch.cuda._sleep(2_000_000_000 * 60)  # about a minute of spinning at ~2 GHz
    dist.all_reduce(t)  # waits behind it: the watchdog times it out after 5 s and aborts the process
    time.sleep(120)
    print("the watchdog did not fire", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
