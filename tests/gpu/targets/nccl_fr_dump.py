"""One NCCL rank with PyTorch's Flight Recorder on, dumping its trace on demand (for `ddpdoctor fr`).

Run with ``TORCH_NCCL_TRACE_BUFFER_SIZE=2000`` (the ring of recorded collectives; 0 turns the recorder off)
under a launcher environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). It does a few all_reduces and a
broadcast, then writes ``<out>/nccl_trace_rank_<rank>`` with ``torch._C._distributed_c10d._dump_nccl_trace``
-- the call PyTorch's own dump-on-timeout makes (pickle bytes, the format ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
files have) -- under a temporary name renamed into place.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    out = sys.argv[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    t = torch.ones(1024, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    torch.cuda.synchronize()
    data = torch._C._distributed_c10d._dump_nccl_trace(True, True, False)  # collectives, stacks, not only active
    path = os.path.join(out, f"nccl_trace_rank_{dist.get_rank()}")
    with open(path + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()
    print("dumped", flush=True)


if __name__ == "__main__":
    main()
