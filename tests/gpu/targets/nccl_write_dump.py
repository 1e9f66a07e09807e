"""One NCCL rank writes its Flight Recorder dump through ``ddpdoctor.fr.dump.write_dump`` twice.

Run under a one-rank launcher environment with ``TORCH_NCCL_TRACE_BUFFER_SIZE=2000``. The first call writes
``<out>/nccl_trace_rank_0`` (a new file: the umask decides its mode); the second must refuse to replace it
(an older run's dump is never overwritten: the output policy, issue 27). Prints ``first <path>`` and
``second refused: <why>`` (or ``second wrote``, a failure for the test).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from ddpdoctor.errors import DoctorError
from ddpdoctor.fr.dump import write_dump


def main() -> None:
    out = sys.argv[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    t = torch.ones(1024, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    print("first", write_dump(out, dist.get_rank()), flush=True)
    try:
        write_dump(out, dist.get_rank())
        print("second wrote", flush=True)
    except DoctorError as exc:
        print("second refused:", exc, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
