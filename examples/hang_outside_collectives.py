"""Every rank stops outside any collective after a few training steps: what a hung NCCL job looks like.

On NCCL the host thread is almost never inside the collective: ``all_reduce`` and DDP's gradient reduction
only enqueue work, so a stuck job shows every rank waiting somewhere else: ``torch.cuda.synchronize()``
behind a kernel that never ends, ``.item()``, a DataLoader whose worker deadlocked, a read on a stuck
filesystem (issue 25). Here, on gloo, every rank trains ``--steps`` DDP steps and then stops:

    --mode sleep       every rank sleeps (stands for a GPU kernel that never ends, a stuck NFS read)
    --mode dataloader  the DataLoader's worker blocks forever on a lock in ``__getitem__`` (num_workers=2)
    --gil-rank N       (with --mode sleep) rank N sleeps in a C call that holds the GIL instead (a C extension
                       blocked in a system call without releasing it): its own threads cannot run, so its
                       stack can only be read from outside (watch uses py-spy)

    ddpdoctor watch --nproc 2 --hang-timeout 15 examples/hang_outside_collectives.py --mode dataloader
    # HANG: no rank made progress for 15 s; each rank "waiting for a batch from DataLoader worker 1 (pid ...)"
    # with the worker's stack, stuck at hang_outside_collectives.py: the lock in __getitem__

``--mode sleep`` is worded as a STALL (no rank waits for another, the GPU or a worker: a long evaluation
would look the same), with "raise --hang-timeout if this is expected".
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

_LOCK = threading.Lock()


class StuckAfter(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A dataset whose item ``stuck_at`` never comes back: it takes a lock that nobody releases."""

    def __init__(self, size: int, stuck_at: int) -> None:
        self.size, self.stuck_at = size, stuck_at

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index >= self.stuck_at:
            _LOCK.acquire()
            _LOCK.acquire()  # BUG: a second acquire of a non-reentrant lock: this worker never returns
        return torch.randn(16), torch.randn(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("sleep", "dataloader"), default="sleep")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--gil-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Every item from step `--steps` on is stuck (in dataloader mode): the batch after the last good step.
    stuck_at = args.steps * 4 * world if args.mode == "dataloader" else 1 << 30
    data = StuckAfter(4 * world * (args.steps + 4), stuck_at)
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False), num_workers=2)
    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        print(f"step {step} done", flush=True)
        if step + 1 == args.steps and args.mode == "sleep" and dist.get_rank() == args.gil_rank:
            hold_the_gil = ctypes.PyDLL(None).sleep  # PyDLL: the GIL stays held during the call
            hold_the_gil.argtypes = [ctypes.c_uint]
            hold_the_gil(600)  # this rank stops here, with the GIL
        if step + 1 == args.steps and args.mode == "sleep":
            time.sleep(600)  # every rank stops here, outside any collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
