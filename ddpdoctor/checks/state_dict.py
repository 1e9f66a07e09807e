"""`state_dict`: the checkpoint you are about to resume from loads into your model (rank 0 only).

What fails in real life: a checkpoint saved as ``ddp_model.state_dict()`` has every key prefixed
``module.`` (``torch.compile`` adds ``_orig_mod.``), so resuming on an unwrapped model dies after the job
has queued and started, with::

    RuntimeError: Error(s) in loading state_dict for Net:
        Missing key(s) in state_dict: "fc.weight", "fc.bias".
        Unexpected key(s) in state_dict: "module.fc.weight", "module.fc.bias".

or, for a model built with other sizes, ``size mismatch for fc.weight: copying a param with shape
torch.Size([4, 8]) from checkpoint, the shape in current model is torch.Size([4, 16])``. A checkpoint that
pickles arbitrary classes fails on torch >= 2.6 with ``Weights only load failed ... Unsupported global:
GLOBAL argparse.Namespace was not an allowed global by default``.

Reproduce by hand::

    python -c "import torch; torch.save({'module.fc.weight': torch.ones(2, 2)}, 'ddp.pt')"
    ddpdoctor check --checkpoint ddp.pt --model mypkg.models:build

Without ``--model`` the check only reports wrapper prefixes (a warning); with it, it compares keys and
shapes and names the prefix change that makes ``load_state_dict(strict=True)`` work. ``--checkpoint`` may
be a file, a ``torch.distributed.checkpoint`` directory or a shard set (a data file or shard that is
missing is a failure too). Nothing in the checkpoint is executed and no tensor data is read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ddpdoctor.check import Check, CheckContext
from ddpdoctor.errors import DoctorError
from ddpdoctor.findings import FAIL, SKIP, Finding


def _run(ctx: CheckContext) -> list[Finding]:
    path = ctx.options.checkpoint
    if not path:
        return [ctx.finding(SKIP, "no --checkpoint given: checkpoint loading not checked",
                            "pass --checkpoint PATH (and --model MODULE:FACTORY) to check a resume")]
    from ddpdoctor.ckpt import (
        UnsafeCheckpointError,
        build_model_for_shapes,
        diff_against,
        inspect_checkpoint,
        open_checkpoint,
        shell_word,
    )

    try:
        checkpoint = open_checkpoint(path)
    except UnsafeCheckpointError as exc:
        # `ckpt` says "pass --trust"; this check has no such option (it never runs a checkpoint), so the
        # advice is the command that does take it.
        return [ctx.finding(FAIL, f"checkpoint cannot be read: {exc.problem}",
                            f"if you trust where it came from, see what it holds with: ddpdoctor ckpt inspect "
                            f"--trust {shell_word(Path(path))}; then re-save only tensors and plain containers "
                            "(torch.save({'model': model.state_dict()}))", checkpoint=path)]
    except DoctorError as exc:
        return [ctx.finding(FAIL, f"checkpoint cannot be read: {exc}",
                            "fix or replace the checkpoint before launching the job", checkpoint=path)]
    if ctx.options.model:
        try:
            model = build_model_for_shapes(ctx.options.model)
            rep = diff_against(checkpoint, model, model_spec=ctx.options.model)
        except DoctorError as exc:
            return [ctx.finding(FAIL, str(exc), "fix --model or the checkpoint", checkpoint=path,
                                model=ctx.options.model)]
        # What is missing from a folder (a rank's file, a shard) fails the resume however well the keys fit,
        # and the keys it held are counted there, not as a wrong architecture; then the key verdict.
        return [*(dataclasses.replace(f, ranks=[ctx.rank], summary=f"{path}: {f.summary}")
                  for f in rep.layout_findings),
                dataclasses.replace(rep.finding, ranks=[ctx.rank])]
    # Without a model the findings are `ckpt inspect`'s; in a report of many checks they name the file.
    return [dataclasses.replace(f, ranks=[ctx.rank], summary=f"{path}: {f.summary}")
            for f in inspect_checkpoint(checkpoint).findings]


CHECK = Check(id="state_dict", title="checkpoint loads into the model", run=_run, rank0_only=True)
