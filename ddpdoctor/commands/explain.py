"""`ddpdoctor explain [LOG ...] [--json PATH]`: say what a crashed job's logs mean, root cause first.

Thin: open the inputs (stdin for none or ``-``), hand them to :mod:`ddpdoctor.explain`, print. Never imports
torch (``ddpdoctor explain`` must start fast on a login node).
"""

from __future__ import annotations

import os
import stat
import sys
from contextlib import ExitStack
from typing import IO

import typer

from ddpdoctor.commands.options import JsonOption
from ddpdoctor.errors import EXIT_OK, EXIT_PROBLEM, DoctorError


def _refuse_unless_regular(path: str, mode: int) -> None:
    """Only regular files are read by path: a FIFO would block in open() until a writer comes (forever),
    /dev/zero never ends, and a tape or serial device may act on being opened. Streams go through stdin."""
    if stat.S_ISREG(mode):
        return
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")
    raise DoctorError(f"{path} is not a regular file ({kind}); pass a log file, or pipe a stream in: "
                      f"`cat {path} | ddpdoctor explain -`")


def _open_inputs(stack: ExitStack, logs: list[str]) -> list[tuple[str, IO[bytes], int | None]]:
    """Open every input up front, so a typo in the last path fails before a long scan (exit 2)."""
    from ddpdoctor.explain import rank_from_path

    if not logs and sys.stdin.isatty():
        # Reading a terminal would just wait for input the user does not know we want.
        raise DoctorError("no log given: pass the job's log file(s), e.g. `ddpdoctor explain train.log`, "
                          "or pipe one in: `cat train.log | ddpdoctor explain`")
    opened: list[tuple[str, IO[bytes], int | None]] = []
    for path in logs or ["-"]:
        if path == "-":
            opened.append(("<stdin>", sys.stdin.buffer, None))
            continue
        if os.path.isdir(path):
            raise DoctorError(f"{path} is a directory; pass the log files in it, e.g. {path}/*.log "
                              f"(torchrun --log-dir: {path}/*/attempt_*/*/stderr.log)")
        try:
            _refuse_unless_regular(path, os.stat(path).st_mode)
            # O_NONBLOCK: should the path become a FIFO after the check, open() must not wait for a writer.
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            stream = stack.enter_context(os.fdopen(fd, "rb"))
            _refuse_unless_regular(path, os.fstat(fd).st_mode)
        except FileNotFoundError:
            raise DoctorError(f"{path}: no such file; pass the log file(s) of the job, or - for stdin") from None
        except OSError as exc:
            raise DoctorError(f"{path}: cannot read it ({exc.strerror}); check the path and permissions") from None
        opened.append((path, stream, rank_from_path(path)))
    _refuse_if_all_empty(opened)
    return opened


def _refuse_if_all_empty(opened: list[tuple[str, IO[bytes], int | None]]) -> None:
    """Files that are all empty are a wrong path or a log that caught nothing, not a clean run: "no known error
    found" would reassure about a log that was never read. Exit 2. An empty file beside others (a rank that
    printed nothing) and empty stdin (a grep that matched nothing) are read as they are."""
    if any(name == "<stdin>" for name, _, _ in opened):
        return
    try:
        if any(os.fstat(stream.fileno()).st_size for _, stream, _ in opened):
            return
    except (OSError, ValueError):
        return
    which = (f"{opened[0][0]} is" if len(opened) == 1 else
             f"{', '.join(name for name, _, _ in opened)} are all" if len(opened) <= 3 else f"all {len(opened)} logs are")
    raise DoctorError(f"{which} empty (0 bytes): nothing to explain; is it the right file? (a job's errors go "
                      "to stderr: `2>&1` in the command that wrote it keeps them)")


def explain(
    logs: list[str] = typer.Argument(None, metavar="LOG",
                                     help="Log files to read (one per rank is fine); none or - reads stdin."),
    json_path: JsonOption = None,
) -> None:
    """Recognise known DDP / NCCL / torchrun errors in logs; root cause first.

    Exit 1 when a failure was found (an error, a probable hang); notes (performance hints such as
    find_unused_parameters=True with nothing unused) alone exit 0: they are not why a run failed.
    """
    from ddpdoctor.explain import explain_streams, render_text
    from ddpdoctor.outputs import Plan, emit_json, is_our_json, json_to_stdout

    if json_path is not None and not logs and not json_to_stdout(json_path) and os.path.isfile(json_path) \
            and not is_our_json(json_path, "explain"):
        # `explain --json train.log` with stdin not a terminal (cron, CI, nohup): --json took the log as the
        # file to write, and stdin would be read instead. Say so, rather than only "not a JSON document".
        raise DoctorError(f"--json {json_path!r} names an existing file that is not an explain JSON document: "
                          "--json takes the file to WRITE, so no log was given and stdin would be read. "
                          f"Give the log first: ddpdoctor explain {json_path} --json explain.json")
    plan = Plan("explain")
    for log in logs or []:
        plan.reads("LOG", log)
    plan.json("--json", json_path)
    with ExitStack() as stack:
        result = explain_streams(_open_inputs(stack, list(logs or [])))
    if not json_to_stdout(json_path):
        typer.echo(render_text(result), nl=False)
    if json_path is not None:
        emit_json(json_path, result.to_json(), "explain")
    raise typer.Exit(EXIT_PROBLEM if result.failures else EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add ``explain``."""
    app.command("explain", help="Recognise known DDP/NCCL/torchrun errors in logs and say the cause and the fix; "
                                         "exit 1 for a failure, 0 for none (notes alone).")(
        explain)
