"""Run one generated input through ``ddpdoctor.cli.main`` and assert every promise ddpdoctor makes on it.

The promises (README "Exit codes", design.md, issue 20): the exit code is 0, 1 or 2 (3 is our own bug);
on 2 stderr is exactly one line starting ``ddpdoctor: error:``; no ``Traceback`` anywhere; the inputs are
byte for byte and mtime for mtime what they were; no ``*.ddpdoctor-partial`` temp file is left; an output
(``-o OUT``, ``--json PATH``) is either absent or complete and readable, and after exit 2 a ``--json``
file holds the error document, never a result; nothing in a file ran (the
payloads the generators plant would create :data:`MARKER`); and the run ends in bounded time.

In-process (the console entry point's own function, without paying torch's import per input), with
stdout and stderr replaced by text streams that behave like a pipe's (stdout strict UTF-8, stderr
backslashreplace, as CPython sets them for a non-terminal).
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import io
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Every payload a generator plants touches this file; it must never exist (checked after every input).
MARKER = Path(tempfile.gettempdir()) / f"ddpdoctor-fuzz-pwned-{os.getpid()}"
PAYLOAD_CMD = f"touch {MARKER}"
PAYLOAD_PY = f"open({str(MARKER)!r}, 'w').close()"

PARTIAL_SUFFIX = ".ddpdoctor-partial"
OUR_FRAME = f'File "{Path(__file__).resolve().parent.parent.parent / "ddpdoctor"}{os.sep}'



class FuzzTimeout(BaseException):
    """An input ran past the soft bound (a BaseException: cli.main's `except Exception` must not eat it)."""


@dataclass
class Budget:
    """How hard the suite tries; set once per session by tests/fuzz/conftest.py from the options."""

    examples: int = 20  # per test, before each test's weight
    long: bool = False
    soft_s: float = 20.0  # SIGALRM: the test fails, the suite goes on
    hard_s: float = 60.0  # faulthandler exit=True: C code that ignores signals kills the run, loudly
    inputs: int = 0  # inputs actually run this session (every cli.main call made by the suite)
    codes: dict[int, int] = field(default_factory=dict)  # exit code -> count: do inputs get past parsing?


BUDGET = Budget()

# Where the hard watchdog writes the stuck stacks: the terminal's stderr that pytest saved before it
# captured fd 2 (set by tests/fuzz/conftest.py), else a file; the input being run is in CURRENT_INPUT.
STALL_FD: int | None = None
CURRENT_INPUT = Path(tempfile.gettempdir()) / f"ddpdoctor-fuzz-current-{os.getpid()}.txt"
_stall_file: Any = None


def stall_stream() -> Any:
    global _stall_file
    if _stall_file is None:
        if STALL_FD is not None:
            _stall_file = os.fdopen(os.dup(STALL_FD), "w")
        else:
            _stall_file = open(Path(tempfile.gettempdir()) / f"ddpdoctor-fuzz-stall-{os.getpid()}.txt", "w")  # noqa: SIM115
    return _stall_file


def examples(weight: float = 1.0) -> int:
    """Examples for a test: the session's base number times the test's weight (cheap tests run more)."""
    return max(1, int(BUDGET.examples * weight))


@contextlib.contextmanager
def time_bound(seconds: float | None = None) -> Iterator[None]:
    """Bound the block: a soft SIGALRM that raises :class:`FuzzTimeout`, and a hard faulthandler watchdog.

    The soft bound interrupts Python code (a test failure the run survives). C code that never returns
    to the interpreter (a regex engine, a hash loop in C) cannot see a signal; faulthandler's watchdog is a
    C thread that prints every thread's stack and exits the process, so such a stall is never silent.
    """
    soft = BUDGET.soft_s if seconds is None else seconds
    hard = max(BUDGET.hard_s, soft * 2)

    def _raise(_signum: int, _frame: Any) -> None:
        raise FuzzTimeout(f"input still running after {soft:g} s (the soft bound of the fuzz suite)")

    faulthandler.dump_traceback_later(hard, exit=True, file=stall_stream())
    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, soft)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        faulthandler.cancel_dump_traceback_later()


def snapshot(path: Path) -> Any:
    """What "unchanged" means for an input: bytes (SHA-256), size, mode and mtime; a tree for a folder."""
    if path.is_symlink() or not path.exists():
        return ("absent-or-link", os.path.lexists(path))
    st = path.stat()
    if path.is_dir():
        return ("dir", st.st_mode, {p.name: snapshot(p) for p in sorted(path.iterdir())})
    if not path.is_file():
        return ("special", st.st_mode)
    return ("file", hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mode, st.st_mtime_ns)


@dataclass
class Outcome:
    argv: list[str]
    code: int
    out: str
    err: str


def _pipe_like(errors: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors, write_through=True)


def _read(stream: io.TextIOWrapper) -> str:
    raw = stream.buffer.getvalue()  # type: ignore[attr-defined]
    return raw.decode("utf-8", errors="replace")


def run_cli(argv: Sequence[str], *, stdin: bytes = b"", soft_s: float | None = None) -> Outcome:
    """``cli.main(argv)`` with a pipe-like stdin/stdout/stderr, bounded in time; counted."""
    from ddpdoctor.cli import main

    BUDGET.inputs += 1
    CURRENT_INPUT.write_text(" ".join(argv) + "\n", encoding="utf-8", errors="backslashreplace")
    out, err = _pipe_like("strict"), _pipe_like("backslashreplace")
    fake_in = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8", errors="strict")
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = fake_in, out, err
    try:
        with time_bound(soft_s):
            code = main(list(argv))
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    BUDGET.codes[code] = BUDGET.codes.get(code, 0) + 1
    return Outcome(list(argv), code, _read(out), _read(err))


def assert_promises(res: Outcome, *, allowed: Sequence[int] = (0, 1, 2)) -> None:
    """Exit code, the one-line error, no traceback, no payload effect."""
    where = f"ddpdoctor {' '.join(res.argv)!r}"
    # stdout may quote the user's log (explain), tracebacks included: only a frame of ours counts there.
    assert "Traceback" not in res.err and OUR_FRAME not in res.out, \
        f"{where}: traceback (exit {res.code}):\n{res.err[-3000:]}"
    assert res.code in allowed, f"{where}: exit {res.code} (allowed {list(allowed)}):\n{res.err[-3000:]}"
    if res.code == 2:
        lines = res.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error:"), \
            f"{where}: exit 2 must be one stderr line 'ddpdoctor: error: ...', got:\n{res.err[-3000:]}"
    assert not MARKER.exists(), f"{where}: a payload in the input ran (it created {MARKER})"


def no_partials(*folders: Path) -> None:
    for folder in folders:
        if folder.is_dir():
            left = [str(p) for p in folder.rglob(f"*{PARTIAL_SUFFIX}")]
            assert not left, f"partial output left behind: {left}"


def strict_json(text: str) -> Any:
    """JSON as the standard defines it (no NaN/Infinity): what every --json document must be."""

    def _refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=_refuse)


@contextlib.contextmanager
def workdir(base: Path) -> Iterator[Path]:
    """A fresh folder per generated input (hypothesis reuses a test's tmp_path across examples)."""
    MARKER.unlink(missing_ok=True)
    path = Path(tempfile.mkdtemp(prefix="ex-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check_command(argv: Sequence[str], *, inputs: Sequence[Path], folder: Path,
                  json_out: Path | None = None, output: Path | None = None,
                  output_valid: Callable[[Path], None] | None = None, stdin: bytes = b"",
                  allowed: Sequence[int] = (0, 1, 2)) -> Outcome:
    """Run one command on generated inputs and check every promise; return the outcome for more checks."""
    before = {p: snapshot(p) for p in inputs}
    res = run_cli(argv, stdin=stdin)
    assert_promises(res, allowed=allowed)
    for p, snap in before.items():
        assert snapshot(p) == snap, f"ddpdoctor {' '.join(res.argv)!r} changed its input {p}"
    no_partials(folder, *(p for p in inputs if p.is_dir()))
    if json_out is not None and json_out.exists():
        doc = strict_json(json_out.read_text(encoding="utf-8"))
        if res.code == 2:
            # A failed run's --json holds its error document, never a result (docs/outputs.md, "JSON output").
            assert isinstance(doc, dict) and (doc.get("tool"), doc.get("status"), doc.get("exit_code")) == \
                ("ddpdoctor", "error", 2), f"{res.argv}: exit 2 but the --json file holds a result: {doc!r:.300}"
    if output is not None and output.exists():
        assert res.code != 2, f"{res.argv}: exit 2 but the output {output} was written"
        if output_valid is not None:
            output_valid(output)
    return res
