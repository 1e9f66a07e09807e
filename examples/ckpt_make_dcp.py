"""Write ``torch.distributed.checkpoint`` directories from a real 2-rank gloo DDP job (tests and docs use them).

    python -m examples.ckpt_make_dcp OUTDIR

Each rank wraps ``examples.ckpt_models:make_mlp`` in DDP, takes one optimizer step, and the two ranks
save together with ``torch.distributed.checkpoint.save`` (the layout torch writes: ``.metadata`` plus one
``__<rank>_<n>.distcp`` file per rank):

- ``dcp_ddp/``      ``{"model": ddp.state_dict(), "optim": opt.state_dict(), "epoch": 3}`` (keys ``module.``)
- ``dcp_flat/``     ``ddp.state_dict()`` itself, saved at the top level
- ``dcp_fsdp2/``    ``{"model": model.state_dict()}`` of ``examples.ckpt_models:make_stack`` sharded with FSDP2
                    (``fully_shard`` on each layer and the root, on a CPU device mesh): every tensor is stored
                    as two row blocks, one per rank (``Shard(0)``)
"""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from examples.ckpt_models import make_mlp, make_stack


def _rank(rank: int, world: int, rendezvous: str, outdir: str) -> None:
    # A deadline on every collective: a rank that dies makes the other fail instead of waiting forever.
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        ddp = DDP(make_mlp())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        ddp(torch.randn(4, 8)).sum().backward()
        opt.step()
        dcp.save({"model": ddp.state_dict(), "optim": opt.state_dict(), "epoch": 3},
                 checkpoint_id=f"{outdir}/dcp_ddp")
        dcp.save(ddp.state_dict(), checkpoint_id=f"{outdir}/dcp_flat")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        stack = make_stack()
        for layer in stack.layers:  # type: ignore[union-attr]
            fully_shard(layer, mesh=mesh)
        fully_shard(stack, mesh=mesh)
        dcp.save({"model": stack.state_dict()}, checkpoint_id=f"{outdir}/dcp_fsdp2")
    finally:
        dist.destroy_process_group()


def make_dcp(outdir: Path, world: int = 2, deadline_s: float = 240) -> None:
    """Write the DCP example directories into ``outdir`` with a real ``world``-rank gloo job."""
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_rank, args=(world, f"{tmp}/pg", str(outdir)), nprocs=world, join=False,
                                 start_method="spawn")
        end = time.monotonic() + deadline_s
        while not ctx.join(timeout=1):  # raises if a rank failed
            if time.monotonic() > end:
                for proc in ctx.processes:
                    proc.kill()
                raise SystemExit(f"the {world}-rank DCP save did not finish within {deadline_s:.0f} s")


if __name__ == "__main__":
    make_dcp(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
