"""`ddpdoctor check`: run the checks on every rank; rank 0 prints one report."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Optional

import typer

from ddpdoctor.commands.options import (
    BackendOption,
    JsonOption,
    LocalRanksFilterOption,
    LogDirOption,
    MasterPortOption,
    NprocOption,
    RedirectsOption,
    TeeOption,
    TimeoutOption,
    launch_logs,
    validate_min_busbw,
)
from ddpdoctor.errors import DoctorError

if TYPE_CHECKING:
    from ddpdoctor.check import Check

# The check ids --only/--skip take, in registry order, written out so `check --help` needs no import of the
# checks (tests/test_docs.py keeps it equal to ddpdoctor.checks.CHECK_IDS and docs/checks.md).
CHECK_IDS_HELP = ("env, gpu, port, barrier, connectivity, bandwidth, pcie_bandwidth, memory_bandwidth, unused_params, "
                  "state_dict")


def _split_ids(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def select_checks(only: list[str], skip: list[str]) -> list[Check]:
    """The checks to run, in registry order; DoctorError for an unknown id."""
    from ddpdoctor.checks import ALL_CHECKS, CHECK_IDS

    wanted, unwanted = _split_ids(only), _split_ids(skip)
    for flag, given, ids in (("--only", only, wanted), ("--skip", skip, unwanted)):
        if given and not ids:  # `--only ''` (an unset shell variable) ran every check
            raise DoctorError(f"{flag} names no check id; known: {', '.join(CHECK_IDS)}")
    for check_id in wanted + unwanted:
        if check_id not in CHECK_IDS:
            raise DoctorError(f"unknown check id {check_id!r}; known: {', '.join(CHECK_IDS)}")
    return [c for c in ALL_CHECKS if (not wanted or c.id in wanted) and c.id not in unwanted]


def check(
    nproc: NprocOption = None,
    backend: BackendOption = "auto",
    timeout: TimeoutOption = 30.0,
    only: list[str] = typer.Option([], "--only", metavar="IDS", help="Run only these checks (repeat or comma-separate): "
                                   f"{CHECK_IDS_HELP}."),
    skip: list[str] = typer.Option([], "--skip", metavar="IDS", help="Skip these checks (repeat or comma-separate): "
                                   f"{CHECK_IDS_HELP}."),
    json_path: JsonOption = None,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show every finding's details."),
    master_port: MasterPortOption = None,
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="state_dict check: a checkpoint file."),
    model: Optional[str] = typer.Option(None, "--model", help="MODULE:FACTORY building the model "
                                        "(unused_params, state_dict)."),
    batch: Optional[str] = typer.Option(None, "--batch", help="MODULE:FN returning an input batch (unused_params)."),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", help="Random input batch shape, e.g. 4,16."),
    min_busbw: Optional[float] = typer.Option(None, "--min-busbw", help="bandwidth check: fail below this GB/s."),
    min_busbw_pct: Optional[float] = typer.Option(None, "--min-busbw-pct", help="bandwidth checks: fail below this "
                                                  "% of the expected figure of the path (default 50)."),
    warn_busbw_pct: Optional[float] = typer.Option(None, "--warn-busbw-pct", help="bandwidth checks: warn below "
                                                   "this % of the expected figure (default 80)."),
    log_dir: LogDirOption = None,
    redirects: RedirectsOption = "0",
    tee: TeeOption = "0",
    local_ranks_filter: LocalRanksFilterOption = "",
) -> None:
    """Check connectivity, ports, env consistency and more on every rank; one report from rank 0."""
    from ddpdoctor.check import CheckOptions, RunConfig, run_rank
    from ddpdoctor.cli import invocation_args
    from ddpdoctor.modelspec import parse_shape
    from ddpdoctor.outputs import LOG_FOLDER, Plan
    from ddpdoctor.runtime.entry import run_here_or_self_launch, validate_launch_options

    validate_launch_options(nproc, backend, master_port, timeout)
    plan = Plan("check")
    plan.reads("--checkpoint", checkpoint)
    plan.reads_code("--model", model)
    plan.reads_code("--batch", batch)
    plan.json("--json", json_path)
    plan.folder("--log-dir", log_dir, LOG_FOLDER)
    logs = launch_logs(log_dir, redirects, tee, local_ranks_filter, nproc)
    validate_min_busbw(min_busbw)
    from ddpdoctor.bench import thresholds_from_options

    thresholds = thresholds_from_options(min_busbw_pct, warn_busbw_pct)
    if checkpoint is not None and not os.path.exists(checkpoint):
        raise DoctorError(f"--checkpoint {checkpoint!r}: no such file")
    checks = select_checks(only, skip)
    if not checks:
        raise DoctorError("--only/--skip leave no check to run")
    shape = parse_shape(input_shape)  # a malformed shape is named as such first
    if not model and (batch or input_shape):
        given = "--batch" if batch else "--input-shape"
        raise DoctorError(f"{given} is an input for --model's model: give --model MODULE:FACTORY too "
                          "(the unused_params and state_dict checks build it)")
    if (model and not (batch or input_shape or checkpoint)
            and any(c.id == "unused_params" for c in checks)):
        raise DoctorError("--model needs an input for the unused_params check: give --batch MODULE:FN or "
                          "--input-shape 4,16 (or --skip unused_params)")
    options = CheckOptions(timeout_s=timeout, checkpoint=checkpoint, model=model, batch=batch,
                           input_shape=shape, min_busbw_gbps=min_busbw,
                           min_busbw_pct=thresholds.fail_pct, warn_busbw_pct=thresholds.warn_pct, verbose=verbose)
    config = RunConfig(checks=checks, backend=backend, options=options, json_path=json_path)
    raise typer.Exit(run_here_or_self_launch(
        functools.partial(run_rank, config=config), argv=invocation_args(), nproc=nproc, backend=backend,
        master_port=master_port, timeout=timeout, logs=logs))


def register(app: typer.Typer) -> None:
    """Add ``check``."""
    app.command("check")(check)
