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
shapes and names the prefix change that makes ``load_state_dict(strict=True)`` work. Nothing in the
checkpoint is executed and no tensor data is read.
"""

from __future__ import annotations

from ddpdoctor.check.api import Check, CheckContext
from ddpdoctor.errors import DoctorError
from ddpdoctor.findings import FAIL, PASS, SKIP, WARN, Finding


def _run(ctx: CheckContext) -> list[Finding]:
    path = ctx.options.checkpoint
    if not path:
        return [ctx.finding(SKIP, "no --checkpoint given: checkpoint loading not checked",
                            "pass --checkpoint PATH (and --model MODULE:FACTORY) to check a resume")]
    from ddpdoctor.ckpt import core as ckpt

    try:
        checkpoint = ckpt.open_checkpoint(path)
    except DoctorError as exc:
        return [ctx.finding(FAIL, f"checkpoint cannot be read: {exc}",
                            "fix or replace the checkpoint before launching the job", checkpoint=path)]
    if ctx.options.model:
        try:
            model = ckpt.build_model_for_shapes(ctx.options.model)
            rep = ckpt.diff_against(checkpoint, model, model_spec=ctx.options.model)
        except DoctorError as exc:
            return [ctx.finding(FAIL, str(exc), "fix --model or the checkpoint", checkpoint=path,
                                model=ctx.options.model)]
        details = {k: rep[k] for k in ("location", "checkpoint_keys", "model_keys", "fix")}
        details.update(missing=rep["missing"][:20], unexpected=rep["unexpected"][:20],
                       shape_mismatches=rep["shape_mismatches"][:20], checkpoint=path, model=ctx.options.model)
        return [ctx.finding(PASS if rep["status"] == "pass" else FAIL, rep["summary"], rep["remedy"], **details)]
    rep = ckpt.inspect_checkpoint(checkpoint)
    out = []
    for f in rep["findings"]:
        status = {"pass": PASS, "warn": WARN, "fail": FAIL}[f["status"]]
        out.append(ctx.finding(status, f"{path}: {f['summary']}", f["remedy"], checkpoint=path,
                               format=rep["format"], tensor_bytes=rep["tensor_bytes"]))
    return out


CHECK = Check(id="state_dict", title="checkpoint loads into the model", run=_run, rank0_only=True)
