"""The options several commands share, declared once (``typing.Annotated`` aliases for typer).

``check``, ``bench`` and ``watch`` start local ranks the same way, so ``--nproc``, ``--backend``,
``--timeout`` and ``--master-port`` read the same everywhere (each command picks its own default); their
values are validated in one place, :func:`ddpdoctor.runtime.entry.validate_launch_options`. ``--json``
follows one convention on every command, implemented by :func:`ddpdoctor.outputs.emit_json`
under the output policy (:mod:`ddpdoctor.outputs`).

Self-launched ranks follow torchrun's conventions, with torchrun's names and meanings
(``torch/distributed/run.py``): ``--nproc-per-node``/``--nproc_per_node`` are spellings of ``--nproc``, and
``--log-dir``, ``--redirects``, ``--tee`` and ``--local-ranks-filter`` (each also with underscores) say where
the ranks' output goes (:class:`ddpdoctor.runtime.selflaunch.LaunchLogs`). torchrun's short ``-r``/``-t``
are left out: ``bench`` keeps nccl-tests' ``-r`` (root) and ``-t`` (threads).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ddpdoctor.errors import DoctorError

if TYPE_CHECKING:  # imported where used: every command loads this module, only launching ones need it
    from ddpdoctor.runtime.selflaunch import LaunchLogs

NprocOption = Annotated[Optional[int], typer.Option(
    "--nproc", "--nproc-per-node", "--nproc_per_node", metavar="N", help="Local ranks to self-launch when no launcher is "
    "present (default: one per GPU, or 2 without GPUs); torchrun's --nproc-per-node spellings work too.")]
BackendOption = Annotated[str, typer.Option("--backend", help="auto (NCCL with CUDA, else gloo), gloo or nccl.")]
TimeoutOption = Annotated[float, typer.Option(
    "--timeout", help="Seconds allowed for the rendezvous, for each check or collective call, and for "
    "collecting the results.")]
MasterPortOption = Annotated[Optional[int], typer.Option(
    "--master-port", help="Port of the self-launched job's MASTER_PORT (default: $MASTER_PORT, else a free one).")]
LogDirOption = Annotated[Optional[str], typer.Option(
    "--log-dir", "--log_dir", metavar="DIR", help="As torchrun: base directory for the self-launched ranks' "
    "log files (DIR/<run id>_*/attempt_0/<local rank>/stdout.log, stderr.log); created if missing.")]
RedirectsOption = Annotated[str, typer.Option(
    "--redirects", metavar="STD", help="As torchrun's -r: send the ranks' "
    "streams to the log files only: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank (0:3,1:2).")]
TeeOption = Annotated[str, typer.Option(
    "--tee", metavar="STD", help="As torchrun's -t: copy the ranks' streams to the log files and still show "
    "them: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank (0:3,1:2).")]
LocalRanksFilterOption = Annotated[str, typer.Option(
    "--local-ranks-filter", "--local_ranks_filter", metavar="RANKS", help="As torchrun: only these local "
    "ranks' output reaches the console (e.g. 0 or 0,1); the log files keep everything.")]
JsonOption = Annotated[Optional[str], typer.Option(
    "--json", metavar="PATH", help="Also write the result as JSON to PATH; - prints the JSON on stdout "
    "instead of the text report. PATH: a new .json file, or one this command wrote before (never an input).")]


def validate_min_busbw(min_busbw: float | None) -> None:
    """``--min-busbw`` (check, bench): a finite bandwidth >= 0; nan would never fail, inf always would."""
    if min_busbw is not None and not (math.isfinite(min_busbw) and min_busbw >= 0):
        raise DoctorError(f"--min-busbw must be a bandwidth in GB/s >= 0, got: {min_busbw:g}")


def launch_logs(log_dir: str | None, redirects: str, tee: str, local_ranks_filter: str,
                nproc: int | None = None) -> LaunchLogs:
    """torchrun's log options -> the self-launch's :class:`LaunchLogs`, validated (exit 2, one line)."""
    from ddpdoctor.runtime.selflaunch import LaunchLogs
    logs = LaunchLogs(log_dir=log_dir, redirects=redirects.strip(), tee=tee.strip(),
                      local_ranks_filter=local_ranks_filter.strip())
    logs.validate(nproc)
    return logs
