"""`ddpdoctor stacks`: every rank's stack, grouped, the rank that is somewhere else named.

Thin: options in, engine (:mod:`ddpdoctor.stacks`, :mod:`ddpdoctor.stacks_signal`,
:mod:`ddpdoctor.stacks_report`) out. Never imports torch: it attaches to a job that is already stuck.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from ddpdoctor.errors import EXIT_OK, EXIT_PROBLEM, DoctorError
from ddpdoctor.fileio import validate_output_path, write_json_atomic

if TYPE_CHECKING:
    from ddpdoctor.stacks_report import ProcessStacks

stacks_app = typer.Typer(
    help="Dump every DDP rank's stack on this machine (py-spy), group them, and name the odd rank out.",
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    rich_markup_mode=None,
)


def _finish(processes: list[ProcessStacks], source: str, json_path: Optional[Path], all_threads: bool) -> None:
    """Group, print, write JSON, and exit 1 when the ranks disagree or could not all be seen."""
    from ddpdoctor.stacks_report import analyze, render_text, to_json

    reports = analyze(processes)
    typer.echo(render_text(reports, all_threads=all_threads, source=source), nl=False)
    if json_path is not None:
        try:
            write_json_atomic(json_path, to_json(processes, reports, source))
        except OSError as exc:
            raise DoctorError(f"cannot write --json {json_path}: {exc.strerror or exc}") from exc
        typer.echo(f"wrote {json_path}")
    raise typer.Exit(EXIT_PROBLEM if any(r.problem for r in reports) else EXIT_OK)


@stacks_app.callback()
def stacks(
    ctx: typer.Context,
    pid: list[int] = typer.Option([], "--pid", "-p", metavar="PID", help="Dump this process (repeatable); default: all ranks found."),
    job: Optional[str] = typer.Option(None, "--job", metavar="ID", help="Only this job: torchrun run id, SLURM job id (or "
                                      "job.step), the torchrun agent's pid, or the job key ddpdoctor prints."),
    native: bool = typer.Option(False, "--native", help="Pass --native to py-spy (C/C++ frames too)."),
    all_threads: bool = typer.Option(False, "--all-threads", help="Show every thread, not just the main one."),
    json_path: Optional[Path] = typer.Option(None, "--json", metavar="PATH", help="Also write the result as JSON to PATH."),
    signal_mode: bool = typer.Option(False, "--signal", help="No py-spy: signal ranks that called "
                                     "ddpdoctor.install_stack_dumps() and read their dumps."),
    stack_dir: Optional[Path] = typer.Option(None, "--stack-dir", metavar="DIR", help="Where --signal dumps live "
                                             "(default $DDPDOCTOR_STACK_DIR or /tmp/ddpdoctor-stacks-<uid>)."),
    timeout: float = typer.Option(30.0, "--timeout", min=0.1, metavar="SECONDS", help="Seconds to wait for all dumps."),
) -> None:
    """Find the ranks (torchrun/SLURM environment), dump them in parallel, group by where they wait."""
    if ctx.invoked_subcommand is not None:
        return
    validate_output_path("--json", json_path)
    if signal_mode:
        if native:
            raise DoctorError("--native needs py-spy; --signal dumps only Python frames (drop one of them)")
        from ddpdoctor.stacks_signal import collect

        _finish(collect(pid, job, stack_dir, timeout), "signal", json_path, all_threads)
    from ddpdoctor.stacks import discover, dump_all

    cands = discover(pid, job)
    if not cands:
        where = f" of job {job}" if job else ""
        raise DoctorError(f"no DDP rank processes{where} found on this machine (looked for RANK/LOCAL_RANK "
                          "with TORCHELASTIC_RUN_ID or SLURM step ids, and children of torchrun); pass "
                          "--pid PID, or run as the job's user or root to read other users' processes")
    dumped = dump_all(cands, native=native, timeout=timeout, thread_names=all_threads)
    _finish(dumped.processes, dumped.source, json_path, all_threads)


@stacks_app.command("merge")
def merge(
    files: list[Path] = typer.Argument(..., metavar="FILES", help="JSON files written by `ddpdoctor stacks --json` on each node."),
    all_threads: bool = typer.Option(False, "--all-threads", help="Show every thread, not just the main one."),
    json_path: Optional[Path] = typer.Option(None, "--json", metavar="PATH", help="Write the merged result as JSON to PATH."),
) -> None:
    """Group the stacks of several nodes' JSON files as one job."""
    from ddpdoctor.stacks_report import load_json_files

    validate_output_path("--json", json_path)
    processes, source = load_json_files(files)
    _finish(processes, source, json_path, all_threads)


def register(app: typer.Typer) -> None:
    """Add `stacks` (and `stacks merge`) to the app."""
    app.add_typer(stacks_app, name="stacks")
