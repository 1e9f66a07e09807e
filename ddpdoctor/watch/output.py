"""The self-launched ranks' stdout and stderr, the way torchrun's ``--tee`` shows them: whole lines, each
prefixed with the rank that wrote it.

Inherited as they are, N ranks writing to one terminal interleave mid-line ("training donetraining done"),
and a script's prints land in ``watch --json -``'s stdout, which then is not JSON (issue 25). So each rank
writes into pipes of its own; one thread here reads them all and writes complete lines only:

- ``[rank1]:<line>`` (torch's own C++ log prefix, ``[rank1]:[W ...] ProcessGroupNCCL...``, and torchrun's
  ``[<role><local_rank>]:`` header style). A line that already starts with its rank's prefix (torch's
  excepthook prints ``[rank1]: Traceback ...`` once ``init_process_group`` ran) is not prefixed twice.
- stdout lines go to watch's stdout, stderr lines to its stderr; with ``--json -`` both go to stderr, so
  stdout holds the JSON document alone.
- ``\\r`` ends a piece as ``\\n`` does (a progress bar redraws its line with ``\\r``: it is shown as it goes,
  not held back until a newline that never comes); a piece longer than :data:`MAX_PIECE` is cut there.

torchrun's options mean what they mean there (``torch/distributed/run.py`` and ``DefaultLogsSpecs`` in
``torch/distributed/elastic/multiprocessing/api.py``): ``--redirects``/``-r`` and ``--tee``/``-t`` take
``0`` (none), ``1`` (stdout), ``2`` (stderr), ``3`` (both), or a per-rank mapping ``0:3,1:0``; a redirected
stream goes to ``<log-dir>/<run>/attempt_0/<rank>/stdout.log`` / ``stderr.log`` only, a tee'd one there
and to the console; ``--log-dir`` alone writes no output files (the folder is a new temporary one when
it is not given); ``--local-ranks-filter 0,1`` shows only those ranks on the console, the files keep
everything. ``--quiet`` shows no rank output at all (the files still get theirs).

Every rank's last :data:`TAIL_LINES` lines are kept for the evidence bundle of a failed run.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import selectors
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import IO

from ddpdoctor.errors import DoctorError

OUT, ERR = 1, 2  # torchrun's Std flags: 3 is both
MAX_PIECE = 64 << 10
TAIL_LINES = 1000
DRAIN_S = 2.0  # after the job: how long to wait for the pipes' last bytes (a detached child may hold them open)
_VALUE = re.compile(r"^[0-3]$")
_MAPPING = re.compile(r"^(\d+:[0-3],)*(\d+:[0-3])$")


def parse_std(option: str, value: str) -> int | dict[int, int]:
    """torchrun's ``Std.from_str``: '3' -> 3, '0:3,1:0' -> {0: 3, 1: 0}; anything else is bad usage."""
    text = value.strip()
    if _VALUE.match(text):
        return int(text)
    if _MAPPING.match(text):
        return {int(rank): int(std) for rank, std in (item.split(":") for item in text.split(","))}
    raise DoctorError(f"{option} takes 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a per-rank mapping like "
                      f"0:3,1:0 (as torchrun's), got: {value!r}")


def parse_ranks_filter(value: str) -> set[int] | None:
    """``--local-ranks-filter 0,2``; '' is no filter. Worded as torchrun words its own refusal."""
    if not value.strip():
        return None
    try:
        ranks = {int(part) for part in value.split(",")}
    except ValueError:
        raise DoctorError("--local-ranks-filter must be a comma-separated list of integers e.g. "
                          f"--local-ranks-filter=0,1,2, got: {value!r}") from None
    if any(rank < 0 for rank in ranks):
        raise DoctorError(f"--local-ranks-filter takes ranks (0 or more), got: {value!r}")
    return ranks


def _for_rank(spec: int | dict[int, int], rank: int) -> int:
    return spec.get(rank, 0) if isinstance(spec, dict) else spec


@dataclass
class OutputOptions:
    """How the ranks' output is shown and kept (the CLI's torchrun-style options, parsed)."""

    quiet: bool = False
    json_on_stdout: bool = False  # --json -: stdout is the JSON document's alone
    log_dir: str | None = None
    redirects: int | dict[int, int] = 0
    tee: int | dict[int, int] = 0
    ranks_filter: set[int] | None = None

    @property
    def writes_files(self) -> bool:
        return bool(self.redirects or self.tee)

    def validate(self) -> None:
        """Refused before any rank starts: a --log-dir that cannot be a folder."""
        if self.log_dir is None:
            return
        if os.path.exists(self.log_dir) and not os.path.isdir(self.log_dir):
            raise DoctorError(f"--log-dir {self.log_dir!r}: exists and is not a folder")
        parent = os.path.dirname(os.path.abspath(self.log_dir))
        if not os.path.exists(self.log_dir) and not os.path.isdir(parent):
            raise DoctorError(f"--log-dir {self.log_dir!r}: the folder {parent!r} does not exist")


@dataclass
class _Stream:
    rank: int | None  # None: the one process of a script that starts its own ranks (no prefix)
    kind: int  # OUT or ERR
    console: IO[bytes] | None
    log: IO[bytes] | None
    pending: bytes = b""

    @property
    def prefix(self) -> bytes:
        return f"[rank{self.rank}]:".encode() if self.rank is not None else b""


@dataclass
class RankOutput:
    """Pipes for every rank's stdout/stderr, and the thread that forwards them line by line."""

    options: OutputOptions
    streams: dict[int, _Stream] = field(default_factory=dict)  # read fd -> stream
    tails: dict[int | None, collections.deque[bytes]] = field(default_factory=dict)
    run_dir: str | None = None

    def __post_init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._files: list[IO[bytes]] = []

    # -- set-up, in the supervisor before the ranks start ------------------------------------------------

    def prepare(self, nproc: int) -> None:
        """The log folders (``<log-dir>/<run>/attempt_0/<rank>/``), created before any rank starts."""
        if not self.options.writes_files:
            return
        base = self.options.log_dir or tempfile.mkdtemp(prefix="ddpdoctor-watch-logs-")
        try:
            os.makedirs(base, exist_ok=True)
            # As torchrun: a new run folder per run inside the (reusable) log dir, one folder per rank.
            self.run_dir = tempfile.mkdtemp(prefix="ddpdoctor-watch_", dir=base)
            for rank in range(nproc):
                os.makedirs(os.path.join(self.run_dir, "attempt_0", str(rank)))
        except OSError as exc:
            raise DoctorError(f"--log-dir {base!r}: cannot create the rank log folders ({exc.strerror or exc})") \
                from None

    def log_path(self, rank: int, kind: int) -> str | None:
        if self.run_dir is None:
            return None
        return os.path.join(self.run_dir, "attempt_0", str(rank), "stdout.log" if kind == OUT else "stderr.log")

    def pipes(self, rank: int | None) -> tuple[int, int]:
        """The write ends for rank ``rank``'s stdout and stderr (None: a script that starts its own ranks,
        whose processes all write into its pipes). The caller gives them to Popen and closes its copies."""
        ends = []
        for kind in (OUT, ERR):
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            self.streams[read_fd] = _Stream(rank, kind, self._console(rank, kind), self._log(rank, kind))
            self._selector.register(read_fd, selectors.EVENT_READ)
            ends.append(write_fd)
        self.tails.setdefault(rank, collections.deque(maxlen=TAIL_LINES))
        return ends[0], ends[1]

    def _console(self, rank: int | None, kind: int) -> IO[bytes] | None:
        opts = self.options
        if opts.quiet or (opts.ranks_filter is not None and rank is not None and rank not in opts.ranks_filter):
            return None
        redirected, teed = _for_rank(opts.redirects, rank or 0) & kind, _for_rank(opts.tee, rank or 0) & kind
        if redirected and not teed:
            return None  # --redirects: the file only
        target = sys.stderr if kind == ERR or opts.json_on_stdout else sys.stdout
        return target.buffer if hasattr(target, "buffer") else None

    def _log(self, rank: int | None, kind: int) -> IO[bytes] | None:
        opts = self.options
        if not (_for_rank(opts.redirects, rank or 0) & kind or _for_rank(opts.tee, rank or 0) & kind):
            return None
        path = self.log_path(rank or 0, kind)
        if path is None:
            return None
        handle = open(path, "ab")  # noqa: SIM115 - open for the whole run, closed in stop()
        self._files.append(handle)
        return handle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-watch-output", daemon=True)
        self._thread.start()

    # -- the forwarding thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._pump(0.1):
                return

    def _pump(self, timeout: float) -> bool:
        """Read what is there; False once every pipe reached its end."""
        with self._lock:
            if not self._selector.get_map():
                return False
            for key, _ in self._selector.select(timeout):
                fd = key.fd
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                stream = self.streams[fd]
                if chunk:
                    self._feed(stream, chunk)
                else:
                    self._feed(stream, b"", end=True)
                    self._selector.unregister(fd)
                    os.close(fd)
            return True

    def _feed(self, stream: _Stream, chunk: bytes, end: bool = False) -> None:
        data = stream.pending + chunk
        pieces = re.split(rb"(?<=[\n\r])", data)
        stream.pending = pieces.pop() if pieces else b""
        while len(stream.pending) > MAX_PIECE:  # a line without end: cut it rather than hold it forever
            pieces.append(stream.pending[:MAX_PIECE] + b"\n")
            stream.pending = stream.pending[MAX_PIECE:]
        if end and stream.pending:
            pieces.append(stream.pending + b"\n")
            stream.pending = b""
        if not pieces:
            return
        if stream.log is not None:
            with contextlib.suppress(OSError):
                stream.log.write(b"".join(pieces))
                stream.log.flush()
        prefix = stream.prefix
        lines = [piece if piece.startswith(prefix) else prefix + piece for piece in pieces]
        tail = self.tails[stream.rank]
        tail.extend(piece for piece in pieces if piece.strip())
        if stream.console is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.console.write(b"".join(lines))
                stream.console.flush()

    def stop(self, drain_s: float = DRAIN_S) -> None:
        """After the job: forward what is left (bounded: a child that outlives the job may hold a pipe open),
        then close everything."""
        deadline = time.monotonic() + drain_s
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
            self._thread.join(0.05)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        with self._lock:
            for key in list(self._selector.get_map().values()):
                fd = key.fd
                stream = self.streams[fd]
                with contextlib.suppress(OSError):
                    while True:
                        chunk = os.read(fd, 1 << 16)
                        if not chunk:
                            break
                        self._feed(stream, chunk)
                self._feed(stream, b"", end=True)
                self._selector.unregister(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._selector.close()
        for handle in self._files:
            with contextlib.suppress(OSError):
                handle.close()

    def tail_text(self, rank: int | None) -> str:
        """Rank ``rank``'s last output lines (both streams, in arrival order), for the evidence bundle."""
        return b"".join(line if line.endswith((b"\n", b"\r")) else line + b"\n"
                        for line in self.tails.get(rank, ())).decode("utf-8", "replace")
