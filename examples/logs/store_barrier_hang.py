"""A real hang in init's store-based barrier, for ``examples/logs/store_barrier_hang.log``.

Rank 0 creates a new group; rank 1 never does. With TORCH_DIST_INIT_BARRIER=1 ``new_group`` ends in a
store-based barrier over every rank, so rank 0 waits there for rank 1, logging (TORCH_LOGS=+distributed)
"Waiting in store based barrier ..." every ~10 s, and nothing else. Captured on a CPU machine (torch 2.13, gloo):

    for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 TORCH_DIST_INIT_BARRIER=1 \\
        TORCH_LOGS=+distributed timeout 50 python store_barrier_hang.py >> store_barrier_hang.log 2>&1 & done; wait

``ddpdoctor explain store_barrier_hang.log`` reports a probable hang in the store barrier, rank 1 not seen.
"""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}: process group up", flush=True)
if dist.get_rank() == 0:
    dist.new_group([0])
else:
    time.sleep(600)  # never calls new_group
