"""What the supervisor knows of each rank (``RankState``) and of each process the script started that has not
claimed a rank yet (``ProcState``): filled by :class:`~ddpdoctor.watch.aggregate.Aggregator` from the ranks'
messages and exit statuses, read by the verdicts (:mod:`~ddpdoctor.watch.verdict`) and the report."""

from __future__ import annotations

import collections
import re
import signal
from dataclasses import dataclass, field
from typing import Any

HISTORY = 1000  # records kept per rank for the evidence bundle
# A rank whose collective failed because a peer went away is an echo of that peer's failure, not a cause.
# These are the texts of ddpdoctor explain's `remote-process-exited` signature (gloo's pair.cc, NCCL's
# ncclRemoteError). Its end can be timed a little before the peer's death is seen (the peer's exit closes
# both sockets at once; a SIGKILL is only seen by waiting on the process), so within ECHO_WINDOW_S an echo
# is ordered after a failure that is not one.
ECHO = re.compile(r"remote process exited or there was a network error|ncclRemoteError|"
                  r"Connection closed by (?:remote )?peer|Connection reset by peer")
ECHO_WINDOW_S = 1.0


@dataclass
class RankState:
    """What the supervisor knows about one rank."""

    rank: int
    pid: int | None = None
    host: str = ""
    connected: bool = False
    progress: int = -1
    done: int = -1  # completions counted by the rank: the hang clock's input
    started: bool = False  # its script runs (before: Python is importing torch and installing the hooks)
    hello_at: float | None = None
    heard_at: float | None = None  # its last message (a watchdog beats at least once a second)
    beat_at: float | None = None  # its last beat (what it had issued and where it was, as of then)
    inflight: list[dict[str, Any]] = field(default_factory=list)  # issued, not completed (oldest first)
    inflight_n: int = 0
    frames: list[list[Any]] | None = None  # its main thread's whole stack at the verdict
    loader: dict[str, Any] | None = None  # the DataLoader worker it waits for, at the verdict
    cur: dict[str, Any] | None = None
    ended_in: dict[str, Any] | None = None  # the call it was in when it ended (its last beat's ``cur``)
    last: dict[str, Any] | None = None
    seqs: dict[str, int] = field(default_factory=dict)
    said_exit: bool = False  # the rank's own exit message arrived
    message_code: int | None = None
    raised: bool = False
    error: str = ""
    returncode: int | None = None  # from the OS, when ddpdoctor launched the rank
    lost: bool = False  # the channel closed without an exit message
    stack: list[str] | None = None
    pitfalls: list[dict[str, Any]] = field(default_factory=list)
    ended_at: float | None = None
    # True when ddpdoctor started the process: then only its real end counts (after the exit message a
    # rank may still run atexit handlers, uploading logs or checkpoints; it must not be torn down then).
    owned: bool = False
    claim: dict[str, Any] | None = None  # what it called init_process_group with
    steps: dict[str, Any] | None = None  # per-step medians (recorder.step_stats)
    history: collections.deque[dict[str, Any]] = field(default_factory=lambda: collections.deque(maxlen=HISTORY))
    fr: str | None = None  # its Flight Recorder dump's path, or why there is none

    @property
    def finished(self) -> bool:
        if self.owned:
            return self.returncode is not None
        return self.said_exit or self.returncode is not None or self.lost

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    @property
    def exit_code(self) -> int | None:
        return self.returncode if self.returncode is not None else self.message_code

    @property
    def crashed(self) -> bool:
        if self.signal_name or self.raised:
            return True
        if self.returncode is not None and not self.said_exit:
            return self.returncode != 0  # os._exit / interpreter abort: it never reached the script's end
        # A closed channel alone says "dead" only when there is no process to ask.
        return self.lost and not self.said_exit and not self.owned

    @property
    def failed(self) -> bool:
        """Crashed, or ended with a non-zero exit code: the run failed on this rank."""
        return self.crashed or (self.finished and self.exit_code not in (None, 0))

    @property
    def echo(self) -> bool:
        """Its error says a peer went away: it failed because another rank did."""
        return self.raised and bool(ECHO.search(self.error))

    @property
    def state(self) -> str:
        if self.crashed:
            return "crashed"
        if self.finished:
            return "exited"
        if not self.connected:
            return "not started"
        return "waiting" if self.cur is not None else "running"

    def how_ended(self) -> str:
        """'exited with code 3', 'killed by signal 9 (SIGKILL)', 'raised ValueError: ...' (after 'rank N')."""
        if self.returncode is not None and self.returncode < 0:
            return f"was killed by signal {-self.returncode} ({self.signal_name})"
        if self.raised:
            return f"raised {self.error}" if self.error else "raised an exception"
        if self.lost and not self.said_exit and self.returncode is None:
            return "lost its connection without an exit status (killed, or crashed outside Python)"
        # sys.exit("message"): python prints the message and exits 1; the message says why.
        said = f": {self.error}" if self.error and self.exit_code == 1 else ""
        return f"exited with code {self.exit_code}{said}"


@dataclass
class ProcState:
    """A process the script started (mp.spawn) that has not claimed a rank (yet)."""

    key: int
    pid: int | None = None
    host: str = ""
    role: str = "child"
    index: int | None = None
    stack: list[str] | None = None
    finished: bool = False
