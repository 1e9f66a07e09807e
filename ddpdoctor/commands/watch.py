"""`ddpdoctor watch`: run a training script on N ranks, record its collectives and their completion, explain a hang."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from ddpdoctor.commands.options import (
    JsonOption,
    LocalRanksFilterOption,
    LogDirOption,
    MasterPortOption,
    NprocOption,
    RedirectsOption,
    TeeOption,
)
from ddpdoctor.errors import DoctorError
from ddpdoctor.outputs import LOG_FOLDER, Plan, json_to_stdout


def watch(
    ctx: typer.Context,
    script: str = typer.Argument(..., metavar="SCRIPT [ARGS]...",
                                 help="The training script; every argument after it goes to the script."),
    nproc: NprocOption = None,
    master_port: MasterPortOption = None,
    hang_timeout: float = typer.Option(300.0, "--hang-timeout", metavar="SEC", help="Seconds without progress "
                                       "on any rank (no collective completing, no optimizer step, no DDP "
                                       "backward ending) that stop the job with a report of where each rank "
                                       "waits."),
    json_path: JsonOption = None,
    evidence_dir: str = typer.Option(None, "--evidence", metavar="DIR", help="On a hang, mismatch or crash, "
                                     "write the evidence bundle here, a new or empty folder (stacks, collective "
                                     "histories, Flight Recorder dumps, the ranks' last output, env, verdict.json); "
                                     "default: a new "
                                     "folder in the temporary directory, named in the report."),
    launch: str = typer.Option("auto", "--launch", help="auto: recognise a script that starts its own ranks "
                               "(mp.spawn, a Process per rank) from its source; ranks: start --nproc copies of "
                               "it (the torchrun way); script: run it once and watch every process it starts."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the verdict: no rank output on the console "
                               "and no notes while the job runs (--log-dir files still get the output)."),
    shutdown_timeout: Optional[float] = typer.Option(
        None, "--shutdown-timeout", "--shutdown_timeout", metavar="SEC", help="As torchrun's: seconds between "
        "SIGTERM and SIGKILL when the job is stopped (default: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)."),
    log_dir: LogDirOption = None,
    redirects: RedirectsOption = "0",
    tee: TeeOption = "0",
    local_ranks_filter: LocalRanksFilterOption = "",
) -> None:
    """Run SCRIPT watched: when no rank makes progress or ranks issue mismatched collectives, say where each rank
    waits and which one diverged, at which line."""
    from ddpdoctor.runtime import launcher
    from ddpdoctor.runtime.entry import validate_launch_options
    from ddpdoctor.watch import (
        MIN_HANG_TIMEOUT_S,
        OutputOptions,
        WatchConfig,
        check_script,
        parse_ranks_filter,
        parse_std,
        run_under_launcher,
        shutdown_timeout_s,
        spawn_sites,
        supervise,
        validate_evidence,
    )

    refuse_unknown_option(ctx, script)
    validate_launch_options(nproc, master_port=master_port)
    if not hang_timeout >= MIN_HANG_TIMEOUT_S:  # also NaN
        raise DoctorError(f"--hang-timeout must be at least {MIN_HANG_TIMEOUT_S:g} s (the ranks report their "
                          f"progress every 0.1 s), got: {hang_timeout:g}")
    check_script(script)
    plan = Plan("watch")
    plan.reads("SCRIPT", script)
    plan.json("--json", json_path)
    validate_evidence(evidence_dir, plan)
    plan.folder("--log-dir", log_dir, LOG_FOLDER)
    if launch not in ("auto", "ranks", "script"):
        raise DoctorError(f"--launch must be auto, ranks or script, got: {launch!r}")
    output = OutputOptions(quiet=quiet, json_on_stdout=json_to_stdout(json_path), log_dir=log_dir,
                           redirects=parse_std("--redirects", redirects), tee=parse_std("--tee", tee),
                           ranks_filter=parse_ranks_filter(local_ranks_filter))
    output.validate()
    config = WatchConfig(script=script, args=list(ctx.args), hang_timeout_s=hang_timeout, json_path=json_path,
                         master_port=master_port, evidence_dir=evidence_dir, grace_s=shutdown_timeout_s(shutdown_timeout),
                         quiet=quiet, output=output)
    info = launcher.detect()
    if info.is_launched:
        ignored = [name for name, given in (("--nproc", nproc is not None), ("--master-port", master_port is not None),
                                            ("--log-dir", log_dir is not None), ("--redirects", redirects != "0"),
                                            ("--tee", tee != "0"), ("--local-ranks-filter", bool(local_ranks_filter)),
                                            ("--shutdown-timeout", shutdown_timeout is not None)) if given]
        if ignored and not quiet:
            print(f"ddpdoctor watch: {'/'.join(ignored)} ignored under a launcher (it decides the ranks, the port, "
                  "their output and their shutdown)", file=sys.stderr)
        raise typer.Exit(run_under_launcher(info, config))
    from ddpdoctor.runtime.selflaunch import default_nproc

    sites = spawn_sites(script) if launch == "auto" else (["--launch script"] if launch == "script" else [])
    if sites and not quiet:
        # Started N times, such a script would start N x N ranks fighting over one MASTER_PORT.
        print(f"ddpdoctor watch: the script starts its own ranks ({sites[0]}): running it once and watching "
              "every process it starts" + ("; --nproc is ignored" if nproc is not None else ""), file=sys.stderr)
    config.nproc = nproc or default_nproc()
    config.spawns = bool(sites)
    raise typer.Exit(supervise(config))


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
                      if opt.startswith("--") and "_" not in opt})  # torchrun's --log_dir spellings: once
    close = difflib.get_close_matches(name, options, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise DoctorError(f"no such option for watch: {name}{hint} (watch's options: {', '.join(options)}; they go "
                      "before the script path)")


def register(app: typer.Typer) -> None:
    """Add ``watch``."""
    app.command("watch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                           "allow_interspersed_args": False})(watch)
