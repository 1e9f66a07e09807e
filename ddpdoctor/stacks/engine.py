"""`ddpdoctor stacks` engine: find this machine's DDP ranks, read their stacks, group them.

Never imports torch, psutil or subprocess on the common path (it attaches to someone else's stuck job and
must start fast). Discovery reads each process's environment from /proc (:mod:`ddpdoctor.stacks.procfs`):
torchrun workers carry RANK/LOCAL_RANK and TORCHELASTIC_RUN_ID, SLURM tasks carry SLURM_PROCID and
SLURM_STEP_ID (see :mod:`ddpdoctor.stacks.ident`). Stacks come from the process's memory
(:mod:`ddpdoctor.stacks.memory`), or from ``py-spy dump --json``
(https://github.com/benfred/py-spy#how-does-py-spy-work), one py-spy per rank, all started at once, for
what that reader does not do. Both read the target's memory with ptrace rights, which Yama's ptrace_scope
and container seccomp/capabilities can forbid.
"""

from __future__ import annotations

import os
import sys
import time

from ddpdoctor.stacks import procfs
from ddpdoctor.stacks.ident import identity, is_rank_env, job_matches
from ddpdoctor.stacks.memory import Unreadable, read_stacks
from ddpdoctor.stacks.procfs import same_process_alive
from ddpdoctor.stacks.report import Frame, ProcessStacks, ThreadStack

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: `ddpdoctor stacks` must start fast (see stacks_cli)
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Sequence

# torchrun, `python -m torch.distributed.run` and the deprecated launcher all start ranks as children.
_AGENT_MARKERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
_CAP_SYS_PTRACE = 19  # linux/capability.h

FALLBACK_HINT = ("Fallback without ptrace: add `import ddpdoctor; ddpdoctor.install_stack_dumps()` at the "
                 "top of the training script, then run `ddpdoctor stacks --signal`.")


class Candidate:
    """A process to dump, before its stacks are known."""

    def __init__(self, proc: ProcessStacks, create_time: float | None, uid: int | None) -> None:
        self.proc = proc
        self.create_time = create_time
        self.uid = uid


def _is_agent(cmdline: str) -> bool:
    return any(marker in cmdline for marker in _AGENT_MARKERS)


def _candidate(pid: int, env: dict[str, str] | None, host: str, start: float | None) -> Candidate:
    ident = identity(env or {})
    proc = ProcessStacks(pid=pid, host=host, rank=ident.rank, local_rank=ident.local_rank,
                         world_size=ident.world_size, local_world_size=ident.local_world_size,
                         job=ident.job, cmdline=procfs.cmdline(pid))
    return Candidate(proc, start, procfs.real_uid(pid))


def discover(pids: Sequence[int] = (), job: str | None = None) -> list[Candidate]:
    """The rank processes on this machine (or exactly ``pids``), optionally only those of ``job``."""
    host = os.uname().nodename
    if pids:
        found = []
        for pid in dict.fromkeys(pids):
            info = procfs.stat(pid)
            if info is None:
                found.append(Candidate(ProcessStacks(pid=pid, host=host, error="no such process"), None, None))
            else:
                found.append(_candidate(pid, procfs.environ(pid), host, info[2]))
        return found

    # This process and its ancestors: under `srun ddpdoctor stacks` they carry SLURM ids too.
    own = {os.getpid(), *procfs.ancestors(os.getpid())}
    my_step = (os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID"))
    parents: dict[int, int] = {}
    starts: dict[int, float] = {}
    agents: set[int] = set()
    envs: dict[int, dict[str, str] | None] = {}
    for pid in procfs.pids():
        info = procfs.stat(pid)
        if pid in own or info is None:
            continue
        parents[pid], starts[pid] = info[0], info[2]
        env = envs[pid] = procfs.environ(pid)
        # A worker always has TORCHELASTIC_RUN_ID; its agent never does (it may have RANK: Kubeflow sets it).
        maybe_agent = env is None or "TORCHELASTIC_RUN_ID" not in env
        if maybe_agent and _is_agent(procfs.cmdline(pid)):
            agents.add(pid)
    picked: dict[int, dict[str, str] | None] = {}
    for pid, env in envs.items():
        if env is not None and is_rank_env(env):
            if my_step[0] is not None and (env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")) == my_step:
                continue  # a sibling task of this very `srun ddpdoctor stacks`
        elif parents[pid] not in agents or pid in agents:
            continue  # neither a rank by environment nor a torchrun worker (env unreadable: another user)
        if job is not None and not job_matches(job, env or {}, identity(env or {}).job, parents[pid]):
            continue
        picked[pid] = env
    # A shell or agent that carries the SLURM variables is not a rank when a descendant is one.
    drop = set()
    for pid in picked:
        ancestor = parents.get(pid)
        seen = 0
        while ancestor and seen < 64:
            if ancestor in picked:
                drop.add(ancestor)
            ancestor = parents.get(ancestor)
            seen += 1
    return [_candidate(pid, env, host, starts[pid]) for pid, env in picked.items() if pid not in drop]


def find_py_spy() -> str | None:
    """py-spy installed next to this interpreter (the pip wheel's script dir) first, then PATH."""
    import shutil

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
        frames = [Frame(str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line") or 0))
                  for f in t.get("frames", [])]
        name = str(t.get("thread_name") or "")
        main = t.get("os_thread_id") == pid or name == "MainThread"
        threads.append(ThreadStack(int(t.get("thread_id") or 0), name, main, frames))
    return threads


class Dumped:
    """Every candidate's stacks (or its error), and what read them: ``memory``, ``py-spy`` or both."""

    def __init__(self, processes: list[ProcessStacks], source: str) -> None:
        self.processes = processes
        self.source = source


def dump_all(cands: Sequence[Candidate], native: bool = False, timeout: float = 30.0,
             thread_names: bool = False) -> Dumped:
    """Read each process's stacks from its memory (:mod:`ddpdoctor.stacks.memory`), and run one
    ``py-spy dump --json`` per process that reader cannot do, all at once: for ``--native`` frames, for
    the names of threads other than the main one (``thread_names``), and for interpreters it does not
    know. Failures become per-process errors."""
    sources: set[str] = set()
    for_py_spy: list[tuple[Candidate, str]] = []
    # Without py-spy, --all-threads still gets every thread from memory, only unnamed but the main one.
    py_spy = find_py_spy() if native or thread_names else None
    need_py_spy = native or (thread_names and py_spy is not None)
    for cand in cands:
        if cand.proc.error is not None:
            continue
        if need_py_spy:
            for_py_spy.append((cand, "--native" if native else "--all-threads"))
            continue
        try:
            cand.proc.threads = read_stacks(cand.proc.pid)
            sources.add("memory")
        except Unreadable as exc:
            if exc.denied and same_process_alive(cand.proc.pid, cand.create_time):  # py-spy would be refused too
                cand.proc.error = f"not permitted to read pid {cand.proc.pid}: {ptrace_advice(cand.uid)}"
            else:
                for_py_spy.append((cand, str(exc)))
    if for_py_spy and _py_spy_all(for_py_spy, py_spy or find_py_spy(), native, timeout):
        sources.add("py-spy")
    tried = "py-spy" if need_py_spy else "memory"  # what was tried when nothing could be read
    return Dumped([c.proc for c in cands], "+".join(sorted(sources)) or tried)


def _py_spy_all(cands: Sequence[tuple[Candidate, str]], exe: str | None, native: bool, timeout: float) -> bool:
    """``py-spy dump --json`` for each candidate, all started at once, within ``timeout`` seconds; True
    when py-spy gave the stacks of at least one."""
    import contextlib
    import json
    import subprocess

    if exe is None:
        for cand, why in cands:
            cand.proc.error = ("the process exited while it was being dumped"
                               if not same_process_alive(cand.proc.pid, cand.create_time) else
                               f"py-spy is needed ({why}) but not found next to this Python or on PATH: "
                               f"`pip install py-spy`. {FALLBACK_HINT}")
        return False
    running: list[tuple[Candidate, subprocess.Popen[str]]] = []
    for cand, _why in cands:
        cmd = [exe, "dump", "--json", "--pid", str(cand.proc.pid)] + (["--native"] if native else [])
        running.append((cand, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                               stdin=subprocess.DEVNULL, text=True)))
    deadline = time.monotonic() + timeout
    for cand, popen in running:
        try:
            out, err = popen.communicate(timeout=max(0.1, deadline - time.monotonic()))
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
            cand.proc.threads = _threads_from_py_spy(json.loads(out), cand.proc.pid)
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
            cand.proc.error = f"py-spy printed something that is not its JSON ({exc}): {out[:120]!r}"
    return any(cand.proc.threads for cand, _why in cands)
