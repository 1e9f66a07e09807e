"""A watched process's watchdog thread: ships what the recorder saw to the supervisor, answers its requests.

Every watched process has one (a self-launched rank, a rank under torchrun, each process a script starts
itself). It ships the recorder's records and progress over the side channel every tick, and on request
the main thread's stack and the process's PyTorch Flight Recorder dump: ``sys._current_frames()`` works
while the main thread blocks inside a C++ collective because gloo and NCCL release the GIL while they wait.
It also turns the Flight Recorder on before the script creates its process group.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ddpdoctor.errors import typed_error
from ddpdoctor.watch.channel import RECORDS_PER_MESSAGE, Client
from ddpdoctor.watch.pitfalls import PitfallLog
from ddpdoctor.watch.recorder import Recorder, user_stack

# Set by the self-launching supervisor: when its channel closes, the supervisor is gone and nobody
# would ever tear this rank down, so the rank ends itself rather than become an orphan.
EXIT_ON_LOST_ENV = "DDPDOCTOR_WATCH_EXIT_ON_LOST"
# "1": the supervisor reads this process's stdout/stderr through pipes (see output.py). Python then buffers
# whole blocks; lines are flushed as they are on a terminal, so a hung rank's last words are not lost.
PIPED_ENV = "DDPDOCTOR_WATCH_PIPED"
# "spawn": the script starts its own ranks (mp.spawn, a Process per rank); this process is its launcher.
MODE_ENV = "DDPDOCTOR_WATCH_MODE"
BEAT_S = 1.0
TICK_S = 0.1
# How long init_process_group waits for the channel before its claim is sent (normally milliseconds).
INIT_CONNECT_S = 10.0
MAX_FRAMES = 48
VERDICT_INFLIGHT = 32  # in-flight calls sent with the verdict's stack
PY_SPY_S = 5.0  # a DataLoader worker's stack, read with py-spy at the verdict
# A supervisor that announced its verdict gets this much longer to send the exit message (stacks, bundle).
VERDICT_GRACE_S = 60.0
# on_lost(the supervisor's last word as wall time, seconds since, the rank map it last sent)
LostContact = Callable[[float, float, dict[str, list[int]]], None]


def frames_of(frame: Any) -> list[list[Any]]:
    """The main thread's whole stack, outermost first, as [file, line, function, source] (the last
    :data:`MAX_FRAMES`): what :mod:`~ddpdoctor.watch.waits` reads to say where the rank waits."""
    if frame is None:
        return []
    return [[f.filename, f.lineno or 0, f.name, (f.line or "").strip()[:200]]
            for f in traceback.extract_stack(frame)[-MAX_FRAMES:]]


def dataloader_wait(frame: Any) -> dict[str, Any] | None:
    """A main thread waiting for a batch from a DataLoader's worker processes: which worker (index, pid),
    every worker's pid, and the waited-for worker's own stack (py-spy; this process is its parent, so
    ptrace is allowed even under Yama's ptrace_scope=1). None when the main thread is not in one.

    Read from torch's ``_MultiProcessingDataLoaderIter`` (torch/utils/data/dataloader.py): ``_workers``
    (the worker processes), ``_task_info[_rcvd_idx]`` (``(worker_id,)`` while batch ``_rcvd_idx`` is still
    awaited from that worker). Private attributes: anything missing gives the facts found so far."""
    loader = None
    while frame is not None:
        if frame.f_code.co_filename.replace("\\", "/").endswith("torch/utils/data/dataloader.py"):
            candidate = frame.f_locals.get("self")
            if hasattr(candidate, "_workers"):
                loader = candidate
                break
        frame = frame.f_back
    if loader is None:
        return None
    info: dict[str, Any] = {"site": None, "workers": [], "worker_id": None, "worker_pid": None, "worker_stack": []}
    with contextlib.suppress(Exception):
        info["workers"] = [int(w.pid) for w in loader._workers if w.pid is not None]
        task = loader._task_info.get(loader._rcvd_idx)
        if task is not None and len(task) == 1:
            info["worker_id"] = int(task[0])
            info["worker_pid"] = info["workers"][task[0]]
    if info["worker_pid"] is not None:
        info["worker_stack"] = py_spy_stack(info["worker_pid"])
    return info


def py_spy_stack(pid: int) -> list[str]:
    """Another process's main-thread stack, outermost first ('file:line in function'), by py-spy; one line
    saying why when it cannot be read."""
    from ddpdoctor.errors import DoctorError
    from ddpdoctor.stacks import discover, dump_all

    try:
        (proc,) = dump_all(discover([pid]), timeout=PY_SPY_S, die_with_parent=False)
    except (DoctorError, OSError, ValueError) as exc:
        return [f"(no stack: {exc})"]
    main = proc.main_thread()
    if proc.error or main is None:
        return [f"(no stack: {proc.error or 'no Python threads'})"]
    frames = list(reversed(main.frames))
    # A forked worker's stack starts with its parent's frames up to the fork: its own life starts at
    # multiprocessing's _bootstrap.
    start = max((i for i, f in enumerate(frames) if f.function.endswith("_bootstrap")), default=-1)
    return [frame.where() for frame in frames[start + 1:]]


def _end(line: str, code: int = 1) -> None:
    """End this process now, from the watchdog thread. Saying why is best effort: a supervisor killed
    with SIGKILL took the read end of this process's output pipes along (a write raises EPIPE), and the
    process must end all the same, or it is an orphan nobody stops."""
    with contextlib.suppress(OSError, ValueError):
        if line:
            print(line, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def line_buffered_if_piped() -> None:
    """As on a terminal: each line leaves the process when it is printed (see :data:`PIPED_ENV`)."""
    if os.environ.get(PIPED_ENV) != "1":
        return
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(line_buffering=True)


def dump_flight_recorder(path: str) -> str:
    """Write this process's PyTorch Flight Recorder dump (pickle bytes, as torch writes them) to ``path``.

    Returns '' when written, else why not. ``_dump_fr_trace(include_collectives, include_stack_traces,
    only_active)`` covers every backend on torch >= 2.8 (gloo included); older torch has
    ``_dump_nccl_trace`` for NCCL only. Both are private: absent or failing means "no dump", never an error.
    """
    try:
        import torch._C._distributed_c10d as c10d_c
        import torch.distributed as dist

        if not dist.is_initialized():
            # Still inside init_process_group (a rendezvous that never completes, an init conflict): no
            # process group recorded anything, and an empty dump would read as "no collectives" to `fr`.
            return "no process group yet: init_process_group had not returned"
        dump = getattr(c10d_c, "_dump_fr_trace", None) or getattr(c10d_c, "_dump_nccl_trace", None)
        if dump is None:
            return "this torch has no Flight Recorder dump function"
        data = dump(True, True, False)
    except Exception as exc:  # private API: any failure only costs the dump
        return f"Flight Recorder dump failed: {typed_error(exc)[:200]}"
    from ddpdoctor import outputs
    from ddpdoctor.errors import DoctorError

    try:
        # On another host than rank 0's (torchrun, several nodes) the bundle's folder is created here.
        os.makedirs(os.path.dirname(path), exist_ok=True)
        outputs.write_bytes(outputs.resolve("--evidence", path, outputs.FR_DUMP), bytes(data))
    except (OSError, DoctorError) as exc:
        return f"cannot write {path}: {exc}"
    return ""


class Watchdog(threading.Thread):
    """Ships records and progress every tick; answers 'dump' with the main thread's stack."""

    def __init__(self, recorder: Recorder, pitfalls: PitfallLog | None, address: str, exit_on_lost: bool,
                 key: int | None = None, bind_on_init: bool = False, hello: dict[str, Any] | None = None,
                 lost_after_s: float | None = None, on_lost: LostContact | None = None) -> None:
        super().__init__(name="ddpdoctor-watchdog", daemon=True)
        self.recorder = recorder
        self.pitfalls = pitfalls
        self.address = address
        self.exit_on_lost = exit_on_lost
        # The channel identity: the rank, or (a process the script started, whose rank is known only once
        # it calls init_process_group) -pid until its init claim binds it to the rank it claims.
        self.key = recorder.rank if key is None else key
        self.bind_on_init = bind_on_init
        self.hello_extra = hello or {}
        self.client: Client | None = None
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.settled = threading.Event()  # the connection attempt ended, either way
        self._sent: tuple[int, int, int, bool] = (-1, -1, -1, False)  # (calls, completions, in flight, started)
        self._sent_at = 0.0
        self._main_ident = threading.main_thread().ident
        # Under a launcher, on another host than the supervisor's: silence from it for ``lost_after_s`` (its
        # pings stopped: a cut link, a lost host) calls ``on_lost`` -- this host's own verdict. Armed by the
        # first ping, so a supervisor that sends none never triggers it.
        self.lost_after_s = lost_after_s
        self.on_lost = on_lost
        self.sup_heard: float | None = None
        self.sup_hosts: dict[str, list[int]] = {}
        self.sup_decided = False

    def run(self) -> None:
        try:
            if not self.address:
                raise OSError("no channel address")  # the launcher-side lookup already said why
            # Self-launched, the channel exists before this rank does: refusal means the supervisor died.
            self.client = Client.connect(self.address, 15 if self.exit_on_lost else 60)
        except OSError as exc:
            if self.exit_on_lost:
                # The self-launching supervisor listens before it starts any rank: no channel means it
                # is gone (killed), and a rank running on unwatched would be an orphan nobody ends.
                _end(f"ddpdoctor watch: rank {self.recorder.rank}: the supervisor's channel at {self.address} "
                     f"is gone ({exc}); ending this rank")
            if self.address:
                print(f"ddpdoctor watch: rank {self.recorder.rank}: cannot reach the watch channel at "
                      f"{self.address} ({exc}); this rank runs unwatched", file=sys.stderr)
            self.settled.set()
            while not self.stopping.wait(TICK_S):
                self.recorder.pending.clear()
            return
        self.client.send({"t": "hello", "rank": self.key, "pid": os.getpid(),
                          "host": socket.gethostname(), "world_size": self.recorder.world_size, **self.hello_extra})
        self.connected.set()
        self.settled.set()
        while not self.stopping.is_set():
            self.recorder.completions.poll()
            self.flush()
            messages = self.client.receive(TICK_S)
            if messages is None:
                if self.exit_on_lost:
                    _end(f"ddpdoctor watch: rank {self.recorder.rank}: the supervisor is gone; ending this rank")
                # Closed while this script runs: the supervisor's process is gone (a verdict would have ended
                # every rank first, a clean end comes after this rank's own exit message): rank 0 was killed,
                # or its host went down and reset the connection. Nothing more will come: say so now.
                if self.on_lost is not None and self.sup_heard is not None and not self.stopping.is_set():
                    on_lost, self.on_lost = self.on_lost, None
                    silent = time.monotonic() - self.sup_heard
                    on_lost(time.time() - silent, silent, dict(self.sup_hosts))
                return
            if messages and (self.sup_heard is not None or any(m.get("t") == "ping" for m in messages)):
                self.sup_heard = time.monotonic()  # any word from the supervisor; armed by its first ping
            for message in messages:
                self.handle(message)
            self._check_contact()

    def _check_contact(self) -> None:
        """Call ``on_lost`` once the supervisor has been silent past the deadline (longer while it writes a
        verdict it announced: stacks and the bundle take seconds, and its exit message follows)."""
        if self.on_lost is None or self.lost_after_s is None or self.sup_heard is None:
            return
        limit = self.lost_after_s + (VERDICT_GRACE_S if self.sup_decided else 0.0)
        silent = time.monotonic() - self.sup_heard
        if silent >= limit:
            on_lost, self.on_lost = self.on_lost, None
            on_lost(time.time() - silent, silent, dict(self.sup_hosts))

    def findings(self) -> list[dict[str, Any]]:
        """The pitfall log's observations (none yet while torch is still being imported)."""
        return self.pitfalls.findings() if self.pitfalls is not None else []

    def on_init(self, claim: dict[str, Any]) -> None:
        """The recorder's init hook (main thread, before torch's rendezvous): send the claim first."""
        if self.bind_on_init and isinstance(claim.get("rank"), int) and claim["rank"] >= 0:
            self.recorder.rank = claim["rank"]
            self.recorder.world_size = claim["world_size"] if isinstance(claim.get("world_size"), int) else -1
        if not self.settled.wait(INIT_CONNECT_S) or self.client is None:
            return
        self.client.send({"t": "init", "claim": claim, "bind": self.bind_on_init, "rank": claim.get("rank")})

    def handle(self, message: dict[str, Any]) -> None:
        assert self.client is not None
        if message.get("t") == "dump":
            self.recorder.completions.poll()
            self.flush(force=True)
            frame = sys._current_frames().get(self._main_ident or -1)
            _count, inflight = self.recorder.completions.snapshot(limit=VERDICT_INFLIGHT)
            reply: dict[str, Any] = {"t": "stack", "stack": user_stack(frame) if frame is not None else [],
                                     "frames": frames_of(frame), "inflight": inflight,
                                     "pitfalls": self.findings()}
            loader = dataloader_wait(frame)
            if loader is not None:
                reply["loader"] = loader
            fr_path = message.get("fr_path")
            if fr_path and self.recorder.claim is not None:
                reply["fr"] = dump_flight_recorder(fr_path) or fr_path
            self.client.send(reply)
        elif message.get("t") == "exit":
            _end("", int(message.get("code", 1)))
        elif message.get("t") == "unwatched":
            self.on_lost = None  # the supervisor failed and the job runs on unwatched: its silence means nothing
        elif message.get("t") == "ping":
            hosts = message.get("hosts")
            if isinstance(hosts, dict):
                self.sup_hosts = {str(h): [r for r in rs if isinstance(r, int)] for h, rs in hosts.items()
                                  if isinstance(rs, list)}
            self.sup_decided = bool(message.get("verdict"))

    def flush(self, force: bool = False) -> None:
        """Send new records, then a beat when progress moved (or once a second)."""
        client, rec = self.client, self.recorder
        if client is None:
            return
        while rec.pending:
            # In batches: the supervisor refuses lines over channel.MAX_LINE as garbage.
            records: list[dict[str, Any]] = []
            while rec.pending and len(records) < RECORDS_PER_MESSAGE:
                records.append(rec.pending.popleft().to_json())
            client.send({"t": "rec", "recs": records})
        now = time.monotonic()
        inflight_n, inflight = rec.completions.snapshot()
        state = (rec.progress, rec.completions.done, inflight_n, rec.started)
        if force or state != self._sent or now - self._sent_at >= BEAT_S:
            current, last = rec.current, rec.last_done
            client.send({"t": "beat", "progress": state[0], "done": state[1], "inflight_n": inflight_n,
                         "started": rec.started,
                         "inflight": inflight, "cur": current.to_json() if current is not None else None,
                         "last": last.to_json() if last is not None else None, "seqs": rec.group_seqs(),
                         "steps": rec.step_stats()})
            self._sent, self._sent_at = state, now

    def finish(self, code: int, crashed: bool, error: str, ended_at: float | None = None) -> None:
        """Called by the main thread when the script ended: last records, then the exit message.

        ``at`` is the wall-clock time the script ended (before this rank's interpreter shutdown, which may
        take seconds): the supervisor orders failures by it, so a rank whose peers broke only because it
        left is not the one named first."""
        ended_at = time.time() if ended_at is None else ended_at
        self.stopping.set()
        self.join(timeout=2 * TICK_S + 1)
        if self.client is None or not self.connected.is_set():
            return
        if code != 0 and self.on_lost is not None and self.sup_heard is not None and self._supervisor_gone():
            # The script failed because the supervisor's host went away (its collective's peer reset the
            # connection): this host's verdict, before the launcher sees the failure.
            on_lost, self.on_lost = self.on_lost, None
            silent = time.monotonic() - self.sup_heard
            on_lost(time.time() - silent, silent, dict(self.sup_hosts))
        # The thread's last poll may predate the script's own end (a final torch.cuda.synchronize()): the
        # calls that completed since must not reach the report as still in flight (an H200 run read 85).
        self.recorder.completions.poll()
        self.flush(force=True)
        self.client.send({"t": "exit", "code": code, "crashed": crashed, "error": error, "at": ended_at,
                          "sent": time.time(), "pitfalls": self.findings()})

    def _supervisor_gone(self) -> bool:
        """The supervisor's end of the channel has closed without it ending this rank (read what is left of it,
        without waiting).

        A supervisor that reached its verdict ends every rank (an ``exit`` message) and then closes: when this
        rank's script failed first (its peer on a lost host reset the connection), the thread that would have
        obeyed that message has stopped, and the message is only read here. It is not a lost supervisor: a third,
        healthy host wrote "LOST CONTACT with nodeA" while nodeA was reporting nodeB lost (an explorer's lab run)."""
        assert self.client is not None
        for _ in range(4):
            if self.client.closed:
                return True
            messages = self.client.receive(0.05)
            if messages is None:
                return True
            if any(message.get("t") == "exit" for message in messages):
                return False
            if not messages:
                return False
        return False


FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_ENTRIES = "2000"


def enable_flight_recorder() -> None:
    """Turn PyTorch's Flight Recorder on (2000 entries) unless the user chose a size: torch reads these
    variables when a process group is created, so setting them before the script runs is enough.
    TORCH_NCCL_TRACE_BUFFER_SIZE is the older (NCCL-only) name; torch 2.8+ reads TORCH_FR_BUFFER_SIZE and
    warns that the old name is deprecated, so the old name is set only for older torch."""
    if any(name in os.environ for name in FR_ENV):
        return
    os.environ["TORCH_FR_BUFFER_SIZE"] = FR_ENTRIES
    try:
        from importlib.metadata import version

        major, minor = (int(part) for part in version("torch").split(".")[:2])
    except Exception:  # an odd version string or no metadata: set both names, a warning at worst
        major, minor = 0, 0
    if (major, minor) < (2, 8):
        os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = FR_ENTRIES
