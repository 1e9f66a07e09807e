"""`ddpdoctor stacks` as a function of its options, and a strict parser for its everyday invocations.

Why a parser besides typer's: `ddpdoctor stacks` runs on a node whose job is stuck, often on every node at
once through ``srun``, and importing typer costs more than finding and reading all ranks' stacks. The
console entry (:func:`ddpdoctor.cli.main`) first offers the arguments to :func:`parse_fast`; it accepts
only options it can read exactly as typer would (``--pid``, ``--job``, ``--native``, ``--all-threads``,
``--json``, ``--timeout``) and declines everything else (``--help``, ``merge``, ``--signal``, a value
typer would reject), which then goes through typer (:mod:`ddpdoctor.commands.stacks`) and its messages.
Both paths end in :func:`run`. ``tests/test_stacks_cli.py`` checks that both parse alike.
"""

from __future__ import annotations

import os
import sys

from ddpdoctor.errors import EXIT_OK, EXIT_PROBLEM, DoctorError
from ddpdoctor.stacks.record import Record

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: `ddpdoctor stacks` must start fast (see stacks_cli)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TextIO

    from ddpdoctor.stacks.report import ProcessStacks

PathArg = str | os.PathLike[str]


class StacksOptions(Record):
    """The options of ``ddpdoctor stacks`` (defaults as in its ``--help``); paths kept as text, whichever
    parser gave them."""

    __slots__ = ("all_threads", "job", "json_path", "native", "pid", "signal_mode", "stack_dir", "timeout")

    def __init__(self, pid: Sequence[int] = (), job: str | None = None, native: bool = False,
                 all_threads: bool = False, json_path: PathArg | None = None, signal_mode: bool = False,
                 stack_dir: PathArg | None = None, timeout: float = 30.0) -> None:
        self.pid = list(pid)
        self.job = job
        self.native = native
        self.all_threads = all_threads
        self.json_path = os.fspath(json_path) if json_path is not None else None
        self.signal_mode = signal_mode
        self.stack_dir = os.fspath(stack_dir) if stack_dir is not None else None
        self.timeout = timeout


MIN_TIMEOUT = 0.1
MAX_TIMEOUT = 86400.0  # a day: every wait has a deadline
_FLAGS = {"--native": "native", "--all-threads": "all_threads"}
_VALUED = ("--pid", "-p", "--job", "--json", "--timeout")


def parse_fast(argv: Sequence[str]) -> StacksOptions | None:
    """The options when ``argv`` (after ``stacks``) holds only what this parser reads exactly as typer
    does; None for anything else, so that typer parses it and words any error."""
    opts = StacksOptions()
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in _FLAGS and not eq:
            setattr(opts, _FLAGS[name], True)
            i += 1
            continue
        if name not in _VALUED:
            return None
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        else:
            return None
        if name in ("--pid", "-p"):
            if not value.isascii() or not value.isdigit() or len(value) > 10:
                return None
            opts.pid.append(int(value))
        elif name == "--job":
            opts.job = value
        elif name == "--json":
            if not _as_pathlib_writes_it(value):
                return None
            opts.json_path = value
        else:
            try:
                timeout = float(value)
            except ValueError:
                return None
            if not MIN_TIMEOUT <= timeout <= MAX_TIMEOUT:  # NaN too
                return None
            opts.timeout = timeout
    return opts


def _as_pathlib_writes_it(value: str) -> bool:
    """True when typer's ``Path`` would print ``value`` unchanged (no ``./``, ``//``, trailing ``/``), so
    that both parsers name the same file in the same words; pathlib itself costs start-up."""
    if not value or value.startswith("//"):
        return False
    parts = value.split("/")
    return all(part not in ("", ".") for part in (parts[1:] if value.startswith("/") else parts))


def run(opts: StacksOptions) -> int:
    """Find the ranks, read their stacks, print the grouped report; the exit code (0 agree, 1 not)."""
    if opts.json_path is not None:
        from ddpdoctor.fileio import validate_output_path

        validate_output_path("--json", opts.json_path)
    if opts.signal_mode:
        if opts.native:
            raise DoctorError("--native needs py-spy; --signal dumps only Python frames (drop one of them)")
        from ddpdoctor.stacks.signal_dumps import collect

        return finish(collect(opts.pid, opts.job, opts.stack_dir, opts.timeout), "signal", opts.json_path,
                      opts.all_threads)
    from ddpdoctor.stacks.engine import discover, dump_all

    cands = discover(opts.pid, opts.job)
    if not cands:
        where = f" of job {opts.job}" if opts.job else ""
        raise DoctorError(f"no DDP rank processes{where} found on this machine (looked for RANK/LOCAL_RANK "
                          "with TORCHELASTIC_RUN_ID or SLURM step ids, and children of torchrun); pass "
                          "--pid PID, or run as the job's user or root to read other users' processes")
    dumped = dump_all(cands, native=opts.native, timeout=opts.timeout, thread_names=opts.all_threads)
    return finish(dumped.processes, dumped.source, opts.json_path, opts.all_threads)


def finish(processes: list[ProcessStacks], source: str, json_path: PathArg | None, all_threads: bool) -> int:
    """Group, print, write JSON; exit 1 when the ranks disagree or could not all be seen."""
    from ddpdoctor.stacks.report import analyze, render_text

    reports = analyze(processes)
    if json_path is not None:  # first: the file is there even if stdout is a pipe that closes early
        from ddpdoctor.fileio import write_json_atomic
        from ddpdoctor.stacks.report import to_json

        try:
            write_json_atomic(json_path, to_json(processes, reports, source))
        except OSError as exc:
            raise DoctorError(f"cannot write --json {os.fspath(json_path)}: {exc.strerror or exc}") from exc
    out = _stdout()
    out.write(render_text(reports, all_threads=all_threads, source=source))
    if json_path is not None:
        out.write(f"wrote {os.fspath(json_path)}\n")
    out.flush()
    return EXIT_PROBLEM if any(r.problem for r in reports) else EXIT_OK


def _stdout() -> TextIO:
    """stdout that prints any file or function name: as click does for typer's commands, an ASCII-only
    terminal setting gets escapes instead of a UnicodeEncodeError, and a closed stdout swallows output."""
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")
    return sys.stdout
