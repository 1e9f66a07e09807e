"""`ddpdoctor watch`: run an unmodified training script on N ranks and explain its hang in seconds.

Two ways to run:

- **self-launch** (no launcher in the environment): this process is the supervisor. It hosts the side
  channel (``watch_channel``), starts ``python -m ddpdoctor.watch.rank script.py args`` once per rank
  with torchrun's environment variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), each rank in
  its own session so its whole process tree can be killed, and watches. torch's elastic launcher is not
  used here: it tears the job down the moment one rank fails, before the other ranks' stacks are read.
- **under a launcher** (``torchrun ... -m ddpdoctor watch script.py``): every rank runs the script
  in-process; rank 0 also hosts the channel in a thread and plays the supervisor. On a verdict it
  tells every rank to exit, and the launcher sees the failure. The channel's port: ``DDPDOCTOR_WATCH_PORT``
  when set; else, under torchrun (whose agent hosts a TCPStore at MASTER_ADDR:MASTER_PORT for every
  rank, ``TORCHELASTIC_USE_AGENT_STORE``), any free port, published in that store; else MASTER_PORT+1.

- **the script starts its ranks itself** (``mp.spawn``, a ``Process`` per rank; recognised from its source
  by :func:`~ddpdoctor.watch.spawned.spawn_sites`): self-launch starts the script *once*, as
  ``python -m ddpdoctor.watch.rank`` in spawn mode, and every process it starts reports on the channel
  and becomes the rank its ``init_process_group`` claims (see :mod:`~ddpdoctor.watch.spawned`).

Either way the verdict is one report on stderr (and ``--json``; ``--json -`` prints the JSON on stdout instead),
the evidence bundle is written (:mod:`~ddpdoctor.watch.evidence`), then every rank is torn down.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from ddpdoctor.errors import EXIT_BUG, EXIT_PROBLEM, DoctorError, short_error
from ddpdoctor.ranks import rank_phrase
from ddpdoctor.runtime.launcher import LaunchInfo, port_from_env, torchrun_env
from ddpdoctor.watch import evidence
from ddpdoctor.watch.aggregate import CRASH, HANG, INIT_CONFLICT, OK, Aggregator
from ddpdoctor.watch.channel import ADDR_ENV, Server
from ddpdoctor.watch.config import WatchConfig
from ddpdoctor.watch.known_errors import known_cause, known_cause_in_output, warm_up
from ddpdoctor.watch.output import RankOutput
from ddpdoctor.watch.reaper import Teardown, die_with_supervisor
from ddpdoctor.watch.recorder import site_name
from ddpdoctor.watch.report import render
from ddpdoctor.watch.script import local_end, run_script
from ddpdoctor.watch.verdict import silent_hosts
from ddpdoctor.watch.waits import is_user_file, moved_on
from ddpdoctor.watch.watchdog import EXIT_ON_LOST_ENV, MODE_ENV, PIPED_ENV

PORT_ENV = "DDPDOCTOR_WATCH_PORT"
POLL_S = 0.05
# How long the ranks get to answer with their stacks (a rank in a DataLoader wait reads its worker's with
# py-spy first, up to watchdog.PY_SPY_S); ranks that stay silent are then read with py-spy from here.
STACK_WAIT_S = 8.0
PY_SPY_S = 5.0
STORE_WAIT_S = 120.0
# A rank waiting for rank 0's channel port says so (see _published_channel_port) after this many seconds,
# then once per WAIT_LOG_EVERY_S when stderr is a log.
WAIT_SHOWN_AFTER_S = 10.0
WAIT_LOG_EVERY_S = 10.0
# A rank gives up on the channel after the store wait plus its 60 s of connect retries.
UNWATCHED_AFTER_S = STORE_WAIT_S + 80.0
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                  "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def check_script(script: str) -> str:
    """The script's path, or a DoctorError saying what is wrong with it.

    Only a readable regular file passes: a FIFO would block the source scan (and every rank) forever, a
    device would be read without end."""
    import stat

    try:
        mode = os.stat(script).st_mode
    except FileNotFoundError:
        raise DoctorError(f"script not found: {script!r} (usage: ddpdoctor watch [OPTIONS] script.py [args...])") from None
    except OSError as exc:
        raise DoctorError(f"cannot read the script {script!r}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise DoctorError(f"{script!r} is a directory; give the training script's path")
    if not stat.S_ISREG(mode):
        raise DoctorError(f"{script!r} is not a regular file (a FIFO, socket or device); give the training "
                          "script's path")
    if not os.access(script, os.R_OK):
        raise DoctorError(f"cannot read the script {script!r}: permission denied")
    return script


def write_result(result: dict[str, Any], json_path: str | None, agg: Aggregator | None = None,
                 output: RankOutput | None = None) -> None:
    """The evidence bundle (failed runs), the report on stderr, then --json (``--json -``: the JSON on
    stdout instead of the report). A failed write is one line, not an exception: in rank 0's supervisor
    thread an exception would skip telling the other ranks to exit, and hang the job."""
    from ddpdoctor.outputs import emit_json, json_to_stdout

    if result.get("status") != OK:
        join_other_evidence(result)
    if result.get("status") == CRASH:
        by_rank = {r["rank"]: r for r in result["ranks"]}
        first = by_rank.get((result.get("crash_order") or [None])[0])
        # After a rank's clean early exit the first failure is its echo: explain's advice for that ("look at the
        # other ranks' logs") would send the reader to a log with nothing in it; the report names the exit.
        echo_only = result.get("early_exit") is not None
        result["known_cause"] = known_cause(first["error"], first["rank"]) if first and not echo_only else None
        if first and first.get("signal") and output is not None and result["known_cause"] is None:
            # A rank killed by a signal left no exception; what it printed last may say why (gloo's abort).
            result["known_cause"] = known_cause_in_output(output.tail_text(first["rank"]), first["rank"])
    histories = {r: list(s.history) for r, s in agg.ranks.items()} if agg is not None else {}
    outputs = {rank: output.tail_text(rank) for rank in output.tails} if output is not None else {}
    bundle = evidence.planned(result, histories, outputs) if agg is not None and result.get("evidence") else None
    text = render(result, bundle)
    # The report and --json first, the bundle after: the bundle's env.json alone can take seconds on a busy
    # node, and under torchrun the launcher may end this process soon after another rank failed.
    if not json_to_stdout(json_path):
        print(text, file=sys.stderr, flush=True)
    if json_path:
        try:
            emit_json(json_path, result, "watch")
        except (OSError, DoctorError) as exc:
            print(f"ddpdoctor watch: cannot write --json {json_path}: {exc}", file=sys.stderr, flush=True)
    if agg is not None and result.get("evidence"):
        try:
            evidence.write(result["evidence"], result, text, histories, outputs)
        except Exception as exc:  # the report on the terminal matters more than the bundle
            print(f"ddpdoctor watch: cannot write the evidence bundle ({short_error(exc)})", file=sys.stderr, flush=True)


def join_other_evidence(result: dict[str, Any]) -> None:
    """What PyTorch and NCCL themselves recorded, next to watch's own verdict on a failed run.

    - ``fr``: the verdict of ``ddpdoctor fr`` over the Flight Recorder dumps the ranks just wrote into the
      evidence bundle (its own account of which rank diverged, from PyTorch's ring buffer rather than from
      our recorder; the two agreeing is strong evidence, disagreeing is worth a look).
    - ``ras``: NCCL's RAS service (NCCL >= 2.24), asked once with a 1 s deadline when ``NCCL_RAS_ADDR`` is set
      or its default port answers: which ranks NCCL itself sees as dead or unresponsive.

    Neither may cost the report: a failure becomes a line in the result, never an exception.
    """
    from ddpdoctor.fr import diagnose
    from ddpdoctor.fr import to_json as fr_json
    from ddpdoctor.ras import probe
    from ddpdoctor.ras import to_json as ras_json
    from ddpdoctor.watch.verdict import weigh_flight_recorder

    folder = result.get("evidence")
    dumps = os.path.join(folder, evidence.FR_FOLDER) if folder else None
    # An init conflict stops the job before any rendezvous: there is no process group whose record could
    # say anything, and `fr` would count the ranks the conflicting claims name but that never existed.
    if result.get("status") != INIT_CONFLICT and dumps and os.path.isdir(dumps) and os.listdir(dumps):
        try:
            verdict = fr_json(diagnose([dumps], world_size=result.get("world_size") or None))
            result["fr"] = {"status": verdict["status"], "summary": verdict["summary"],
                            "missing_ranks": verdict["missing_ranks"], "path": dumps}
        except Exception as exc:  # a dump cut short by the teardown, a format we do not know
            result["fr"] = {"status": "error", "summary": f"could not read the dumps: {short_error(exc)}",
                            "missing_ranks": [], "path": dumps}
    weigh_flight_recorder(result.get("failure"), result.get("fr"))
    ras = probe(deadline_s=1.0)
    if ras is not None:
        result["ras"] = ras_json(ras)


def _drain(server: Server, agg: Aggregator, timeout: float) -> None:
    """Feed every message already waiting (a rank's last words arrive just before it exits); keep the ranks
    on other hosts told that the supervisor is alive (:meth:`Server.keepalive`)."""
    from ddpdoctor.watch.verdict import hosts_of

    server.keepalive(hosts_of(agg.ranks), agg.decided_at is not None)
    for _ in range(20):
        events = server.poll(timeout)
        if not events:
            return
        for rank, message in events:
            agg.feed(rank, message)
        timeout = 0.0


def _report_malformed(server: Server) -> None:
    line = server.malformed_line()
    if line:
        print(line, file=sys.stderr, flush=True)


def _note_exits(config: WatchConfig, procs: list[subprocess.Popen[bytes]], server: Server, agg: Aggregator) -> None:
    """The OS's word on the processes we started: a rank (or the launcher of a script's own mp.spawn)
    that exited, with its exit status, after its last messages."""
    if config.spawns:
        if agg.launcher_code is None and procs and procs[0].poll() is not None:
            _drain(server, agg, POLL_S)
            agg.launcher_exited(procs[0].returncode)
        return
    for rank, proc in enumerate(procs):
        if agg.ranks[rank].returncode is None and proc.poll() is not None:
            _drain(server, agg, POLL_S)
            agg.process_exited(rank, proc.returncode)


def collect_stacks(server: Server, agg: Aggregator, folder: str | None = None,
                   note_exits: Callable[[], None] | None = None) -> None:
    """Ask every connected rank (and spawned process without a rank) for its main thread's stack, and
    with an evidence folder for its Flight Recorder dump there; wait a little for the answers.

    ``note_exits`` keeps the exits of the processes we started up to date during the wait: a rank that
    exits after the verdict (a shape mismatch raises on every rank) will not answer, and without it the
    wait ran its full STACK_WAIT_S and py-spy was then pointed at a process that was gone."""
    from ddpdoctor.watch.verdict import hosts_of, silent_ranks

    # Ranks on another host that stopped reporting (a cut link) are asked too, but not waited for.
    silent = silent_ranks(agg, agg.verdict_time()) if len(hosts_of(agg.ranks)) > 1 else {}
    asked = [r for r, s in agg.ranks.items() if not s.finished and r in server.ranks and r not in silent]
    for rank in [*asked, *(r for r in silent if r in server.ranks)]:
        agg.ranks[rank].stack = None if rank in asked else agg.ranks[rank].stack
        server.send(rank, {"t": "dump", **({"fr_path": evidence.fr_path(folder, rank)} if folder else {})})
    procs = [k for k, p in agg.procs.items() if not p.finished and k in server.ranks]
    for key in procs:
        server.send(key, {"t": "dump"})
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline:
        if note_exits is not None:
            note_exits()
        if all(agg.ranks[r].stack is not None or agg.ranks[r].finished for r in asked) and \
                all(agg.procs[k].stack is not None or agg.procs[k].finished for k in procs if k in agg.procs):
            break
        _drain(server, agg, POLL_S)
    unanswered = [s for s in agg.ranks.values() if s.connected and not s.finished and s.stack is None and s.pid
                  and s.host in ("", socket.gethostname())]
    if unanswered:
        stacks_by_py_spy(unanswered)


def stacks_by_py_spy(states: list[Any]) -> None:
    """Ranks on this host that did not answer (their main thread holds the GIL in C code, so their
    watchdog thread cannot run): their stacks read from outside with py-spy, the ``stacks`` engine's way."""
    import linecache

    from ddpdoctor.stacks import discover, dump_all

    by_pid = {state.pid: state for state in states}
    try:
        dumped = dump_all(discover(list(by_pid)), timeout=PY_SPY_S, die_with_parent=False)
    except DoctorError as exc:  # py-spy not installed
        for state in states:
            state.stack = [f"(no stack: the rank did not answer, and {exc})"]
        return
    for proc in dumped:
        state = by_pid[proc.pid]
        main = proc.main_thread()
        if proc.error or main is None:
            state.stack = [f"(no stack: the rank did not answer, and py-spy: {proc.error or 'no Python threads'})"]
            continue
        frames = list(reversed(main.frames))  # outermost first, as the ranks send theirs
        state.frames = [[f.file, f.line, f.function, linecache.getline(f.file, f.line).strip()] for f in frames]
        state.stack = [f"{site_name(f.file)}:{f.line} in {f.function}" for f in frames if is_user_file(f.file)]
        if moved_on(state.cur, [f"{f.file}:{f.line}" for f in frames]):
            state.cur = None  # its stack, read now, is where it is: the call it last reported has returned


# -- self-launch -----------------------------------------------------------------------------------

def _rank_env(rank: int, nproc: int, job_port: int, channel: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS and not k.startswith("TORCHELASTIC_")}
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
               GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(job_port))
    if nproc > 1 and "OMP_NUM_THREADS" not in env:
        # As torchrun does (torch/distributed/run.py): N ranks each using every core would oversubscribe
        # the CPU many times over, and a watched run must perform like a torchrun one.
        env["OMP_NUM_THREADS"] = "1"
    env[ADDR_ENV] = channel
    env[EXIT_ON_LOST_ENV] = "1"
    return env


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted(signum)


def _launcher_env(channel: str, master_port: int | None) -> dict[str, str]:
    """The environment of a script that starts its own ranks: the user's own, plus the channel."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS and not k.startswith("TORCHELASTIC_")}
    if master_port is not None:
        env["MASTER_PORT"] = str(master_port)
    env.update({ADDR_ENV: channel, EXIT_ON_LOST_ENV: "1", MODE_ENV: "spawn"})
    return env


def _say(config: WatchConfig, line: str) -> None:
    """A note while the job runs (on stderr); ``--quiet`` keeps only the verdict."""
    if not config.quiet:
        print(line, file=sys.stderr, flush=True)


def _check_rendezvous(agg: Aggregator, host: str, port: int | None, rank0_hosts: bool) -> None:
    """At a hang with ranks inside init_process_group: read the job's store for who arrived."""
    if not agg.in_rendezvous():
        return
    from ddpdoctor.stacks import read_store

    agg.note_rendezvous(read_store(host, port) if port else None, rank0_hosts)


def _start(config: WatchConfig, channel: str, output: RankOutput, procs: list[subprocess.Popen[bytes]]) -> int | None:
    """Start the ranks (or the script once), each in a session of its own with its output piped to us, into
    ``procs`` as they start (a signal meanwhile must not lose one); the job's MASTER_PORT (None for a script
    that starts its own ranks)."""
    from ddpdoctor.runtime.selflaunch import choose_port

    rank_cmd = [sys.executable, "-m", "ddpdoctor.watch.rank", config.script, *config.args]
    plan: list[tuple[int | None, dict[str, str]]]
    port = None
    if config.spawns:
        plan = [(None, _launcher_env(channel, config.master_port))]
    else:
        port = choose_port(config.master_port if config.master_port is not None else port_from_env("MASTER_PORT"))
        plan = [(rank, _rank_env(rank, config.nproc, port, channel)) for rank in range(config.nproc)]
    preexec = die_with_supervisor()
    for rank, env in plan:
        out, err = output.pipes(rank)
        env[PIPED_ENV] = "1"
        try:
            procs.append(subprocess.Popen(rank_cmd, env=env, stdout=out, stderr=err, start_new_session=True,
                                          preexec_fn=preexec))
        finally:
            os.close(out)
            os.close(err)
    return port


def supervise(config: WatchConfig) -> int:
    """Self-launch ``config.nproc`` ranks of the script (or, ``config.spawns``, the script once: it starts
    its own ranks), watch them, report; the exit code.

    The job's MASTER_PORT is ``master_port``, else $MASTER_PORT, else a free port (as for ``check``). The
    run ends the way torchrun ends one (:meth:`~ddpdoctor.watch.reaper.Reaper.teardown`): SIGTERM, the
    grace, SIGKILL; a SIGINT/SIGTERM to watch itself does the same and exits 128 + the signal.
    """
    from ddpdoctor.watch.reaper import Reaper

    output = RankOutput(config.output)
    output.prepare(1 if config.spawns else config.nproc)
    if output.run_dir is not None:
        _say(config, f"ddpdoctor watch: the ranks' logs go to {output.run_dir}/attempt_0/<rank>/")
    server = Server("127.0.0.1", 0)
    channel = f"127.0.0.1:{server.port}"
    warm_up()  # a crash verdict asks explain: built now, not when torchrun is tearing the job down
    agg = Aggregator(0 if config.spawns else config.nproc, config.hang_timeout_s, owns_processes=not config.spawns,
                     spawned=config.spawns)
    agg.here = socket.gethostname()
    procs: list[subprocess.Popen[bytes]] = []
    job_port: int | None = None
    previous = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    status: str | None = None
    interrupted: _Interrupted | None = None
    hurry = threading.Event()
    reaper = Reaper()  # before any rank starts: an orphan of theirs must re-parent to us, not to init
    teardown = None
    try:
        try:
            job_port = _start(config, channel, output, procs)
            output.start()
            while status is None:
                _drain(server, agg, POLL_S)
                _note_exits(config, procs, server, agg)
                line = agg.straggler_notice()
                if line:
                    _say(config, line)
                reaper.poll(procs)
                status = agg.verdict()
            if status != OK:
                agg.evidence = evidence.prepare(config.evidence_dir)
                collect_stacks(server, agg, agg.evidence if status != INIT_CONFLICT else None,
                               note_exits=lambda: _note_exits(config, procs, server, agg))
                if status == HANG and not config.spawns:
                    _check_rendezvous(agg, "127.0.0.1", job_port, rank0_hosts=True)
        except _Interrupted as exc:
            interrupted = exc
        # From here a signal only shortens the grace (a second Ctrl-C): the teardown itself must finish.
        for sig in previous:
            signal.signal(sig, lambda signum, frame: hurry.set())
        # Also after a run that ended by itself: a rank's children outlive it otherwise. After a run that
        # ended well, what the script deliberately detached (its own session) is left running.
        teardown = reaper.teardown(procs, config.grace_s, spare_detached=status == OK, hurry=hurry)
    finally:
        try:
            if teardown is None:  # an unexpected error above: still never leave a rank behind
                teardown = reaper.teardown(procs, 0.0)
        finally:
            reaper.close()
            output.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            server.close()
    if interrupted is not None:
        # 128 + the signal, the shell's convention: 130 for Ctrl-C, 143 for a scheduler's SIGTERM.
        raise DoctorError(f"watch interrupted ({interrupted}): {teardown_text(teardown, config.spawns)}",
                          exit_code=128 + interrupted.signum)
    assert status is not None  # the loop ends on a verdict; an interruption raised above
    _report_malformed(server)
    result = agg.result(status)
    result["teardown"] = teardown_json(teardown, agg, config.spawns)
    write_result(result, config.json_path, agg, output)
    return int(result["exit_code"])


def teardown_text(teardown: Teardown, spawns: bool) -> str:
    """'SIGTERM to every rank; rank 1 needed SIGKILL after the 30 s grace' and the like."""
    who = "the script" if spawns else "every rank"
    if teardown.killed:
        late = "the script's process" if spawns else rank_phrase(teardown.killed)
        return (f"SIGTERM to {who}; {late} still ran after the {teardown.grace_s:g} s grace "
                f"(--shutdown-timeout) and needed SIGKILL")
    return f"SIGTERM to {who}; every process ended within the {teardown.grace_s:g} s grace"


def teardown_json(teardown: Teardown, agg: Aggregator, spawns: bool) -> dict[str, Any]:
    """The ``teardown`` object: the grace, what needed SIGKILL (ranks by number, where known), what was
    left running (detached by the script after a run that ended well)."""
    by_pid = {s.pid: r for r, s in agg.ranks.items() if s.pid is not None}
    ranks = [] if spawns else list(teardown.killed)
    others = []
    for proc in teardown.others_killed:
        rank = by_pid.get(proc["pid"])
        if rank is not None and spawns:
            ranks.append(rank)
        else:
            others.append(proc)
    return {"grace_s": teardown.grace_s, "waited_s": teardown.waited_s, "sigkill_ranks": sorted(set(ranks)),
            "sigkill_script": bool(spawns and teardown.killed), "sigkill_others": others,
            "left_running": teardown.left_running}


# -- under a launcher ------------------------------------------------------------------------------

# How long rank 0's supervisor, once another rank's crash decided the verdict, waits for its own rank's end
# (see RankZeroSupervisor._own_crash); well within the 0.1 s torchrun takes to tear rank 0 down.
OWN_EXIT_WAIT_S = 0.05
# How long a crash of rank 0 alone waits for the other ranks' news (see RankZeroSupervisor._own_crash_settling).
OWN_CRASH_SETTLE_S = 0.5


class RankZeroSupervisor(threading.Thread):
    """Rank 0's thread under torchrun/SLURM: the channel server and the verdicts."""

    def __init__(self, server: Server, world_size: int, config: WatchConfig) -> None:
        super().__init__(name="ddpdoctor-watch-supervisor", daemon=True)
        self.server = server
        self.config = config
        warm_up()
        self.agg = Aggregator(world_size, config.hang_timeout_s)
        self.json_path = config.json_path
        self.evidence_dir = config.evidence_dir
        self.store: tuple[str, int, bool] | None = None  # the job's store (host, port, hosted by torchrun's agent)
        self.done = threading.Event()
        self.exit_code = 0

    def run(self) -> None:
        try:
            self._supervise()
        except Exception as exc:  # a bug here must not leave rank 0 waiting on `done` forever
            print(f"ddpdoctor watch: the supervisor failed ({type(exc).__name__}: {short_error(exc)}); the job runs unwatched from here",
                  file=sys.stderr, flush=True)
            self.exit_code = EXIT_BUG
            for rank in list(self.server.ranks):  # its keep-alive stops: that must not read as a lost host
                self.server.send(rank, {"t": "unwatched"})
        finally:
            self.done.set()

    def _supervise(self) -> None:
        status = None
        started = time.monotonic()
        self.agg.here = socket.gethostname()
        while status is None:
            _drain(self.server, self.agg, POLL_S)
            if time.monotonic() - started > UNWATCHED_AFTER_S:
                self._give_up_on_unconnected()
            line = self.agg.straggler_notice()
            if line:
                _say(self.config, line)
            status = self.agg.verdict()
            if status is None and any(s.failed for s in self.agg.ranks.values()):
                # The launcher tears the job down within its monitor interval (0.1 s for torchrun)
                # once a rank has died: report now, without stacks, or never.
                status = CRASH
            if status == CRASH and self._own_crash_settling():
                # Rank 0 (this process) failed first: no launcher tears anything down before another rank
                # exits, and that rank's exit message comes first. Ranks that raised at the same moment (a bug
                # every rank hits) are named as such, not as "torn down".
                status = None
            if status == CRASH and self.agg.host_settling():
                # A rank on another host vanished and its host's other ranks may follow within
                # milliseconds: a host that went down whole is named as one (verdict.HOST_WINDOW_S at most).
                status = None
        if status == CRASH:
            self._own_crash()
        if status != OK:
            self.agg.evidence = evidence.prepare(self.evidence_dir)
            if status != CRASH:
                # A host cut off (every rank there silent): the survivors' stacks, but not their Flight
                # Recorder dumps, which take seconds each on a busy node; the verdict is due within the hang
                # timeout + 10 s, and what the dumps would show (the collective nobody completes) is known.
                cut_off = bool(silent_hosts(self.agg, self.agg.here or "", self.agg.verdict_time()))
                collect_stacks(self.server, self.agg, None if cut_off else self.agg.evidence)
            if status == HANG and self.store is not None:
                _check_rendezvous(self.agg, self.store[0], self.store[1], rank0_hosts=not self.store[2])
        _report_malformed(self.server)
        result = self.agg.result(status)
        self.exit_code = int(result["exit_code"])
        write_result(result, self.json_path, self.agg)
        if status != OK:
            # Every other rank ends itself on this message; the launcher then sees the failure.
            for rank in list(self.server.ranks):
                if rank != 0:
                    self.server.send(rank, {"t": "exit", "code": EXIT_PROBLEM})
            sys.stdout.flush()
            os._exit(EXIT_PROBLEM)

    def _own_crash_settling(self, now: float | None = None) -> bool:
        """Only rank 0 has failed, less than OWN_CRASH_SETTLE_S ago, and another rank is still live."""
        now = time.monotonic() if now is None else now
        ranks = self.agg.ranks
        if [r for r, s in ranks.items() if s.failed] != [0] or all(s.finished for r, s in ranks.items() if r != 0):
            return False
        ended = ranks[0].ended_at
        return ended is not None and now - ended < OWN_CRASH_SETTLE_S

    def _own_crash(self) -> None:
        """Rank 0's own failure, when its script (in this process) ended badly at about the moment another
        rank's did but its exit message has not arrived: read from the process itself (``script.local_end``),
        so a job whose ranks all raised names every one of them rather than "the rest were torn down"."""
        state = self.agg.ranks.get(0)
        if state is None or state.said_exit:
            return
        # Rank 0's script, when it fails with the others, ends within milliseconds of them, and its own message
        # (with the records sent just before it: "last completed") follows; the launcher's teardown after the
        # other rank's exit is about 0.1 s away (that rank's interpreter shutdown, then torchrun's monitor tick).
        deadline = time.monotonic() + OWN_EXIT_WAIT_S
        while not state.said_exit and time.monotonic() < deadline:
            _drain(self.server, self.agg, 0.01)
        end = local_end()
        if not state.said_exit and end is not None and end["code"] != 0:
            self.agg.feed(0, {**end, "sent": time.time()})

    def _give_up_on_unconnected(self) -> None:
        """A rank that never reached the channel (a firewall between nodes) runs unwatched to its end;
        waiting for its exit message would keep rank 0, and so the whole job, alive forever."""
        for state in self.agg.ranks.values():
            if not state.connected and not state.finished:
                state.said_exit = True
                state.error = "never reached the watch channel; it ran unwatched"
                print(f"ddpdoctor watch: rank {state.rank} never reached the watch channel within "
                      f"{UNWATCHED_AFTER_S:g} s; it runs unwatched", file=sys.stderr, flush=True)


def _channel_key(info: LaunchInfo) -> str:
    return f"ddpdoctor/watch/{info.run_id}/channel_port"  # run_id carries the restart count


def _store_client(info: LaunchInfo) -> Any:
    from ddpdoctor.runtime.control import connect_store, wait_until_reachable

    if not wait_until_reachable(info.master_addr, info.master_port, time.monotonic() + STORE_WAIT_S):
        raise OSError(f"torchrun's store at {info.master_addr}:{info.master_port} is not reachable")
    return connect_store(info, STORE_WAIT_S)


def _store_channel_port(info: LaunchInfo, port: int) -> None:
    """Rank 0: publish the channel's port in torchrun's agent store."""
    try:
        _store_client(info).set(_channel_key(info), str(port))
    except Exception as exc:  # torch raises RuntimeError/DistStoreError subclasses for store failures
        raise DoctorError(f"rank 0 cannot publish the watch channel's port in torchrun's store ({exc}); "
                          f"set {PORT_ENV} to a free port on every rank") from None


def _published_channel_port(info: LaunchInfo) -> int | None:
    """Other ranks: the port rank 0 published, or None (then the rank runs unwatched) after a deadline.

    The wait is shown once it lasts :data:`WAIT_SHOWN_AFTER_S` (one line per :data:`WAIT_LOG_EVERY_S` in a log):
    a rank 0 whose watch refused to start (a bad option on that host) left the other hosts' ranks silent for the
    whole :data:`STORE_WAIT_S`."""
    from ddpdoctor.runtime.control import ControlPlane
    from ddpdoctor.runtime.progress import WaitDisplay

    display = WaitDisplay(show_after_s=WAIT_SHOWN_AFTER_S, log_every_s=WAIT_LOG_EVERY_S)
    display.begin(f"rank {info.rank}: waiting for rank 0's watch to publish its channel in torchrun's store at "
                  f"{info.master_addr}:{info.master_port} (if rank 0's watch did not start, its host's output says "
                  "why)", total_s=STORE_WAIT_S)
    deadline = time.monotonic() + STORE_WAIT_S  # one deadline for reaching the store and for the key in it
    try:
        value = ControlPlane(_store_client(info)).wait_get(_channel_key(info), deadline)
    except Exception as exc:  # as above: the store's own errors
        value, why = None, str(exc)
    else:
        why = f"rank 0 did not publish it within {STORE_WAIT_S:g} s"
    finally:
        display.close()
    if value is None:
        print(f"ddpdoctor watch: rank {info.rank}: no watch channel port in torchrun's store ({why}); "
              "this rank runs unwatched", file=sys.stderr, flush=True)
        return None
    return int(value)


# A rank that lost the supervisor but is not its host's first (LOCAL_RANK 0, which writes the host's verdict)
# ends itself this much later: normally the launcher has ended it by then, after the first one's exit.
FOLLOWER_GRACE_S = 30.0
# Set while this process writes its lost-contact verdict (in the watchdog thread): the script may end meanwhile
# (its collective fails once the peer's connection resets), and the process must not exit under the verdict.
REPORTING = threading.Event()
REPORT_WAIT_S = 30.0


def lost_contact_report(info: LaunchInfo, config: WatchConfig, since: float, silent_s: float,
                        hosts: dict[str, list[int]]) -> None:
    """This host lost the supervisor (rank 0's host, the job's store): its own verdict, its own bundle, and
    the end of its ranks (from the watchdog thread).

    Only LOCAL_RANK 0 writes the verdict and the bundle on this host, then exits 1; the launcher (torchrun's
    agent) then ends the host's other ranks as it ends any failed group: SIGTERM, its grace, SIGKILL. The
    other ranks end themselves :data:`FOLLOWER_GRACE_S` later, when no launcher did."""
    from ddpdoctor import __version__
    from ddpdoctor.watch.recorder import user_stack
    from ddpdoctor.watch.verdict import lost_contact
    from ddpdoctor.watch.watchdog import _end, dump_flight_recorder

    REPORTING.set()
    host = socket.gethostname()
    if info.local_rank != 0:
        time.sleep(FOLLOWER_GRACE_S)
        _end(f"ddpdoctor watch: rank {info.rank} on {host}: lost contact with the watch supervisor at "
             f"{info.master_addr}; ending this rank", EXIT_PROBLEM)
        return
    mine = hosts.get(host) or [info.rank]
    failure = lost_contact(host, mine, info.master_addr, hosts, since, silent_s)
    folder = evidence.prepare(config.evidence_dir)
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    fr = evidence.fr_path(folder, info.rank) if folder else None
    result: dict[str, Any] = {
        "tool": "ddpdoctor", "version": __version__, "command": "watch", "status": "lost_contact",
        "exit_code": EXIT_PROBLEM, "host": host, "world_size": info.world_size, "hang_timeout_s": config.hang_timeout_s,
        "failure": failure, "hosts": failure["hosts"],
        "ranks": [{"rank": info.rank, "state": "running", "pid": os.getpid(), "host": host, "exit_code": None,
                   "signal": None, "error": None, "last_completed": None, "waiting_in": None, "issued": {},
                   "stack": user_stack(frame) if frame is not None else [], "flight_recorder": fr}],
        "evidence": folder,
    }
    # The rank's Flight Recorder dump is written after the verdict is out (below), and named with the bundle.
    bundle = [*evidence.planned(result, {}, {}), os.path.relpath(fr, folder)] if folder and fr else None
    text = render(result, bundle)
    from ddpdoctor.outputs import emit_json, json_to_stdout

    if not json_to_stdout(config.json_path):
        print(text, file=sys.stderr, flush=True)
    if config.json_path:
        try:
            emit_json(config.json_path, result, "watch")
        except (OSError, DoctorError) as exc:
            print(f"ddpdoctor watch: cannot write --json {config.json_path}: {exc}", file=sys.stderr, flush=True)
    if folder and fr:
        # After the verdict is out: the dump (and the bundle's env.json) can take seconds on a busy node.
        result["ranks"][0]["flight_recorder"] = dump_flight_recorder(fr) or fr
        try:
            evidence.write(folder, result, text, {}, {})
        except Exception as exc:  # the verdict on the terminal matters more than the bundle
            print(f"ddpdoctor watch: cannot write the evidence bundle ({short_error(exc)})", file=sys.stderr, flush=True)
    _end("", EXIT_PROBLEM)


def run_under_launcher(info: LaunchInfo, config: WatchConfig) -> int:
    """This process is one rank of a launched job: run the script watched; rank 0 also supervises."""
    fixed = port_from_env(PORT_ENV)
    # A fixed MASTER_PORT+1 collides with whatever else listens there (commonly a second job started
    # with --master-port one higher); the agent's store lets rank 0 take any free port and say which.
    publish = info.agent_store and fixed is None
    if fixed is not None:
        port = fixed
    elif publish:
        port = 0
    elif info.master_port < 65535:
        port = info.master_port + 1
    else:
        raise DoctorError(f"MASTER_PORT is 65535, so the watch channel has no MASTER_PORT+1; "
                          f"set {PORT_ENV} to a free port on every rank")
    supervisor = None
    address = f"{info.master_addr}:{port}"
    if info.rank == 0:
        try:
            server = Server("0.0.0.0", port)
        except OSError as exc:
            raise DoctorError(f"rank 0 cannot listen on port {port} for the watch channel ({exc}); "
                              f"set {PORT_ENV} to a free port on every rank") from None
        if publish:
            _store_channel_port(info, server.port)
        supervisor = RankZeroSupervisor(server, info.world_size, config)
        supervisor.store = (info.master_addr, info.master_port, info.agent_store)
        supervisor.start()
        address = f"127.0.0.1:{server.port}"
    elif publish:
        published = _published_channel_port(info)
        address = f"{info.master_addr}:{published}" if published is not None else ""
    # Under srun/mpirun the script gets torchrun's RANK, WORLD_SIZE, MASTER_ADDR, ... (env:// runs unchanged).
    os.environ.update(torchrun_env(info))
    # Every rank but rank 0 (whose process hosts the supervisor) reaches a verdict of its own host when the
    # supervisor goes silent for the hang timeout (a cut link, rank 0's host lost).
    on_lost = None if info.rank == 0 else functools.partial(lost_contact_report, info, config)
    code = run_script(config.script, config.args, info.rank, info.world_size, address, exit_on_lost=False,
                      lost_after_s=config.hang_timeout_s, on_lost=on_lost)
    if REPORTING.is_set():
        time.sleep(REPORT_WAIT_S)  # the verdict ends this process (os._exit) when it is written
    if supervisor is None:
        return code
    supervisor.done.wait()
    return supervisor.exit_code
