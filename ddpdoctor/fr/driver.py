"""The ``fr`` command as a function of its options: read, analyse, print, exit code."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ddpdoctor.errors import EXIT_OK, EXIT_PROBLEM, DoctorError
from ddpdoctor.fr.analyze import analyze
from ddpdoctor.fr.load import collect_inputs, read_all, read_stacks
from ddpdoctor.fr.model import MAX_RANK, CallTable, FrReport, Unreadable
from ddpdoctor.fr.report import render_text, to_json
from ddpdoctor.outputs import Plan, emit_json, json_to_stdout


@dataclass(frozen=True)
class FrOptions:
    """``ddpdoctor fr PATH... [--prefix P] [--world-size N] [--json PATH]``."""

    paths: Sequence[str]
    prefix: str | None = None
    world_size: int | None = None
    json_path: str | None = None


def check_world_size(world_size: int | None) -> None:
    """Refuse a ``--world-size`` no job can have, as the option it is, before any dump is read.

    Checked here, before the analysis, so that the bound is never blamed on the dumps: the analysis bounds
    the ranks the dumps name too (a damaged file or name), and says so as "a dump names rank N"."""
    if world_size is None:
        return
    if world_size < 1:
        raise DoctorError(f"--world-size must be at least 1, got: {world_size}")
    if world_size > MAX_RANK:
        raise DoctorError(f"--world-size {world_size}: more ranks than any job has (at most {MAX_RANK})")


def diagnose(paths: Sequence[str], prefix: str | None = None, world_size: int | None = None) -> FrReport:
    """The verdict for dump files/directories (and ``stacks --json`` files among them); DoctorError on bad input.

    The entry point for other commands (``watch`` after it has written each rank's dump).
    """
    check_world_size(world_size)
    inputs = collect_inputs(paths, prefix)
    table = CallTable()
    unreadable: list[Unreadable] = []
    dumps = read_all(inputs, table, unreadable)
    if not dumps:  # nothing to judge: each file given is damaged or foreign (the first three named, with why)
        named = "; ".join(f"{u.path}: {u.why}" for u in unreadable[:3])
        more = f" (and {len(unreadable) - 3} more)" if len(unreadable) > 3 else ""
        raise DoctorError(f"no readable Flight Recorder dump: {named}{more}")
    highest = max(rank for rank, _ in inputs.dumps)
    if world_size is not None and highest >= world_size:
        raise DoctorError(f"--world-size {world_size} but there is a dump from rank {highest}")
    stacks = read_stacks(inputs.stacks)
    return analyze(dumps, table, world_size, stacks, inputs.stacks, unreadable)


def run(options: FrOptions) -> int:
    """Print the report (or the JSON); exit 1 when a rank diverged or left no (readable) dump, else 0."""
    plan = Plan("fr")
    for path in options.paths:
        plan.reads("PATH", path)
    plan.json("--json", options.json_path)
    report = diagnose(options.paths, options.prefix, options.world_size)
    if not json_to_stdout(options.json_path):
        sys.stdout.write(render_text(report))
        sys.stdout.flush()
    if options.json_path is not None:
        emit_json(options.json_path, to_json(report), "fr")
    return EXIT_PROBLEM if report.status == "fail" else EXIT_OK
