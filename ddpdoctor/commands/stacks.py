"""`ddpdoctor stacks`: every rank's stack, grouped, the rank that is somewhere else named.

Thin: typer's options in, :func:`ddpdoctor.stacks.fastcli.run` out (everyday invocations skip typer
altogether, see :mod:`ddpdoctor.stacks.fastcli`). Never imports torch: it attaches to a job that is already stuck.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddpdoctor.fileio import validate_output_path
from ddpdoctor.stacks.fastcli import MAX_TIMEOUT, MIN_TIMEOUT, StacksOptions, finish, run

stacks_app = typer.Typer(
    help="Read every DDP rank's stack on this machine, group them, and name the odd rank out.",
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    rich_markup_mode=None,
)


def _finite(value: float) -> float:
    if value != value:  # NaN passes click's range check
        raise typer.BadParameter("is not a number of seconds")
    return value


@stacks_app.callback()
def stacks(
    ctx: typer.Context,
    pid: list[int] = typer.Option([], "--pid", "-p", metavar="PID", help="Dump this process (repeatable); default: all ranks found."),
    job: Optional[str] = typer.Option(None, "--job", metavar="ID", help="Only this job: torchrun run id, SLURM job id (or "
                                      "job.step), the torchrun agent's pid, or the job key ddpdoctor prints."),
    native: bool = typer.Option(False, "--native", help="Pass --native to py-spy (C/C++ frames too)."),
    all_threads: bool = typer.Option(False, "--all-threads", help="Show every thread, not just the main one."),
    json_path: Optional[Path] = typer.Option(None, "--json", metavar="PATH", readable=False,
                                             help="Also write the result as JSON to PATH."),
    signal_mode: bool = typer.Option(False, "--signal", help="No py-spy: signal ranks that called "
                                     "ddpdoctor.install_stack_dumps() and read their dumps."),
    stack_dir: Optional[Path] = typer.Option(None, "--stack-dir", metavar="DIR", help="Where --signal dumps live "
                                             "(default $DDPDOCTOR_STACK_DIR or /tmp/ddpdoctor-stacks-<uid>)."),
    timeout: float = typer.Option(30.0, "--timeout", min=MIN_TIMEOUT, max=MAX_TIMEOUT, callback=_finite,
                                  metavar="SECONDS", help="Seconds to wait for all dumps."),
) -> None:
    """Find the ranks (torchrun/SLURM environment), dump them in parallel, group by where they wait."""
    if ctx.invoked_subcommand is not None:
        return
    raise typer.Exit(run(StacksOptions(pid, job, native, all_threads, json_path, signal_mode, stack_dir, timeout)))


@stacks_app.command("merge")
def merge(
    files: list[Path] = typer.Argument(..., metavar="FILES", help="JSON files written by `ddpdoctor stacks --json` on each node."),
    all_threads: bool = typer.Option(False, "--all-threads", help="Show every thread, not just the main one."),
    json_path: Optional[Path] = typer.Option(None, "--json", metavar="PATH", help="Write the merged result as JSON to PATH."),
) -> None:
    """Group the stacks of several nodes' JSON files as one job."""
    from ddpdoctor.stacks.report import load_json_files

    validate_output_path("--json", json_path)
    processes, source = load_json_files(files)
    raise typer.Exit(finish(processes, source, json_path, all_threads))


def register(app: typer.Typer) -> None:
    """Add `stacks` (and `stacks merge`) to the app."""
    app.add_typer(stacks_app, name="stacks")
