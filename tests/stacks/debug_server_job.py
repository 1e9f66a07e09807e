"""A rank of a two-host job that runs PyTorch's debug worker servers and then hangs the usual way.

``torch.distributed.debug.start_debug_server()`` registers this rank's HTTP address in the job's store
(``debug_server/rank<N>``). After one all_reduce (a Flight Recorder entry on every rank) rank 0 goes into
its own code (``evaluate``) and the others wait for it in ``barrier``. Prints ``ready <rank> <pid>``.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch.distributed.debug import start_debug_server


def evaluate() -> None:
    time.sleep(float(os.environ.get("HANG_S", "120")))


def main() -> None:
    dist.init_process_group("gloo")
    start_debug_server(port=int(os.environ.get("DEBUG_FRONTEND_PORT", "25999")))
    value = torch.ones(2)
    dist.all_reduce(value)
    print(f"ready {dist.get_rank()} {os.getpid()}", flush=True)
    if dist.get_rank() == 0:
        evaluate()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
