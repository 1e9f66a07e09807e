"""`ddpdoctor stacks` engine: find this machine's DDP ranks, py-spy them in parallel, group the stacks.

Never imports torch (it attaches to someone else's job and must start fast). Discovery reads each
process's environment through psutil: torchrun workers carry RANK/LOCAL_RANK and TORCHELASTIC_RUN_ID,
SLURM tasks carry SLURM_PROCID and SLURM_STEP_ID (see :mod:`ddpdoctor.stacks_ident`). Stacks come from
``py-spy dump --json`` (https://github.com/benfred/py-spy#how-does-py-spy-work: it reads the target's
memory through ptrace/process_vm_readv, which Yama's ptrace_scope and container seccomp/capabilities can
forbid), one py-spy per rank, all started at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddpdoctor.stacks_ident import identity, is_rank_env, job_matches
from ddpdoctor.stacks_memory import Unreadable, read_stacks
from ddpdoctor.stacks_report import Frame, ProcessStacks, ThreadStack

# torchrun, `python -m torch.distributed.run` and the deprecated launcher all start ranks as children.
_AGENT_MARKERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
_CAP_SYS_PTRACE = 19  # linux/capability.h

FALLBACK_HINT = ("Fallback without ptrace: add `import ddpdoctor; ddpdoctor.install_stack_dumps()` at the "
                 "top of the training script, then run `ddpdoctor stacks --signal`.")


@dataclass
class Candidate:
    """A process to dump, before its stacks are known."""

    proc: ProcessStacks
    create_time: float | None
    uid: int | None


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except (psutil.Error, OSError):
        return ""


def _environ(p: psutil.Process) -> dict[str, str] | None:
    try:
        return dict(p.environ())
    except (psutil.Error, OSError):
        return None


def _is_agent(cmdline: str) -> bool:
    return any(marker in cmdline for marker in _AGENT_MARKERS)


def _candidate(p: psutil.Process, env: dict[str, str] | None, host: str) -> Candidate:
    ident = identity(env or {})
    try:
        create_time: float | None = p.create_time()
        uid: int | None = p.uids().real
    except (psutil.Error, OSError):
        create_time, uid = None, None
    proc = ProcessStacks(pid=p.pid, host=host, rank=ident.rank, local_rank=ident.local_rank,
                         world_size=ident.world_size, local_world_size=ident.local_world_size,
                         job=ident.job, cmdline=_cmdline(p))
    return Candidate(proc, create_time, uid)


def _own_lineage() -> set[int]:
    """This process and its ancestors: under ``srun ddpdoctor stacks`` they carry SLURM ids too."""
    lineage = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        lineage.update(a.pid for a in psutil.Process().parents())
    return lineage


def discover(pids: Sequence[int] = (), job: str | None = None) -> list[Candidate]:
    """The rank processes on this machine (or exactly ``pids``), optionally only those of ``job``."""
    host = socket.gethostname()
    if pids:
        found = []
        for pid in dict.fromkeys(pids):
            try:
                p = psutil.Process(pid)
                found.append(_candidate(p, _environ(p), host))
            except psutil.NoSuchProcess:
                found.append(Candidate(ProcessStacks(pid=pid, host=host, error="no such process"), None, None))
        return found

    own = _own_lineage()
    my_step = (os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID"))
    picked: dict[int, tuple[psutil.Process, dict[str, str] | None, int | None]] = {}
    agents: set[int] = set()
    parents: dict[int, int] = {}
    for p in psutil.process_iter(["ppid", "cmdline"]):
        if p.pid in own:
            continue
        parents[p.pid] = int(p.info.get("ppid") or 0)
        if _is_agent(" ".join(p.info.get("cmdline") or [])):
            agents.add(p.pid)
    for p in psutil.process_iter():
        if p.pid in own or p.pid not in parents:
            continue
        env = _environ(p)
        ppid = parents[p.pid]
        if env is not None and is_rank_env(env):
            if my_step[0] is not None and (env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")) == my_step:
                continue  # a sibling task of this very `srun ddpdoctor stacks`
        elif ppid not in agents or p.pid in agents:
            continue  # neither a rank by environment nor a torchrun worker (env unreadable: another user)
        if job is not None and not job_matches(job, env or {}, identity(env or {}).job, ppid):
            continue
        picked[p.pid] = (p, env, ppid)
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
    return [_candidate(p, env, host) for pid, (p, env, _) in picked.items() if pid not in drop]


def find_py_spy() -> str | None:
    """py-spy installed next to this interpreter (the pip wheel's script dir) first, then PATH."""
    here = Path(sys.executable).parent / ("py-spy.exe" if os.name == "nt" else "py-spy")
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def ptrace_scope() -> int | None:
    """Yama's setting (https://www.kernel.org/doc/Documentation/admin-guide/LSM/Yama.rst); None without Yama."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def _has_cap_sys_ptrace() -> bool | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_SYS_PTRACE & 1)
    except (OSError, ValueError):
        return None
    return None


def ptrace_advice(target_uid: int | None) -> str:
    """Why py-spy may not attach here, and what to change; always ends with the fallback."""
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
        return f"py-spy was not permitted to read pid {pid}: {ptrace_advice(cand.uid)}"
    if "Failed to get process executable name" in text:
        return (f"py-spy could not read /proc/{pid}/exe (a process of another user or of the container "
                f"runtime): {ptrace_advice(cand.uid)}")
    if "Failed to find python version" in text or "Failed to find a python interpreter" in text:
        return f"not a Python process ({cand.proc.cmdline or 'command line unknown'}): py-spy found no interpreter"
    first = next((line for line in text.splitlines() if line.startswith("Error")), text.splitlines()[0] if text else "")
    return f"py-spy failed: {first or 'no output'}"


def same_process_alive(pid: int, create_time: float | None) -> bool:
    """``pid`` still runs and is the process seen before (its start time matches), not a reused pid."""
    try:
        p = psutil.Process(pid)
        alive = p.status() != psutil.STATUS_ZOMBIE
        return alive and (create_time is None or abs(p.create_time() - create_time) < 0.5)
    except psutil.Error:
        return False


def _threads_from_py_spy(doc: object, pid: int) -> list[ThreadStack]:
    threads = []
    for t in doc if isinstance(doc, list) else []:
        frames = [Frame(str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line") or 0))
                  for f in t.get("frames", [])]
        name = str(t.get("thread_name") or "")
        main = t.get("os_thread_id") == pid or name == "MainThread"
        threads.append(ThreadStack(int(t.get("thread_id") or 0), name, main, frames))
    return threads


@dataclass
class Dumped:
    """Every candidate's stacks (or its error), and what read them: ``memory``, ``py-spy`` or both."""

    processes: list[ProcessStacks]
    source: str


def dump_all(cands: Sequence[Candidate], native: bool = False, timeout: float = 30.0,
             thread_names: bool = False) -> Dumped:
    """Read each process's stacks from its memory (:mod:`ddpdoctor.stacks_memory`), and run one
    ``py-spy dump --json`` per process that reader cannot do, all at once: for ``--native`` frames, for
    the names of threads other than the main one (``thread_names``), and for interpreters it does not
    know. Failures become per-process errors."""
    sources: set[str] = set()
    for_py_spy: list[tuple[Candidate, str]] = []
    for cand in cands:
        if cand.proc.error is not None:
            continue
        if native or thread_names:
            for_py_spy.append((cand, "--native" if native else "--all-threads"))
            continue
        try:
            cand.proc.threads = read_stacks(cand.proc.pid)
            sources.add("memory")
        except Unreadable as exc:
            for_py_spy.append((cand, str(exc)))
    if for_py_spy:
        sources.add("py-spy")
        _py_spy_all(for_py_spy, native, timeout)
    return Dumped([c.proc for c in cands], "+".join(sorted(sources)) or "memory")


def _py_spy_all(cands: Sequence[tuple[Candidate, str]], native: bool, timeout: float) -> None:
    """``py-spy dump --json`` for each candidate, all started at once, within ``timeout`` seconds."""
    exe = find_py_spy()
    if exe is None:
        for cand, why in cands:
            cand.proc.error = ("the process exited while it was being dumped"
                               if not same_process_alive(cand.proc.pid, cand.create_time) else
                               f"py-spy is needed ({why}) but not found next to this Python or on PATH: "
                               f"`pip install py-spy`. {FALLBACK_HINT}")
        return
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
