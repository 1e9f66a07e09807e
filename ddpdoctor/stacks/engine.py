"""`ddpdoctor stacks` engine: find this machine's DDP ranks and read their stacks with py-spy.

Never imports torch (it attaches to someone else's stuck job). Discovery goes through psutil
(:mod:`ddpdoctor.stacks.procfs`): torchrun workers carry RANK/LOCAL_RANK and TORCHELASTIC_RUN_ID, SLURM
tasks carry SLURM_PROCID and SLURM_STEP_ID (see :mod:`ddpdoctor.stacks.ident`). Stacks come from
``py-spy dump --json`` (https://github.com/benfred/py-spy#how-does-py-spy-work), one py-spy per rank,
all started at once. py-spy reads the target's memory with ptrace rights, which Yama's ptrace_scope and
container seccomp/capabilities can forbid; then :func:`ptrace_advice` says what to change, and the
in-process signal dumps (:mod:`ddpdoctor.stacks.signal_dumps`) need no ptrace at all.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from ddpdoctor.errors import DoctorError
from ddpdoctor.safejson import loads_untrusted
from ddpdoctor.stacks import procfs
from ddpdoctor.stacks.ident import identity, is_rank_env, job_matches
from ddpdoctor.stacks.model import Frame, Local, ProcessStacks, ThreadStack
from ddpdoctor.stacks.procfs import same_process_alive

# torchrun, `python -m torch.distributed.run` and the deprecated launcher all start ranks as children.
_AGENT_MARKERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
_CAP_SYS_PTRACE = 19  # linux/capability.h
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

FALLBACK_HINT = ("Fallback without ptrace: add `import ddpdoctor; ddpdoctor.install_stack_dumps()` at the "
                 "top of the training script, then run `ddpdoctor stacks --signal`.")
PY_SPY_MISSING = ("py-spy (which reads the ranks' stacks) is not installed next to this Python or on PATH: "
                  "`pip install py-spy`, or use the in-process fallback: `ddpdoctor stacks --signal` (the "
                  "ranks must have called `ddpdoctor.install_stack_dumps()`)")


@dataclass
class Candidate:
    """A process to dump, before its stacks are known; ``create_time`` tells a reused pid from it."""

    proc: ProcessStacks
    create_time: float | None
    uid: int | None


def _is_agent(cmdline: str) -> bool:
    return any(marker in cmdline for marker in _AGENT_MARKERS)


def _joined(cmdline: list[str] | None) -> str:
    return " ".join(cmdline or [])


def _candidate(proc: psutil.Process, env: dict[str, str] | None, host: str, start: float | None,
               cmdline: list[str] | None) -> Candidate:
    ident = identity(env or {})
    env = env or {}
    store = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if "MASTER_ADDR" in env and "MASTER_PORT" in env else None
    stacks = ProcessStacks(pid=proc.pid, host=host, rank=ident.rank, local_rank=ident.local_rank,
                           world_size=ident.world_size, local_world_size=ident.local_world_size,
                           job=ident.job, cmdline=_joined(cmdline), store=store,
                           agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true")
    try:
        uid: int | None = proc.uids().real
    except psutil.Error:
        uid = None
    return Candidate(stacks, start, uid)


def _given(pid: int, host: str) -> Candidate:
    """``--pid PID``: that process, whatever its environment says."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            start = proc.create_time()
            try:
                env: dict[str, str] | None = proc.environ()
            except psutil.AccessDenied:  # another user's: py-spy will say whether it may read it
                env = None
            try:
                cmdline: list[str] | None = proc.cmdline()
            except psutil.AccessDenied:
                cmdline = None
    except (psutil.NoSuchProcess, ValueError, OverflowError):  # gone (or a zombie), or no pid can be that
        return Candidate(ProcessStacks(pid=pid, host=host, error="no such process"), None, None)
    return _candidate(proc, env, host, start, cmdline)


def discover(pids: Sequence[int] = (), job: str | None = None) -> list[Candidate]:
    """The rank processes on this machine (or exactly ``pids``), optionally only those of ``job``."""
    host = os.uname().nodename
    if pids:
        return [_given(pid, host) for pid in dict.fromkeys(pids)]

    # This process and its ancestors: under `srun ddpdoctor stacks` they carry SLURM ids too.
    me = psutil.Process()
    own = {me.pid, *(p.pid for p in me.parents())}
    my_step = (os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID"))
    parents: dict[int, int] = {}
    seen: dict[int, tuple[psutil.Process, dict[str, str] | None, float, list[str] | None]] = {}
    agents: set[int] = set()
    # ad_value=None: another user's environment (AccessDenied) reads as None; vanished processes are skipped.
    for proc in psutil.process_iter(["ppid", "create_time", "environ", "cmdline"], ad_value=None):
        info = proc.info
        if proc.pid in own or info["create_time"] is None:
            continue
        env, cmdline = info["environ"], info["cmdline"]
        parents[proc.pid] = info["ppid"] or 0
        seen[proc.pid] = (proc, env, info["create_time"], cmdline)
        # A worker always has TORCHELASTIC_RUN_ID; its agent never does (it may have RANK: Kubeflow sets it).
        maybe_agent = env is None or "TORCHELASTIC_RUN_ID" not in env
        if maybe_agent and _is_agent(_joined(cmdline)):
            agents.add(proc.pid)
    picked: list[int] = []
    for pid, (_proc, env, _start, _cmd) in seen.items():
        if env is not None and is_rank_env(env):
            if my_step[0] is not None and (env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")) == my_step:
                continue  # a sibling task of this very `srun ddpdoctor stacks`
        elif parents[pid] not in agents or pid in agents:
            continue  # neither a rank by environment nor a torchrun worker (env unreadable: another user)
        if job is not None and not job_matches(job, env or {}, identity(env or {}).job, parents[pid]):
            continue
        picked.append(pid)
    # A shell or agent that carries the SLURM variables is not a rank when a descendant is one.
    chosen = set(picked)
    drop = set()
    for pid in picked:
        ancestor = parents.get(pid)
        hops = 0
        while ancestor and hops < 64:
            if ancestor in chosen:
                drop.add(ancestor)
            ancestor = parents.get(ancestor)
            hops += 1
    return [_candidate(seen[pid][0], seen[pid][1], host, seen[pid][2], seen[pid][3])
            for pid in picked if pid not in drop]


def find_py_spy() -> str | None:
    """py-spy installed next to this interpreter (the pip wheel's script dir) first, then PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy.exe" if os.name == "nt" else "py-spy")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


def ptrace_scope() -> int | None:
    """Yama's setting (https://www.kernel.org/doc/Documentation/admin-guide/LSM/Yama.rst); None without Yama."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _has_cap_sys_ptrace() -> bool | None:
    # psutil does not expose capabilities: the one line of /proc/self/status read by hand.
    words = procfs.status_field("self", "CapEff")
    return bool(int(words[0], 16) >> _CAP_SYS_PTRACE & 1) if words else None


def ptrace_advice(target_uid: int | None) -> str:
    """Why reading a process's memory (ptrace rights) may be refused here, and what to change; always ends
    with the fallback."""
    reasons = []
    euid = os.geteuid() if hasattr(os, "geteuid") else None
    scope = ptrace_scope()
    cap = _has_cap_sys_ptrace()
    if target_uid is not None and euid not in (0, target_uid):
        reasons.append(f"the process belongs to uid {target_uid} and ddpdoctor runs as uid {euid}: run it as "
                       "that user or as root (`sudo env \"PATH=$PATH\" ddpdoctor stacks`)")
    if scope == 1 and euid != 0:
        reasons.append("kernel.yama.ptrace_scope is 1 (only a parent may trace its children): run as root "
                       "(`sudo env \"PATH=$PATH\" ddpdoctor stacks`) or set `sudo sysctl -w "
                       "kernel.yama.ptrace_scope=0`")
    elif scope == 2:
        reasons.append("kernel.yama.ptrace_scope is 2 (only root with CAP_SYS_PTRACE may trace): run as root")
    elif scope == 3:
        reasons.append("kernel.yama.ptrace_scope is 3 (ptrace disabled until reboot): py-spy cannot work here")
    if cap is False and euid == 0:
        reasons.append("this process lacks CAP_SYS_PTRACE, as in a default container: start it with "
                       "`docker run --cap-add SYS_PTRACE` (Kubernetes: securityContext.capabilities.add: "
                       "[SYS_PTRACE])")
    if not reasons:
        reasons.append("the kernel refused ptrace (a seccomp profile or LSM may block it; in Docker use "
                       "`--cap-add SYS_PTRACE` or `--security-opt seccomp=unconfined`)")
    return "; ".join(reasons) + ". " + FALLBACK_HINT


def _classify(stderr: str, cand: Candidate) -> str:
    """Turn py-spy's stderr into the one-line reason a user can act on."""
    pid = cand.proc.pid
    if not same_process_alive(cand.proc.pid, cand.create_time):
        return "the process exited while it was being dumped"
    text = stderr.strip()
    if "Permission Denied" in text or "Operation not permitted" in text or "os error 1)" in text:
        return f"not permitted to read pid {pid}: {ptrace_advice(cand.uid)}"
    if "Failed to get process executable name" in text:
        return (f"py-spy could not read /proc/{pid}/exe (a process of another user or of the container "
                f"runtime): {ptrace_advice(cand.uid)}")
    if "Failed to find python version" in text or "Failed to find a python interpreter" in text:
        return f"not a Python process ({cand.proc.cmdline or 'command line unknown'}): py-spy found no interpreter"
    first = next((line for line in text.splitlines() if line.startswith("Error")), text.splitlines()[0] if text else "")
    return f"py-spy failed: {first or 'no output'}"


def _threads_from_py_spy(doc: object, pid: int) -> list[ThreadStack]:
    threads = []
    for t in doc if isinstance(doc, list) else []:
        frames = [Frame(str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line") or 0),
                        _locals_from_py_spy(f.get("locals")))
                  for f in t.get("frames", [])]
        name = str(t.get("thread_name") or "")
        main = t.get("os_thread_id") == pid or name == "MainThread"
        threads.append(ThreadStack(int(t.get("thread_id") or 0), name, main, frames))
    return threads


def _locals_from_py_spy(found: object) -> tuple[Local, ...]:
    """py-spy's ``"locals": [{"name", "addr", "arg", "repr"}, ...]`` (``dump --json --locals``), absent without it."""
    if not isinstance(found, list):
        return ()
    return tuple(Local(str(v.get("name", "?")), str(v.get("repr") if v.get("repr") is not None else "?"),
                       bool(v.get("arg", False))) for v in found if isinstance(v, dict))


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when we die (``prctl(PR_SET_PDEATHSIG)``,
    https://man7.org/linux/man-pages/man2/pr_set_pdeathsig.2const.html); None off Linux.

    This covers what no handler can: ``stacks`` killed by SIGKILL or the OOM killer. ``preexec_fn`` is
    safe here because ``stacks`` starts no threads (the fork-safety caveat of the subprocess docs is about
    locks held by other threads at fork); the libc function is looked up before the fork, so the child
    only makes the call. The death signal fires when the forking *thread* exits: :func:`dump_all` waits
    for its children in the thread that started them. A parent that died before the ``prctl`` took
    effect is seen by ``getppid`` changing, and the child exits at once.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return set_death_signal


class Terminated(DoctorError):
    """SIGTERM arrived while py-spy ran: they are killed, and ``stacks`` exits 143 (128 + SIGTERM)."""

    def __init__(self) -> None:
        super().__init__("stopped by SIGTERM; the py-spy processes it had started were killed",
                         exit_code=128 + int(signal.SIGTERM))


class _Sigterm:
    """Whether SIGTERM arrived while py-spy ran.

    The handler only records it: raising from a signal handler lands wherever the main thread happens to
    be, and inside ``subprocess.Popen``'s fork that is logging's at-fork handler, whose module lock then
    stays held and hangs the next fork (seen under load: ``stacks`` never exited after SIGTERM). The
    waits below poll this flag and raise :class:`Terminated` from a known place instead.
    """

    received = False


def _on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # cleanup runs once, not interrupted by a second SIGTERM
    _Sigterm.received = True


def _raise_if_terminated() -> None:
    if _Sigterm.received:
        raise Terminated()


def _stop(running: Sequence[tuple[Candidate, subprocess.Popen[str]]]) -> None:
    """Kill and reap every py-spy still running (the kernel detaches it from the rank it was reading)."""
    for _cand, popen in running:
        if popen.poll() is None:
            with contextlib.suppress(OSError):
                popen.kill()
    for _cand, popen in running:
        with contextlib.suppress(subprocess.TimeoutExpired):  # killed: its pipes close at once
            popen.communicate(timeout=5)


def py_spy_dump_args(pid: int, native: bool = False, locals_level: int = 0, nonblocking: bool = False) -> list[str]:
    """The ``py-spy dump`` arguments for one rank: py-spy's own flags, passed through as py-spy spells them
    (``--native``; ``--locals`` repeated for more detail, as py-spy's ``-ll``; ``--nonblocking``)."""
    return (["dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
            + ["--locals"] * locals_level + (["--nonblocking"] if nonblocking else []))


def dump_all(cands: Sequence[Candidate], native: bool = False, timeout: float = 30.0, locals_level: int = 0,
             nonblocking: bool = False, die_with_parent: bool = True) -> list[ProcessStacks]:
    """``py-spy dump --json`` for each candidate, all started at once, within ``timeout`` seconds; every
    candidate's stacks, or its error (a one-line reason the user can act on).

    ``nonblocking`` reads the ranks without pausing them (py-spy's ``--nonblocking``: no ptrace stop, so a
    rank in a tight loop is not slowed, at the price of a stack that may be torn between two moments).

    py-spy never outlives us: each child gets a death signal (:func:`_die_with_parent`), and a SIGTERM
    (or Ctrl-C) while they run kills and reaps them before :class:`Terminated` ends the command. A process
    with threads of its own (``watch``'s ranks and supervisor) passes ``die_with_parent=False``: a
    ``preexec_fn`` after fork is not safe there; the ``timeout`` still bounds every py-spy.
    """
    exe = find_py_spy()
    if exe is None:
        raise DoctorError(PY_SPY_MISSING)
    running: list[tuple[Candidate, subprocess.Popen[str]]] = []
    in_main = threading.current_thread() is threading.main_thread()
    _Sigterm.received = False
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        preexec = _die_with_parent() if die_with_parent else None
        for cand in cands:
            _raise_if_terminated()
            if cand.proc.error is not None:
                continue
            cmd = [exe, *py_spy_dump_args(cand.proc.pid, native, locals_level, nonblocking)]
            running.append((cand, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                   stdin=subprocess.DEVNULL, text=True, preexec_fn=preexec)))
        _collect(running, timeout)
    finally:
        _stop(running)
        if in_main:  # None: a handler installed from C, which Python cannot put back; the default then
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    _raise_if_terminated()  # a SIGTERM after the last wait still ends the command as one
    return [c.proc for c in cands]


def _communicate(popen: subprocess.Popen[str], deadline: float) -> tuple[str, str]:
    """``popen.communicate`` until ``deadline`` (then :class:`subprocess.TimeoutExpired`), looking for a
    SIGTERM every 0.2 s (a repeated ``communicate`` after a timeout loses no output)."""
    while True:
        _raise_if_terminated()
        left = deadline - time.monotonic()
        try:
            return popen.communicate(timeout=max(0.1, min(0.2, left)))
        except subprocess.TimeoutExpired:
            if left <= 0.2:
                raise


def _collect(running: Sequence[tuple[Candidate, subprocess.Popen[str]]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for cand, popen in running:
        try:
            out, err = _communicate(popen, deadline)
        except subprocess.TimeoutExpired:
            popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # killed: its pipes close at once
                popen.communicate(timeout=5)
            cand.proc.error = f"py-spy did not finish within {timeout:g} s (try --timeout, or --signal)"
            continue
        if popen.returncode != 0:
            cand.proc.error = _classify(err, cand)
            continue
        try:
            cand.proc.threads = _threads_from_py_spy(loads_untrusted(out), cand.proc.pid)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            cand.proc.error = f"py-spy printed something that is not its JSON ({exc}): {out[:120]!r}"
