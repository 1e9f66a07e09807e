"""Never silent while waiting: what rank 0 waits for, and for how long, on stderr.

A ``check`` whose ranks never join used to say nothing for the whole ``--timeout``. Now every wait of
rank 0 (ranks starting, joining, the process group forming, a check running, ranks reporting) that lasts
longer than :data:`SHOW_AFTER_S` is shown while it lasts:

* on a terminal, one line rewritten in place (``ddpdoctor: waiting for ranks 1,2 to join: 12/30 s``) and
  erased when the wait ends, so the report that follows is all that stays on the screen;
* when stderr is a file or a pipe (CI logs), one plain line per :data:`LOG_EVERY_S` seconds of the wait,
  and nothing for short waits.

It goes to stderr only: ``--json -`` keeps stdout a single JSON document. A daemon thread does the
ticking, so the waiting code only says what it waits for (:meth:`WaitDisplay.begin`,
:meth:`WaitDisplay.update`) and when it is over (:meth:`WaitDisplay.end`).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

SHOW_AFTER_S = 2.0
LOG_EVERY_S = 10.0
TICK_S = 0.25
_ERASE = "\r\x1b[K"


class WaitDisplay:
    """One wait at a time, shown on ``stream`` once it has lasted ``show_after_s``."""

    def __init__(self, stream: TextIO | None = None, *, terminal: bool | None = None,
                 show_after_s: float = SHOW_AFTER_S, log_every_s: float = LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = _isatty(self.stream) if terminal is None else terminal
        self.show_after_s, self.log_every_s, self.clock = show_after_s, log_every_s, clock
        self._lock = threading.Lock()
        self._what: str | None = None
        self._began = 0.0
        self._total: float | None = None
        self._shown = False  # a terminal line is on the screen
        self._line = ""
        self._logged = 0  # log lines written for this wait
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- what the waiting code says -------------------------------------------------------------------

    def begin(self, what: str, total_s: float | None = None, since: float | None = None) -> None:
        """A wait starts (``since``: when it really began, on :attr:`clock`); ends any wait before it.

        The wait already shown, begun again (``check`` says "starting the ranks" before torch loads and
        again as it joins), goes on: same clock, and a log does not repeat the line it already has.
        """
        with self._lock:
            if what == self._what:
                return
            self._erase()
            self._what, self._total = what, total_s
            self._began = self.clock() if since is None else since
            self._logged = 0
        self._start_thread()

    def update(self, what: str) -> None:
        """What the current wait waits for changed (fewer ranks missing); its clock goes on."""
        with self._lock:
            if self._what is not None:
                self._what = what

    def end(self) -> None:
        """The wait is over: its line goes away."""
        with self._lock:
            self._erase()
            self._what = None

    def close(self) -> None:
        self.end()
        self._closed = True

    def waiting_for(self) -> float:
        """Seconds the current wait has lasted (0 when none): a caller refreshes costly texts only past
        :attr:`show_after_s`, when they are shown."""
        with self._lock:
            return 0.0 if self._what is None else self.clock() - self._began

    # -- the ticking ------------------------------------------------------------------------------------

    def tick(self) -> None:
        """Show the current wait if it is long enough (the thread calls this; tests may call it directly)."""
        with self._lock:
            if self._what is None:
                return
            elapsed = self.clock() - self._began
            if elapsed < self.show_after_s:
                return
            text = f"ddpdoctor: {self._what}: {_seconds(elapsed, self._total)}"
            if self.terminal:
                width = shutil.get_terminal_size((100, 24)).columns
                line = text[: max(20, width - 1)]
                if line != self._line:  # rewritten only when it changes (once a second at most)
                    self._write(_ERASE + line)
                    self._line, self._shown = line, True
            elif elapsed >= (self._logged + 1) * self.log_every_s:
                self._logged = int(elapsed // self.log_every_s)
                self._write(text + "\n")

    def _erase(self) -> None:
        if self._shown:
            self._write(_ERASE)
            self._shown, self._line = False, ""

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not cost the run
            self._closed = True

    def _start_thread(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="ddpdoctor-progress", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self.tick()
            time.sleep(TICK_S)


def _seconds(elapsed: float, total: float | None) -> str:
    return f"{elapsed:.0f}/{total:.0f} s" if total else f"{elapsed:.0f} s"


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
