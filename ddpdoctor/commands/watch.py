"""`ddpdoctor watch`: run a training script on N ranks, record its collectives, explain a hang."""

from __future__ import annotations

import sys

import typer

from ddpdoctor.errors import DoctorError
from ddpdoctor.fileio import validate_output_path


def register(app: typer.Typer) -> None:
    """Add ``watch``."""

    @app.command("watch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                            "allow_interspersed_args": False})
    def watch(
        ctx: typer.Context,
        script: str = typer.Argument(..., metavar="SCRIPT [ARGS]...",
                                     help="The training script; every argument after it goes to the script."),
        nproc: int | None = typer.Option(None, "--nproc", help="Local ranks to self-launch when no launcher is "
                                         "present (default: one per GPU, or 2 without GPUs)."),
        hang_timeout: float = typer.Option(300.0, "--hang-timeout", help="Seconds without collective progress "
                                           "on any rank (while one waits in a collective) that count as a hang."),
        json_path: str | None = typer.Option(None, "--json", help="Also write the outcome as JSON to this path."),
    ) -> None:
        """Run SCRIPT watched: on a hang or a collective mismatch, say which rank diverged, where."""
        from ddpdoctor.runtime import launcher
        from ddpdoctor.watch import supervisor as engine

        if nproc is not None and nproc < 1:
            raise DoctorError(f"--nproc must be at least 1, got: {nproc}")
        if not hang_timeout > 0:
            raise DoctorError(f"--hang-timeout must be a positive number of seconds, got: {hang_timeout}")
        engine.check_script(script)
        validate_output_path("--json", json_path)
        args = list(ctx.args)
        info = launcher.detect()
        if info.is_launched:
            if nproc is not None:
                print("ddpdoctor watch: --nproc is ignored under a launcher (it decides the ranks)", file=sys.stderr)
            raise typer.Exit(engine.run_under_launcher(info, script, args, hang_timeout, json_path))
        from ddpdoctor.runtime.selflaunch import default_nproc

        raise typer.Exit(engine.supervise(script, args, nproc or default_nproc(), hang_timeout, json_path))
