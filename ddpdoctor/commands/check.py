"""`ddpdoctor check`: run the checks on every rank; rank 0 prints one report."""

from __future__ import annotations

import functools
import os
import re
from typing import TYPE_CHECKING

import typer

from ddpdoctor.errors import DoctorError

if TYPE_CHECKING:
    from ddpdoctor.check.api import Check

def _split_ids(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """'4,16' -> (4, 16); DoctorError on anything else."""
    if text is None:
        return None
    parts = [part.strip() for part in re.split(r"[,x]", text)]
    shape = tuple(int(part) for part in parts) if all(part.isdigit() for part in parts) else ()
    if not shape or any(dim <= 0 for dim in shape):
        raise DoctorError(f"--input-shape takes positive sizes like 4,16 or 8x3x32x32, got: {text!r}")
    return shape


def select_checks(only: list[str], skip: list[str]) -> list[Check]:
    """The checks to run, in registry order; DoctorError for an unknown id."""
    from ddpdoctor.checks import ALL_CHECKS, CHECK_IDS

    wanted, unwanted = _split_ids(only), _split_ids(skip)
    for check_id in wanted + unwanted:
        if check_id not in CHECK_IDS:
            raise DoctorError(f"unknown check id {check_id!r}; known: {', '.join(CHECK_IDS)}")
    return [c for c in ALL_CHECKS if (not wanted or c.id in wanted) and c.id not in unwanted]


def register(app: typer.Typer) -> None:
    """Add ``check``."""

    @app.command("check")
    def check(
        nproc: int | None = typer.Option(None, "--nproc", help="Local ranks to self-launch when no launcher "
                                         "is present (default: one per GPU, or 2 without GPUs)."),
        backend: str = typer.Option("auto", "--backend", help="auto (NCCL with CUDA, else gloo), gloo or nccl."),
        timeout: float = typer.Option(30.0, "--timeout", help="Seconds allowed for rendezvous, for each check "
                                      "and for collecting the results."),
        only: list[str] = typer.Option([], "--only", help="Run only these check ids (repeat or comma-separate)."),
        skip: list[str] = typer.Option([], "--skip", help="Skip these check ids (repeat or comma-separate)."),
        json_path: str | None = typer.Option(None, "--json", help="Also write the report as JSON to this path."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show every finding's details."),
        master_port: int | None = typer.Option(None, "--master-port", help="Port for self-launch "
                                               "(default: $MASTER_PORT, else a free one)."),
        checkpoint: str | None = typer.Option(None, "--checkpoint", help="state_dict check: a checkpoint file."),
        model: str | None = typer.Option(None, "--model", help="MODULE:FACTORY building the model "
                                         "(unused_params, state_dict)."),
        batch: str | None = typer.Option(None, "--batch", help="MODULE:FN returning an input batch (unused_params)."),
        input_shape: str | None = typer.Option(None, "--input-shape", help="Random input batch shape, e.g. 4,16."),
        min_busbw: float | None = typer.Option(None, "--min-busbw", help="bandwidth check: fail below this GB/s."),
    ) -> None:
        """Check connectivity, ports, env consistency and more on every rank; one report from rank 0."""
        from ddpdoctor.check.api import CheckOptions
        from ddpdoctor.check.runner import RunConfig, run_rank
        from ddpdoctor.cli import invocation_args
        from ddpdoctor.fileio import validate_output_path
        from ddpdoctor.runtime.entry import run_here_or_self_launch, validate_launch_options

        validate_launch_options(nproc, backend, master_port, timeout)
        validate_output_path("--json", json_path)
        if checkpoint is not None and not os.path.exists(checkpoint):
            raise DoctorError(f"--checkpoint {checkpoint!r}: no such file")
        checks = select_checks(only, skip)
        if not checks:
            raise DoctorError("--only/--skip leave no check to run")
        if (model and not (batch or input_shape or checkpoint)
                and any(c.id == "unused_params" for c in checks)):
            raise DoctorError("--model needs an input for the unused_params check: give --batch MODULE:FN or "
                              "--input-shape 4,16 (or --skip unused_params)")
        options = CheckOptions(timeout_s=timeout, checkpoint=checkpoint, model=model, batch=batch,
                               input_shape=parse_shape(input_shape), min_busbw_gbps=min_busbw, verbose=verbose)
        config = RunConfig(checks=checks, backend=backend, options=options, json_path=json_path)
        raise typer.Exit(run_here_or_self_launch(
            functools.partial(run_rank, config=config), argv=invocation_args(), nproc=nproc, backend=backend,
            master_port=master_port, timeout=timeout))
