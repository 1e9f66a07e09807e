"""Run a piece of work with a deadline, and say what it was doing if it overran.

The work runs in a daemon thread; the caller's thread only waits in short ``join`` slices, so a signal
(SIGTERM from torchrun when another rank died) is handled at once even while the work is stuck inside a
C++ collective. Overrun work is abandoned, not killed (Python cannot kill a thread): the runtime
records it as an ``error`` with the thread's stack and later leaves with ``os._exit``.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Outcome(Generic[T]):
    """What became of the work: a value, an exception (as text), or a timeout with the stack then."""

    value: T | None = None
    error: BaseException | None = None
    error_text: str = ""
    timed_out: bool = False
    stack_at_timeout: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


def run_with_deadline(work: Callable[[], T], seconds: float, name: str = "ddpdoctor-work") -> Outcome[T]:
    """Run ``work()`` for at most ``seconds``; never raises what ``work`` raises."""
    outcome: Outcome[T] = Outcome()
    start = time.monotonic()

    def target() -> None:
        try:
            outcome.value = work()
        except BaseException as exc:  # the work is a check or an init: anything it raises is a finding
            outcome.error = exc
            outcome.error_text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    deadline = start + max(0.0, seconds)
    while thread.is_alive():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            outcome.timed_out = True
            outcome.stack_at_timeout = thread_stack(thread)
            break
        thread.join(min(0.05, remaining))
    return outcome


def thread_stack(thread: threading.Thread) -> str:
    """The Python stack of a running thread, innermost frame last (as tracebacks print)."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return ""
    return "".join(traceback.format_stack(frame))


def innermost_line(stack: str) -> str:
    """The last 'File ..., line N, in f' entry of a formatted stack: where the work was stuck."""
    lines = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
    return lines[-1] if lines else ""
