"""A DDP job that hangs on purpose: one rank is somewhere else, the way real hangs look.

Run it under torchrun (gloo, CPU), then diagnose it from another terminal:

    torchrun --nproc-per-node 4 examples/stacks_hang.py --odd-rank 1 --mode barrier
    ddpdoctor stacks          # "rank 1 is in barrier() at stacks_hang.py:..; ranks 0,2-3 are in all_reduce() ..."

Modes for the odd rank:
  barrier  - it takes another code path into ``dist.barrier()`` while the others wait in ``all_reduce``
  sleep    - it is still "loading data" (``time.sleep``) while the others wait in ``all_reduce``

``--marker-dir DIR`` makes each rank touch ``DIR/rank-<RANK>`` just before it blocks, so a test can wait
until every rank has reached its hang point instead of sleeping a fixed time. ``--install-dumps`` calls
``ddpdoctor.install_stack_dumps()`` first (the fallback for machines where py-spy may not attach).
The process group timeout (``--timeout``, default 600 s) bounds the hang if nobody kills the job.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta
from pathlib import Path


def reached(marker_dir: str | None) -> None:
    """Tell a watching test that this rank is about to block."""
    if marker_dir:
        Path(marker_dir, f"rank-{os.environ['RANK']}").write_text(str(os.getpid()))


def load_batch(marker_dir: str | None) -> None:
    """The straggler: still "loading data" while everyone else waits in the collective."""
    reached(marker_dir)
    time.sleep(3600)


def sync_odd_path(marker_dir: str | None) -> None:
    """The other code path: a barrier nobody else calls at this point."""
    import torch.distributed as dist

    reached(marker_dir)
    dist.barrier()


def train_step(marker_dir: str | None) -> None:
    """What every healthy rank does: reduce the gradients."""
    import torch
    import torch.distributed as dist

    grad = torch.ones(4)
    reached(marker_dir)
    dist.all_reduce(grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--odd-rank", type=int, default=1)
    parser.add_argument("--mode", choices=["barrier", "sleep"], default="barrier")
    parser.add_argument("--marker-dir", default=None)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--install-dumps", action="store_true")
    args = parser.parse_args()

    # A second Python thread, as real jobs have (loggers, data-loader pins): shown only with --all-threads.
    threading.Thread(target=time.sleep, args=(3600,), name="heartbeat", daemon=True).start()
    if args.install_dumps:
        import ddpdoctor

        ddpdoctor.install_stack_dumps()

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    if dist.get_rank() == args.odd_rank:
        if args.mode == "sleep":
            load_batch(args.marker_dir)
        else:
            sync_odd_path(args.marker_dir)
    else:
        train_step(args.marker_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
