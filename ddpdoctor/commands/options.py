"""The options several commands share, declared once (``typing.Annotated`` aliases for typer).

``check``, ``bench`` and ``watch`` start local ranks the same way, so ``--nproc``, ``--backend``,
``--timeout`` and ``--master-port`` read the same everywhere (each command picks its own default); their
values are validated in one place, :func:`ddpdoctor.runtime.entry.validate_launch_options`. ``--json``
follows one convention on every command, implemented by :func:`ddpdoctor.outputs.emit_json`
under the output policy (:mod:`ddpdoctor.outputs`).
"""

from __future__ import annotations

import math
from typing import Annotated, Optional

import typer

from ddpdoctor.errors import DoctorError

NprocOption = Annotated[Optional[int], typer.Option(
    "--nproc", help="Local ranks to self-launch when no launcher is present (default: one per GPU, or 2 "
    "without GPUs).")]
BackendOption = Annotated[str, typer.Option("--backend", help="auto (NCCL with CUDA, else gloo), gloo or nccl.")]
TimeoutOption = Annotated[float, typer.Option(
    "--timeout", help="Seconds allowed for the rendezvous, for each check or collective call, and for "
    "collecting the results.")]
MasterPortOption = Annotated[Optional[int], typer.Option(
    "--master-port", help="Port of the self-launched job's MASTER_PORT (default: $MASTER_PORT, else a free one).")]
JsonOption = Annotated[Optional[str], typer.Option(
    "--json", metavar="PATH", help="Also write the result as JSON to PATH; - prints the JSON on stdout "
    "instead of the text report. PATH: a new .json file, or one this command wrote before (never an input).")]


def validate_min_busbw(min_busbw: float | None) -> None:
    """``--min-busbw`` (check, bench): a finite bandwidth >= 0; nan would never fail, inf always would."""
    if min_busbw is not None and not (math.isfinite(min_busbw) and min_busbw >= 0):
        raise DoctorError(f"--min-busbw must be a bandwidth in GB/s >= 0, got: {min_busbw:g}")
