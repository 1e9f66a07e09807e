"""Write Hugging Face style sharded checkpoints of a DDP-wrapped model (tests and docs use them).

    python -m examples.ckpt_make_shards OUTDIR

The layout is the one ``transformers``' ``save_pretrained`` writes (``huggingface_hub``'s
``split_torch_state_dict_into_shards`` naming, ``transformers.utils`` index names): shard files named
``<stem>-0000N-of-0000M.<ext>`` and an index ``{"metadata": {"total_size": bytes}, "weight_map": {key: file}}``.
The state_dict is ``DDP(make_stack()).state_dict()`` (keys ``module.layers.0.attn.weight``), in 3 shards:

- ``st/``       ``model-0000N-of-00003.safetensors`` (written by ``safetensors.torch.save_file``) and
                ``model.safetensors.index.json``, plus a ``config.json``
- ``bin/``      ``pytorch_model-0000N-of-00003.bin`` (``torch.save`` of each shard's flat state_dict) and
                ``pytorch_model.bin.index.json``
- ``noindex/``  the safetensors shards without their index
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel as DDP

from examples.ckpt_models import make_stack

SHARDS = 3


def _split(sd: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    keys = list(sd)
    per = -(-len(keys) // SHARDS)
    return [{k: sd[k] for k in keys[i * per:(i + 1) * per]} for i in range(SHARDS)]


def write_shards(outdir: Path, sd: dict[str, torch.Tensor], stem: str, ext: str, index: bool = True) -> None:
    """``sd`` as ``SHARDS`` shard files (+ index) in ``outdir``."""
    outdir.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for n, part in enumerate(_split(sd), start=1):
        name = f"{stem}-{n:05d}-of-{SHARDS:05d}.{ext}"
        if ext == "safetensors":
            save_file({k: v.contiguous() for k, v in part.items()}, str(outdir / name), metadata={"format": "pt"})
        else:
            torch.save(part, outdir / name)
        for k, v in part.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    if index:
        index_name = "model.safetensors.index.json" if ext == "safetensors" else "pytorch_model.bin.index.json"
        doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (outdir / index_name).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def make_shards(outdir: Path) -> None:
    """Write the three example shard sets into ``outdir``."""
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        try:
            sd = {k: v.detach().clone() for k, v in DDP(make_stack()).state_dict().items()}
        finally:
            dist.destroy_process_group()
    write_shards(outdir / "st", sd, "model", "safetensors")
    (outdir / "st" / "config.json").write_text('{"model_type": "stack", "depth": 3}\n')
    write_shards(outdir / "bin", sd, "pytorch_model", "bin")
    write_shards(outdir / "noindex", sd, "model", "safetensors", index=False)


if __name__ == "__main__":
    make_shards(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
