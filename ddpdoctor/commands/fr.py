"""`ddpdoctor fr PATH... [--prefix P] [--world-size N] [--json PATH]`: Flight Recorder dumps, the diverging rank.

Thin: typer's options in, :func:`ddpdoctor.fr.run_fr` out. Never imports torch.
"""

from __future__ import annotations

from typing import Optional

import typer

from ddpdoctor.commands.options import JsonOption


def fr(
    paths: list[str] = typer.Argument(..., metavar="PATH", help="Dump files or directories of dumps "
                                      "(TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>), and `ddpdoctor stacks --json` "
                                      "files to show each diverging rank's current stack."),
    prefix: Optional[str] = typer.Option(None, "--prefix", metavar="P", help="Dump file names are P<rank> "
                                         "(default: the number at the end of the name)."),
    world_size: Optional[int] = typer.Option(None, "--world-size", min=1, metavar="N",
                                             help="Ranks in the job, to name missing dumps of the last ranks."),
    json_path: JsonOption = None,
) -> None:
    """Read PyTorch Flight Recorder dumps; per process group, which rank diverged, in which collective, where."""
    from ddpdoctor.fr import FrOptions, run_fr

    raise typer.Exit(run_fr(FrOptions(list(paths), prefix, world_size, json_path)))


def register(app: typer.Typer) -> None:
    """Add `fr` to the app."""
    app.command("fr")(fr)
