"""A healthy job with a long collective-free phase on every rank (an evaluation of ``--eval-seconds``).

Nothing is wrong with it: ``watch`` must not call it a hang when ``--hang-timeout`` is above the phase, and
words it as a STALL (with "raise --hang-timeout if this is expected") when it is below.

    ddpdoctor watch --nproc 2 --hang-timeout 60 examples/train_long_eval.py --eval-seconds 20   # ok, exit 0
    ddpdoctor watch --nproc 2 --hang-timeout 5 examples/train_long_eval.py --eval-seconds 20    # STALL, exit 1
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def evaluate(model: torch.nn.Module, seconds: float) -> float:
    """Stands for a long evaluation: busy in the rank's own code, no collective, no optimizer step."""
    end, total = time.monotonic() + seconds, 0.0
    with torch.no_grad():
        while time.monotonic() < end:
            total += float(model(torch.randn(64, 16)).sum())
            time.sleep(0.01)
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval-seconds", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    evaluate(model.module, args.eval_seconds)
    for _ in range(args.steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    dist.barrier()
    if dist.get_rank() == 0:
        print("LONG_EVAL_OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
