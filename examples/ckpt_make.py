"""Save the checkpoints `ddpdoctor ckpt` exists for, from real wrappers (tests and docs use them).

    python -m examples.ckpt_make OUTDIR

writes, from ``examples.ckpt_models:make_mlp`` wrapped for real (a one-process gloo group, no GPU):

- ``ddp.pt``            ``{"epoch", "net": DDP(model).state_dict(), "optimizer", "config"}`` (keys ``module.``)
- ``ddp_compiled.pt``   ``DDP(torch.compile(model)).state_dict()``  (``module._orig_mod.``)
- ``compiled_ddp.pt``   ``torch.compile(DDP(model)).state_dict()``  (``_orig_mod.module.``)
- ``plain.pt``          ``{"model_state_dict": model.state_dict()}`` (no prefix)
- ``mixed.pt``          both ``module.x`` and ``x`` keys (a broken merge: strip must refuse it)
- ``ddp.safetensors``   the DDP state_dict as safetensors, with ``__metadata__``
- ``legacy_ddp.pt``     ``ddp.pt`` in the pre-1.6 (non-zip) format

and from ``examples.ckpt_models:make_stack`` (layers wrapped one by one):

- ``compiled_layer.pt`` ``{"model": net.state_dict()}`` with ``net.layers[1] = torch.compile(...)``: keys
  ``layers.1._orig_mod.attn.weight`` (saved for real)
- ``ac_params.pt``      ``{"model": {name: tensor for name in named_parameters() + named_buffers()}}`` of the
  model after ``apply_activation_checkpointing`` (run for real on CPU): ``layers.0._checkpoint_wrapped_module.attn.weight``.
  ``state_dict()`` itself strips that segment (a hook since pytorch/pytorch#77224); parameter-name dicts,
  as trainers save for LoRA or EMA weights, keep it.
- ``fsdp_ac.pt``        the same tensors under the names ``FullyShardedDataParallel(use_orig_params=True)``
  gives them when it wraps the model and each checkpointed block:
  ``_fsdp_wrapped_module.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.attn.weight`` (the layout
  in Lightning-AI/litgpt#1613). FSDP1 cannot run here ("FSDP needs a non-CPU accelerator device"), so the
  ``_fsdp_wrapped_module.`` segments are inserted where FSDP puts them (torch/distributed/fsdp/_common_utils.py
  ``FSDP_WRAPPED_MODULE``); the activation-checkpointing names are real.
- ``fpw_legacy.pt``     the legacy FSDP + FlattenParamsWrapper layout (``_fsdp_wrapped_module._fpw_module.``),
  built the same way (fairscale / torch <= 1.12)
"""

from __future__ import annotations

import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from examples.ckpt_models import make_mlp, make_stack


def make_all(outdir: Path) -> None:
    """Write every example checkpoint into ``outdir``."""
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        try:
            model = make_mlp()
            ddp = DDP(model)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
            ddp(torch.randn(4, 8)).sum().backward()
            opt.step()
            torch.save({"epoch": 3, "net": ddp.state_dict(), "optimizer": opt.state_dict(),
                        "config": {"lr": 0.1, "arch": "mlp"}}, outdir / "ddp.pt")
            torch.save({"epoch": 3, "net": ddp.state_dict(), "optimizer": opt.state_dict()},
                       outdir / "legacy_ddp.pt", _use_new_zipfile_serialization=False)
            # torch.compile only wraps here (OptimizedModule); nothing is compiled until forward.
            torch.save(DDP(torch.compile(make_mlp())).state_dict(), outdir / "ddp_compiled.pt")
            compiled_ddp: torch.nn.Module = torch.compile(DDP(make_mlp()))  # type: ignore[assignment]
            torch.save(compiled_ddp.state_dict(), outdir / "compiled_ddp.pt")
            plain = make_mlp().state_dict()
            torch.save({"model_state_dict": plain}, outdir / "plain.pt")
            mixed = OrderedDict(ddp.state_dict())
            mixed.update(plain)
            torch.save(mixed, outdir / "mixed.pt")
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in ddp.state_dict().items()}, str(outdir / "ddp.safetensors"),
                      metadata={"format": "pt", "epoch": "3"})
            _save_wrapped_stacks(outdir)
        finally:
            dist.destroy_process_group()


def _save_wrapped_stacks(outdir: Path) -> None:
    """The layered model with torch.compile, activation checkpointing and (named) FSDP wrappers."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    from examples.ckpt_models import Block

    net = make_stack()
    net.layers[1] = torch.compile(net.layers[1])  # type: ignore[index]
    torch.save({"model": net.state_dict()}, outdir / "compiled_layer.pt")
    ac = make_stack()
    apply_activation_checkpointing(ac, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda m: isinstance(m, Block))
    ac(torch.randn(2, 8)).sum().backward()  # the checkpointed forward/backward really runs
    named = dict(ac.named_parameters())
    named.update(ac.named_buffers())
    params = {k: v.detach() for k, v in named.items()}
    torch.save({"model": params}, outdir / "ac_params.pt")
    fsdp = {"_fsdp_wrapped_module." + k.replace("._checkpoint_wrapped_module.",
                                                "._fsdp_wrapped_module._checkpoint_wrapped_module."): v
            for k, v in params.items()}
    torch.save({"model": fsdp}, outdir / "fsdp_ac.pt")
    fpw = {"_fsdp_wrapped_module._fpw_module." + k.replace("._checkpoint_wrapped_module.", "."): v
           for k, v in params.items()}
    torch.save(fpw, outdir / "fpw_legacy.pt")


if __name__ == "__main__":
    make_all(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
