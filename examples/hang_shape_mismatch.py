"""A collective called with different tensor shapes on different ranks.

The last rank builds its metrics tensor from a rank-dependent list (one extra entry), so its all_reduce
is float32[4] where the others pass float32[3]. NCCL hangs or reports garbage; gloo may crash or hang.
TORCH_DISTRIBUTED_DEBUG=DETAIL would catch it at a cost on every collective; `ddpdoctor watch` reports it
at once with both call sites.

    torchrun --nproc-per-node 2 examples/hang_shape_mismatch.py
    ddpdoctor watch --nproc 2 examples/hang_shape_mismatch.py
    # collective #2: rank 0 in all_reduce float32[3] at ...:28; rank 1 in all_reduce float32[4] at ...:28
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def metrics(rank: int, world: int) -> list[float]:
    values = [1.0, 2.0, 3.0]
    if rank == world - 1:
        values.append(4.0)  # BUG: a rank-dependent metric makes the tensor longer on this rank
    return values


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    stats = torch.tensor(metrics(rank, world))
    dist.all_reduce(stats)
    print(f"rank {rank}: {stats.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
