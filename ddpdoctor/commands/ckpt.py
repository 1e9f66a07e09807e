"""`ddpdoctor ckpt inspect|strip|diff`: checkpoint prefixes and key mismatches (engine: ddpdoctor.ckpt).

torch is imported only inside the commands, so `ddpdoctor --help` stays fast. `--json PATH` writes the
JSON document atomically and still prints the text; `--json -` prints the document instead of the text.
Every output is checked against the output policy (:mod:`ddpdoctor.outputs`) before the checkpoint is read.
"""

from __future__ import annotations

import typer

from ddpdoctor import outputs
from ddpdoctor.commands.options import JsonOption
from ddpdoctor.errors import DoctorError


def _one_key(keys: list[str] | None) -> str | None:
    """The --key value; a repeated --key is refused (click keeps only the last one of an option given twice,
    so `--key net --key epoch` silently stripped `epoch` alone)."""
    if not keys:
        return None
    if len(keys) > 1:
        raise DoctorError(f"--key given {len(keys)} times ({', '.join(repr(k) for k in keys)}): give it once (one "
                          "state_dict, nested as a/b); without --key every state_dict in the checkpoint is used")
    return keys[0]


_TRUST_HELP = ("Allow classes outside torch.load(weights_only=True)'s allowlist. The file is still only read, never "
               "run, except by strip of a legacy (pre-1.6) pickle: that converts it through "
               "torch.load(weights_only=False), which runs it. Only for files whose source you trust.")


def inspect_cmd(
    path: str = typer.Argument(..., metavar="PATH", help="Checkpoint: a file (.pt/.pth torch zip or legacy, .safetensors), "
                               "a torch.distributed.checkpoint directory, or a shard set (directory or *.index.json)."),
    json_out: JsonOption = None,
    trust: bool = typer.Option(False, "--trust", help=_TRUST_HELP),
) -> None:
    """Format, where the state_dict(s) live, tensors, dtypes, wrapper prefixes, other entries, findings.

    Exit 0 when nothing is wrong (prefix warnings included), 1 when a finding fails (mixed keys).
    """
    plan = outputs.Plan("ckpt inspect")
    plan.reads("PATH", path)
    plan.json("--json", json_out)
    from ddpdoctor.ckpt import inspect_checkpoint, open_checkpoint, render_inspect

    rep = inspect_checkpoint(open_checkpoint(path, trust=trust))
    if json_out is not None:
        outputs.emit_json(json_out, rep.to_json(), "ckpt inspect")
    if not outputs.json_to_stdout(json_out):
        typer.echo(render_inspect(rep))
    if rep.status == "fail":
        raise typer.Exit(1)


def strip_cmd(
    path: str = typer.Argument(..., metavar="PATH", help="Checkpoint file, DCP directory or shard set to read (never "
                               "modified without --in-place)."),
    output: str = typer.Option(None, "-o", "--output", metavar="OUT", help="Where to write the stripped checkpoint: a "
                               "new file named like the input's format (.pt/.pth/.bin/.ckpt/.pth.tar/.pt.tar, .safetensors); "
                               "for a DCP directory a new directory, or one torch.save file if OUT ends in "
                               ".pt/.pth/.bin/.ckpt/.pth.tar/.pt.tar; "
                               "for a shard set a new directory."),
    prefix: list[str] = typer.Option(None, "--prefix", metavar="P", help="Wrapper to remove (repeatable); default: all of "
                                     "module. (at the start of keys), _orig_mod., _fsdp_wrapped_module., _fpw_module., "
                                     "_checkpoint_wrapped_module. (at any depth)."),
    key: list[str] = typer.Option(None, "--key", metavar="K", help="Only the state_dict at this entry (nested: "
                                  "a/b); once."),
    in_place: bool = typer.Option(False, "--in-place", help="Replace PATH itself (still atomic; a symlink's target "
                                  "is rewritten, the link kept; owner, group and mode kept)."),
    trust: bool = typer.Option(False, "--trust", help=_TRUST_HELP),
    json_out: JsonOption = None,
) -> None:
    """Remove wrapper prefixes from the state_dict keys; everything else is kept byte for byte.

    Tensor data is copied by the kernel, never loaded; OUT is written to a temp file (or directory) and renamed.
    """
    if output is not None and outputs.json_to_stdout(output):
        # Not a file named "-" in the current folder, which is what writing it would make.
        raise DoctorError("-o takes a file or directory name: strip writes a checkpoint, not to stdout "
                          "(- is for --json; ./- names a file called '-')")
    one_key = _one_key(key)
    plan = outputs.Plan("ckpt strip")
    plan.reads("PATH", path)
    plan.json("--json", json_out)
    from ddpdoctor.ckpt import strip_file

    # -o is checked against the plan once the input's format is known (a file, a DCP folder, a shard set),
    # before anything is written.
    rep = strip_file(path, output, prefixes=prefix or None, key=one_key, in_place=in_place, trust=trust, plan=plan)
    if json_out is not None:
        outputs.emit_json(json_out, rep.to_json(), "ckpt strip")
    if outputs.json_to_stdout(json_out):
        return
    for sd in rep.state_dicts:
        pre = ", ".join(f"{p['prefix']!r} from {p['keys']} keys" for p in sd["prefixes"]) or "nothing to remove"
        typer.echo(f"{sd['location']}: {pre}")
    if not rep.written:
        typer.echo(f"nothing to strip: {rep.path} left unchanged")
        return
    note = " (converted from the legacy format to the zip format)" if rep.converted_from_legacy else ""
    typer.echo(f"wrote {rep.output}: {rep.renamed_keys} keys renamed{note}")


def diff_cmd(
    path: str = typer.Argument(..., metavar="PATH", help="Checkpoint file, DCP directory or shard set."),
    model: str = typer.Option(..., "--model", metavar="MODULE:FACTORY", help="MODULE:FACTORY building the model, e.g. mypkg.net:build "
                              "(or path/to/file.py:build)."),
    key: list[str] = typer.Option(None, "--key", metavar="K", help="Compare the state_dict at this entry (nested: "
                                  "a/b); once."),
    trust: bool = typer.Option(False, "--trust", help=_TRUST_HELP),
    json_out: JsonOption = None,
) -> None:
    """Missing/unexpected keys and shape mismatches against a model, and the prefix change that fixes them.

    Exit 0 when the checkpoint loads with strict=True as is, 1 otherwise.
    """
    one_key = _one_key(key)
    plan = outputs.Plan("ckpt diff")
    plan.reads("PATH", path)
    plan.reads_code("--model", model)
    plan.json("--json", json_out)
    from ddpdoctor.ckpt import build_model_for_shapes, diff_against, open_checkpoint, render_diff

    checkpoint = open_checkpoint(path, trust=trust)
    net = build_model_for_shapes(model)
    rep = diff_against(checkpoint, net, one_key, model_spec=model)
    if json_out is not None:
        outputs.emit_json(json_out, rep.to_json(), "ckpt diff")
    if not outputs.json_to_stdout(json_out):
        typer.echo(render_diff(rep))
    if rep.status != "pass":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `ddpdoctor ckpt inspect|strip|diff` to the app."""
    sub = typer.Typer(
        name="ckpt",
        help="Find and remove wrapper prefixes (DDP, torch.compile, FSDP, activation checkpointing) in checkpoints, DCP "
             "directories and shard sets; explain key mismatches against a model.",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
    )
    sub.command("inspect")(inspect_cmd)
    sub.command("strip")(strip_cmd)
    sub.command("diff")(diff_cmd)
    app.add_typer(sub, name="ckpt")
