"""`ddpdoctor stacks`: every rank's stack, grouped, the rank that is somewhere else named.

Thin: typer's options in, :func:`ddpdoctor.stacks.run_stacks` / :func:`~ddpdoctor.stacks.merge_stacks` out. Never imports torch: it attaches to a job
that is already stuck.
"""

from __future__ import annotations

from typing import Optional

import typer

from ddpdoctor.commands.options import JsonOption
from ddpdoctor.errors import DoctorError

MIN_TIMEOUT = 0.1
MAX_TIMEOUT = 86400.0  # a day: every wait has a deadline


def _finite(value: float) -> float:
    if value != value:  # NaN passes click's range check
        raise typer.BadParameter("is not a number of seconds")
    return value


def _text(path: Optional[str], option: str) -> Optional[str]:
    """A path option as given. Taken as text, not as typer's Path: ``Path("")`` is ``"."``, so an unset shell
    variable (``--stack-dir "$DIR"``) read as the current folder."""
    if path == "":
        raise DoctorError(f"{option} is an empty path (''): give a folder (an unset shell variable?)")
    return path


def stacks(
    ctx: typer.Context,
    # max: Linux's PID_MAX_LIMIT (include/linux/threads.h, 2**22 on 64-bit): a longer number is a typo,
    # whatever PYTHONINTMAXSTRDIGITS lets int() parse.
    pid: list[int] = typer.Option([], "--pid", "-p", metavar="PID", min=1, max=1 << 22,
                                  help="Dump this process (repeatable); default: all ranks found."),
    job: Optional[str] = typer.Option(None, "--job", metavar="ID", help="Only this job: torchrun run id, SLURM job id (or "
                                      "job.step), the torchrun agent's pid, or the job key ddpdoctor prints."),
    native: bool = typer.Option(False, "--native", help="Pass --native to py-spy (C/C++ frames too)."),
    locals_level: int = typer.Option(0, "--locals", "-l", count=True, help="Pass --locals to py-spy: each frame's "
                                     "local variables (repeat, -ll, for more detail, as py-spy)."),
    nonblocking: bool = typer.Option(False, "--nonblocking", help="Pass --nonblocking to py-spy: read the ranks "
                                     "without pausing them (less intrusive; a stack may be torn)."),
    all_threads: bool = typer.Option(False, "--all-threads", help="Show every thread, not just the main one."),
    json_path: JsonOption = None,
    signal_mode: bool = typer.Option(False, "--signal", help="No py-spy: signal ranks that called "
                                     "ddpdoctor.install_stack_dumps() and read their dumps."),
    stack_dir: Optional[str] = typer.Option(None, "--stack-dir", metavar="DIR", help="Where --signal dumps live "
                                             "(default $DDPDOCTOR_STACK_DIR or /tmp/ddpdoctor-stacks-<uid>)."),
    timeout: float = typer.Option(30.0, "--timeout", min=MIN_TIMEOUT, max=MAX_TIMEOUT, callback=_finite,
                                  metavar="SECONDS", help="Seconds to wait for all dumps."),
) -> None:
    """Find the ranks (torchrun/SLURM environment), dump them in parallel with py-spy, group by where they wait."""
    if ctx.invoked_subcommand is not None:
        return
    from ddpdoctor.stacks import StacksOptions, run_stacks

    raise typer.Exit(run_stacks(StacksOptions(list(pid), job, native, all_threads, json_path, signal_mode,
                                              _text(stack_dir, "--stack-dir"), timeout, locals_level=locals_level,
                                              nonblocking=nonblocking)))


def merge(
    files: list[str] = typer.Argument(..., metavar="FILES", help="JSON files written by `ddpdoctor stacks --json` on each node."),
    all_threads: bool = typer.Option(False, "--all-threads", help="Show every thread, not just the main one."),
    json_path: JsonOption = None,
) -> None:
    """Group the stacks of several nodes' JSON files as one job."""
    from ddpdoctor.stacks import merge_stacks

    if "" in files:  # as text: typer's Path("") would be the current folder
        raise DoctorError("FILES holds an empty path (''): give the JSON files (an unset shell variable?)")
    raise typer.Exit(merge_stacks(files, all_threads, json_path))


def register(app: typer.Typer) -> None:
    """Add `stacks` (and `stacks merge`) to the app."""
    sub = typer.Typer(help="Read every DDP rank's stack on this machine, group them, and name the odd rank out.",
                      no_args_is_help=False, add_completion=False, rich_markup_mode=None)
    sub.callback(invoke_without_command=True)(stacks)
    sub.command("merge")(merge)
    app.add_typer(sub, name="stacks")
