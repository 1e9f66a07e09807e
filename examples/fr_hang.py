"""A small DDP-style gloo job that hangs on purpose, with PyTorch's Flight Recorder on: `ddpdoctor fr` reads its dumps.

Run it under torchrun with the Flight Recorder enabled, then read the dumps:

    mkdir -p /tmp/fr && TORCH_FR_BUFFER_SIZE=2000 torchrun --nproc-per-node 3 examples/fr_hang.py --mode mismatch --out /tmp/fr
    ddpdoctor fr /tmp/fr

Modes (the faulty rank is --rank, default 1):
  healthy   every rank does the same steps; dumps are written at the end (ddpdoctor fr exits 0)
  skip      the faulty rank skips the all_reduce of step 3 and goes on: everyone ends up waiting
  stall     the faulty rank sleeps before the all_reduce of step 3 (busy elsewhere: a data loader, a hung I/O)
  mismatch  the faulty rank calls barrier where the others call all_reduce (rank-dependent code path)
  crash     the faulty rank exits at step 3 without writing a dump (a rank that died)
  subgroup  ranks 0-1 also all_reduce on their own group each step; the faulty rank (1) skips that at step 3

On NCCL, PyTorch writes these dumps itself when the watchdog times out (TORCH_NCCL_DUMP_ON_TIMEOUT=1, files
TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>). Gloo has no such watchdog, so every rank here writes its own dump
after --hang seconds with the calls PyTorch uses (torch._C._distributed_c10d._dump_fr_trace /
_dump_fr_trace_json), as the dump-on-timeout would. Dumps are named <out>/nccl_trace_rank_<rank>
(pickle, with Python frames) or <out>/nccl_trace_rank_<rank>.json (--format json, no frames).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def write_dump(out: str, fmt: str) -> None:
    """This rank's Flight Recorder dump, written under a temporary name and renamed (never half a file)."""
    rank = dist.get_rank()
    c10d = torch._C._distributed_c10d
    if fmt == "json":
        data = c10d._dump_fr_trace_json(True, False)  # includeCollectives, onlyActive
        path = os.path.join(out, f"nccl_trace_rank_{rank}.json")
    else:
        data = c10d._dump_fr_trace(True, True, False)  # includeCollectives, includeStackTraces, onlyActive
        path = os.path.join(out, f"nccl_trace_rank_{rank}")
    data = data.encode() if isinstance(data, str) else data
    with open(path + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(path + ".tmp", path)


def train_step(grad: torch.Tensor) -> None:
    dist.all_reduce(grad)


def sync_odd_path() -> None:
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["healthy", "skip", "stall", "mismatch", "crash", "subgroup"], default="healthy")
    parser.add_argument("--rank", type=int, default=1, help="the faulty rank")
    parser.add_argument("--out", required=True)
    parser.add_argument("--format", choices=["pickle", "json"], default="pickle")
    parser.add_argument("--hang", type=float, default=4.0, help="seconds before a hung rank writes its dump")
    parser.add_argument("--grace", type=float, default=3.0, help="seconds a rank waits after its dump")
    parser.add_argument("--steps", type=int, default=6)
    args = _checked(parser.parse_args())
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.hang + 60))
    rank = dist.get_rank()
    faulty = rank == args.rank and args.mode != "healthy"

    def dump_and_exit() -> None:
        write_dump(args.out, args.format)
        # Exiting closes this rank's gloo connections, which fails the peers' pending collectives at once:
        # give every rank the time to write its own dump first.
        time.sleep(args.grace)
        os._exit(0)

    timer = threading.Timer(args.hang, dump_and_exit)
    timer.daemon = True
    timer.start()
    grad = torch.ones(1024)
    pair = dist.new_group([0, 1]) if args.mode == "subgroup" else None  # every rank must call new_group
    try:
        for step in range(args.steps):
            if faulty and step == 3:
                if args.mode == "skip":
                    continue
                if args.mode == "stall":
                    time.sleep(args.hang + 60)
                if args.mode == "crash":
                    # Dies without a dump. Exit status 0 so that torchrun does not tear the other ranks down
                    # before their own dumps are written (PyTorch's dump-on-timeout has the same race).
                    os._exit(0)
                if args.mode == "mismatch":
                    sync_odd_path()
                    continue
            if pair is not None and rank in (0, 1) and not (faulty and step == 3):
                dist.all_reduce(grad, group=pair)
            train_step(grad)
        dist.barrier()
    except RuntimeError:  # a peer went away (it crashed, or exited after its dump): wait for the dump
        timer.join()
    timer.cancel()
    write_dump(args.out, args.format)
    dist.destroy_process_group()


def _checked(args: argparse.Namespace) -> argparse.Namespace:
    """--out must be an existing folder, checked before any process group exists: a typo or a missing
    `mkdir` is then one line (from the first rank; the others leave quietly) and exit 2 at once, instead of
    every rank's traceback when its dump cannot be written and the wait for the peers that went with it.
    (Defined after main so that the line numbers docs/fr.md quotes stay put.)"""
    if not os.path.isdir(args.out):
        if os.environ.get("RANK", "0") == "0":
            why = "is not a folder" if os.path.exists(args.out) else "does not exist"
            os.write(2, f"fr_hang.py: --out {args.out} {why}: create it first (mkdir -p {args.out})\n".encode())
        else:
            # torchrun stops the whole job when the first worker exits: a rank that left at once could stop
            # rank 0 before it printed the line (seen on a loaded machine), so the others leave a moment later.
            time.sleep(5)
        raise SystemExit(2)
    return args


if __name__ == "__main__":
    main()
