import os
import signal
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
r = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
mode = os.environ.get("MODE", "kill")
if r == 1:
    if mode == "kill":
        print("rank 1 about to die", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "raise":
        raise ValueError("bad batch in rank 1")
    elif mode == "shape":
        t = torch.ones(8)
dist.all_reduce(t)
time.sleep(1)
dist.destroy_process_group()
