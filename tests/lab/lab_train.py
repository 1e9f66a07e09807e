"""The watch lab's training script: a tiny all_reduce loop, as a torchrun-launched env:// script is written.

``--scenario steady`` runs until the test injects its fault (a host killed, a link cut, a port blocked, a link
shaped: with ``--numel 2000000`` each all_reduce moves 8 MB, seconds over a 2 Mbit/s link);
``--scenario desync`` has rank 0 alone in an evaluation ``barrier`` at step 4 (the cross-host desync).
Rank 0 touches ``$LAB_READY`` after step 3 so the test injects its fault into a running job. Every loop has
an end (``--seconds``): nothing here runs forever if a test forgets it.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--scenario", choices=["steady", "desync"], default="steady")
parser.add_argument("--seconds", type=float, default=150.0)
parser.add_argument("--numel", type=int, default=4, help="elements of the all_reduced tensor")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
grad = torch.ones(args.numel)
end = time.monotonic() + args.seconds
step = 0
while time.monotonic() < end:
    step += 1
    if args.scenario == "desync" and step == 4 and rank == 0:
        dist.barrier()  # BUG: evaluation on rank 0 only
    dist.all_reduce(grad)
    if step == 3 and rank == 0 and os.environ.get("LAB_READY"):
        with open(os.environ["LAB_READY"], "w") as ready:
            ready.write("running\n")
    time.sleep(0.2)
dist.destroy_process_group()
