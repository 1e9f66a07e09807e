"""`ddpdoctor watch`: run a training script on N ranks, record its collectives, explain a hang."""

from __future__ import annotations

import sys

import typer

from ddpdoctor.commands.options import JsonOption, MasterPortOption, NprocOption
from ddpdoctor.errors import DoctorError
from ddpdoctor.fileio import validate_output_path


def watch(
    ctx: typer.Context,
    script: str = typer.Argument(..., metavar="SCRIPT [ARGS]...",
                                 help="The training script; every argument after it goes to the script."),
    nproc: NprocOption = None,
    master_port: MasterPortOption = None,
    hang_timeout: float = typer.Option(300.0, "--hang-timeout", help="Seconds without collective progress "
                                       "on any rank (while one waits in a collective) that count as a hang."),
    json_path: JsonOption = None,
    evidence_dir: str = typer.Option(None, "--evidence", metavar="DIR", help="On a hang, mismatch or crash, "
                                     "write the evidence bundle here (stacks, collective histories, Flight "
                                     "Recorder dumps, env, verdict.json); default: a new folder in the "
                                     "temporary directory, named in the report."),
    launch: str = typer.Option("auto", "--launch", help="auto: recognise a script that starts its own ranks "
                               "(mp.spawn, a Process per rank) from its source; ranks: start --nproc copies of "
                               "it (the torchrun way); script: run it once and watch every process it starts."),
) -> None:
    """Run SCRIPT watched: on a hang or a collective mismatch, say which rank diverged, where."""
    from ddpdoctor.runtime import launcher
    from ddpdoctor.runtime.entry import validate_launch_options
    from ddpdoctor.watch import (
        check_script,
        run_under_launcher,
        spawn_sites,
        supervise,
        validate_evidence,
    )

    refuse_unknown_option(ctx, script)
    validate_launch_options(nproc, master_port=master_port)
    if not hang_timeout > 0:
        raise DoctorError(f"--hang-timeout must be a positive number of seconds, got: {hang_timeout}")
    check_script(script)
    validate_output_path("--json", json_path)
    validate_evidence(evidence_dir)
    if launch not in ("auto", "ranks", "script"):
        raise DoctorError(f"--launch must be auto, ranks or script, got: {launch!r}")
    args = list(ctx.args)
    info = launcher.detect()
    if info.is_launched:
        if nproc is not None or master_port is not None:
            print("ddpdoctor watch: --nproc/--master-port are ignored under a launcher (it decides the ranks "
                  "and the port)", file=sys.stderr)
        raise typer.Exit(run_under_launcher(info, script, args, hang_timeout, json_path, evidence_dir))
    from ddpdoctor.runtime.selflaunch import default_nproc

    sites = spawn_sites(script) if launch == "auto" else (["--launch script"] if launch == "script" else [])
    if sites:
        # Started N times, such a script would start N x N ranks fighting over one MASTER_PORT.
        print(f"ddpdoctor watch: the script starts its own ranks ({sites[0]}): running it once and watching "
              "every process it starts" + ("; --nproc is ignored" if nproc is not None else ""), file=sys.stderr)
    raise typer.Exit(supervise(script, args, nproc or default_nproc(), hang_timeout, json_path, master_port,
                               evidence_dir, spawns=bool(sites)))


def refuse_unknown_option(ctx: typer.Context, script: str) -> None:
    """``watch --timeout 5 x.py``: everything from the first non-option is the script's, so an option watch
    does not have lands in SCRIPT. Name it as the unknown option it is, with the options watch has (a file
    really named ``-x.py`` still runs)."""
    import difflib
    import os

    if not script.startswith("-") or os.path.exists(script):
        return
    name = script.split("=", 1)[0]
    options = sorted({opt for param in ctx.command.params for opt in getattr(param, "opts", ())
                      if opt.startswith("--")})
    close = difflib.get_close_matches(name, options, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise DoctorError(f"no such option for watch: {name}{hint} (watch's options: {', '.join(options)}; they go "
                      "before the script path)")


def register(app: typer.Typer) -> None:
    """Add ``watch``."""
    app.command("watch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                           "allow_interspersed_args": False})(watch)
