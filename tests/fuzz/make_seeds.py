"""Write the real files the fuzz suite mutates, in one process (torch is imported once): ``python -m
tests.fuzz.make_seeds OUTDIR``.

Every seed is produced by the library that writes it in real life, so the mutations start from the real
layout, not from our idea of it:

- ``model.pt``: ``torch.save`` (zip format: ``<name>/data.pkl``, ``<name>/byteorder``, ``<name>/data/N``,
  ``<name>/version``, ``<name>/.data/serialization_id``; torch/serialization.py ``_save``) of a DDP-style
  training checkpoint: ``module.``-prefixed model, optimizer state with ``param_groups``, epoch, lr.
- ``legacy.pt``: the same through ``_use_new_zipfile_serialization=False`` (pre-1.6 layout: magic number,
  protocol version, sys_info, the object, storage keys, raw storages).
- ``model.safetensors``: ``safetensors.torch.save_file``.
- ``dcp/``: ``torch.distributed.checkpoint.save`` without a process group (its single-process mode).
- ``fr/nccl_trace_rank_0`` and ``fr_json/nccl_trace_rank_0.json``: PyTorch's Flight Recorder dump of a
  one-rank gloo group after a few collectives, by ``ddpdoctor.fr.dump.write_dump`` (the calls PyTorch's
  dump-on-timeout makes: ``_dump_fr_trace`` / ``_dump_fr_trace_json``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(out: Path) -> None:
    os.environ.update({"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    from ddpdoctor.fr.dump import write_dump

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 4)).sum().backward()
    opt.step()
    model_sd = {f"module.{k}": v for k, v in net.state_dict().items()}
    ckpt = {"model": model_sd, "optimizer": opt.state_dict(), "epoch": 3, "lr": 0.1}
    torch.save(ckpt, out / "model.pt")
    torch.save(ckpt, out / "legacy.pt", _use_new_zipfile_serialization=False)
    save_file({k: v.contiguous() for k, v in model_sd.items()}, str(out / "model.safetensors"))
    dcp.save({"model": net.state_dict()}, checkpoint_id=str(out / "dcp"))

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.barrier()
    (out / "fr").mkdir()
    (out / "fr_json").mkdir()
    write_dump(out / "fr", 0, "pickle")
    write_dump(out / "fr_json", 0, "json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
