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
"""

from __future__ import annotations

import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from examples.ckpt_models import make_mlp


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
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    make_all(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
