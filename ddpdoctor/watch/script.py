"""Running the user's script unchanged, as ``python script.py`` would, and turning its end into an outcome.

Both kinds of watched process need this: a rank (:func:`run_script`, self-launched through ``rank.py`` or
called in-process under torchrun) runs the script as ``__main__``, and the launcher of a script that
starts its own ranks (``spawned.py``) does too, while the processes it starts report their failures with
:func:`failure`. Nothing here imports ``spawned`` or ``rank``: they sit above it.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
import traceback
from typing import Any

from ddpdoctor.errors import typed_error
from ddpdoctor.watch import pitfalls as pitfall_hooks
from ddpdoctor.watch import recorder
from ddpdoctor.watch.watchdog import LostContact, Watchdog, enable_flight_recorder, line_buffered_if_piped

# How the script ended in this process, once it has: the exit message this rank is about to send. Rank 0's
# supervisor under a launcher (a thread of the same process) reads it when another rank's crash decides the
# verdict: rank 0's own message waits for its watchdog thread to stop and can reach the channel after the other
# rank's, and the launcher tears rank 0 down within its monitor interval (0.1 s) of that rank's exit, so a job
# whose ranks all raised read "rank 1 raised ...; the rest were torn down".
_local_end: dict[str, Any] | None = None


def local_end() -> dict[str, Any] | None:
    """This process's script's exit message (see ``_local_end``), or None while the script runs."""
    return _local_end


def enter(script: str, args: list[str]) -> None:
    """``sys.argv`` and ``sys.path[0]`` as ``python script.py args...`` sets them."""
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))


def _ours(filename: str) -> bool:
    """Frames of torch, ddpdoctor and runpy: not what the user wrote."""
    return filename.startswith(recorder.skip_dirs()) or "runpy" in filename or filename.startswith("<frozen")


def error_site(exc: BaseException) -> str:
    """file:line of the innermost user frame of an exception's traceback."""
    site = ""
    for summary in traceback.extract_tb(exc.__traceback__):
        if not _ours(summary.filename):
            site = f"{recorder.site_name(summary.filename)}:{summary.lineno}"
    return site


def failure(exc: BaseException) -> str:
    """The one-line error of a crashed script: ``ValueError: corrupt sample (at train.py:30)``."""
    where = error_site(exc)
    return typed_error(exc)[:300] + (f" (at {where})" if where else "")


def execute(script: str) -> tuple[int, bool, str]:
    """Run the script as __main__; (exit code, crashed by an exception, one-line error).

    ``sys.exit("message")`` is exit code 1 with the message printed, as python does; the message is also
    the rank's error, so the report can say why it exited."""
    try:
        runpy.run_path(script, run_name="__main__")
        return 0, False, ""
    except SystemExit as exc:
        if exc.code is None:
            return 0, False, ""
        if isinstance(exc.code, int):
            # What the OS will report: python exits with the code modulo 256 (sys.exit(256) is 0).
            return exc.code & 0xFF, False, ""
        print(exc.code, file=sys.stderr)
        return 1, False, " ".join(str(exc.code).split())[:300]
    except BaseException as exc:  # the script's own crash: print it as python would, then report it
        tb = exc.__traceback__
        # Drop our own frames (runpy, this function) so the traceback starts in the user's script.
        while tb is not None and _ours(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
        sys.stderr.flush()
        return 1, True, failure(exc)


def run_script(script: str, args: list[str], rank: int, world_size: int, address: str,
               exit_on_lost: bool, lost_after_s: float | None = None, on_lost: LostContact | None = None) -> int:
    """Run ``script args`` watched in this process as rank ``rank``; returns its exit code.

    ``lost_after_s``/``on_lost``: see :class:`~ddpdoctor.watch.watchdog.Watchdog` (a rank on another host
    than the supervisor's reaching its own verdict when the supervisor goes silent)."""
    line_buffered_if_piped()
    enable_flight_recorder()
    # The watchdog first: the rank says it started before torch's import (seconds on a busy machine), so a
    # rank that never starts is told from one that is still importing.
    rec = recorder.Recorder(rank, world_size)
    dog = Watchdog(rec, None, address, exit_on_lost, lost_after_s=lost_after_s, on_lost=on_lost)
    dog.start()
    recorder.install(rank, world_size, rec)
    dog.pitfalls = pitfall_hooks.install(rec)
    rec.init_hook = dog.on_init
    rec.started = True
    enter(script, args)
    code, crashed, error = execute(script)
    ended_at = time.time()
    global _local_end
    last = rec.last_done  # read now: the supervisor may have to report this end before the message is sent
    _local_end = {"t": "exit", "code": code, "crashed": crashed, "error": error, "at": ended_at,
                  "last": last.to_json() if last is not None else None}
    dog.finish(code, crashed, error, ended_at)
    return code
