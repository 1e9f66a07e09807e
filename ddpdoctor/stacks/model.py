"""The stacks model: frames, threads, processes, where each rank waits, and the groups of a job.

A hung DDP job almost always has one rank somewhere else: everyone waits in ``all_reduce`` at
train.py:55, one rank waits in ``barrier`` at train.py:80, or is still loading data. Two stacks "agree"
when their main threads sit at the same innermost user frame and in the same torch.distributed call; the
frames below that (gloo/NCCL internals, native frames) differ between runs and do not matter for the
diagnosis. :func:`analyze` groups them (pure functions, no processes); :mod:`ddpdoctor.stacks.report`
turns the result into text and JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.ranks import rank_phrase

# Path pieces of code that is not the user's: stdlib, installed packages, frozen importlib, native libs.
_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/lib/python3", "/lib64/python3", "<frozen")
# Where the collectives live: torch.distributed and DDP itself (torch/nn/parallel/distributed.py).
_DIST_MARKERS = ("torch/distributed/", "torch/nn/parallel/")
# No job has a million ranks (the same bound as ddpdoctor.fr's MAX_RANK). A world size read from a file or
# an environment is trusted only up to this: the report lists every missing rank below the world size.
MAX_WORLD_SIZE = 1 << 20


@dataclass(frozen=True)
class Local:
    """A local variable of a frame as py-spy's ``--locals`` reads it: its name and py-spy's repr of it."""

    name: str
    repr: str
    arg: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "repr": self.repr, "arg": self.arg}


@dataclass(frozen=True)
class Frame:
    """One stack frame; ``file`` as the process knows it (usually absolute).

    ``locals`` (``stacks --locals``) are shown, never compared: two ranks at the same line with a different
    step counter still wait at the same place.
    """

    function: str
    file: str
    line: int
    locals: tuple[Local, ...] = field(default=(), compare=False, hash=False)

    @property
    def short_file(self) -> str:
        """``torch/distributed/distributed_c10d.py`` for packages, the base name for everything else."""
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in self.file:
                return self.file.split(marker, 1)[1]
        return self.file.rsplit("/", 1)[-1]

    @property
    def native(self) -> bool:
        return self.line == 0 or ".so" in self.short_file

    def where(self) -> str:
        return f"{self.short_file}:{self.line} in {self.function}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"function": self.function, "file": self.file, "line": self.line,
                                "where": self.where()}
        if self.locals:
            data["locals"] = [v.to_dict() for v in self.locals]
        return data


@dataclass
class ThreadStack:
    """One thread; ``frames`` innermost first (as py-spy and faulthandler print them)."""

    thread_id: int
    name: str
    main: bool
    frames: list[Frame]

    def to_dict(self) -> dict[str, Any]:
        return {"thread_id": self.thread_id, "name": self.name, "main": self.main,
                "frames": [f.to_dict() for f in self.frames]}


@dataclass
class ProcessStacks:
    """One process we looked at: who it is, and its threads or why we could not get them."""

    pid: int
    host: str
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    job: str | None = None
    cmdline: str = ""
    threads: list[ThreadStack] = field(default_factory=list)
    error: str | None = None
    store: str | None = None  # the job's c10d store (MASTER_ADDR:MASTER_PORT), read on a rendezvous hang
    agent_store: bool = False  # torchrun's agent hosts that store (TORCHELASTIC_USE_AGENT_STORE)
    # Read over HTTP from the rank's PyTorch debug server (ddpdoctor.stacks.remote): its address; pid is 0 then
    # (the server does not say it).
    address: str | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    @property
    def where(self) -> str:
        """'rank 0=pid 15268@vm'; read over HTTP: 'rank 2@nodeb (debug server)'; no rank: 'pid 4091@vm'."""
        if self.rank is None:
            return f"pid {self.pid}@{self.host}"
        if self.address is not None:
            return f"{self.label}@{self.host} (debug server)"
        return f"{self.label}=pid {self.pid}@{self.host}"

    def main_thread(self) -> ThreadStack | None:
        for thread in self.threads:
            if thread.main:
                return thread
        return self.threads[0] if self.threads else None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "rank": self.rank, "local_rank": self.local_rank,
                "world_size": self.world_size, "local_world_size": self.local_world_size, "host": self.host, "job": self.job,
                "cmdline": self.cmdline, "error": self.error, "debug_server": self.address,
                "threads": [t.to_dict() for t in self.threads]}


def is_user_frame(frame: Frame) -> bool:
    """The user's own code: not stdlib, not an installed package, not native."""
    return not frame.native and not any(m in frame.file for m in _LIBRARY_MARKERS)


def is_dist_frame(frame: Frame) -> bool:
    return any(m in frame.file.replace("\\", "/") for m in _DIST_MARKERS)


def _public(function: str) -> bool:
    """``all_reduce`` yes; c10d_logger's ``_exception_logger.<locals>.wrapper`` and ``_foo`` no."""
    last = function.rsplit(".", 1)[-1]
    return not last.startswith("_") and "<locals>" not in function and last not in {"wrapper", "inner"}


@dataclass(frozen=True)
class Position:
    """The frames that matter: where the user's code is, and which collective it is in."""

    user: Frame | None
    call: str | None

    def describe(self) -> str:
        """``barrier() at train.py:80`` / ``train.py:38 in load_batch() (not in a torch.distributed call)``."""
        if self.user is None and self.call is None:
            return "nowhere known (no Python frames)"
        if self.call is None:
            assert self.user is not None
            return (f"at {self.user.short_file}:{self.user.line} in {self.user.function}() "
                    "(not in a torch.distributed call)")
        at = f" at {self.user.short_file}:{self.user.line}" if self.user is not None else ""
        return f"in {self.call}(){at}"


def position(frames: Sequence[Frame]) -> Position:
    """Innermost user frame, and the torch.distributed call made below it (closest to the user's code)."""
    user_index = next((i for i, f in enumerate(frames) if is_user_frame(f)), None)
    inner = frames[:user_index] if user_index is not None else frames
    call = None
    for frame in reversed(inner):  # from the user's call site inwards: the public API name comes first
        if not frame.native and is_dist_frame(frame) and _public(frame.function):
            call = frame.function.rsplit(".", 1)[-1]
            break
    return Position(frames[user_index] if user_index is not None else None, call)


def format_ranks(labels: Iterable[ProcessStacks]) -> str:
    """``rank 1`` / ``ranks 0-3,5`` (the shared rank list, :func:`ddpdoctor.ranks.rank_phrase`) /
    ``pids 12,13`` for processes whose rank is unknown / both, joined by ``and``."""
    procs = list(labels)
    ranks = [p.rank for p in procs if p.rank is not None]
    pids = sorted(p.pid for p in procs if p.rank is None)
    parts: list[str] = []
    if ranks:
        parts.append(rank_phrase(ranks))
    if pids:
        parts.append(("pid " if len(pids) == 1 else "pids ") + ",".join(map(str, pids)))
    return " and ".join(parts)


@dataclass
class Group:
    """Ranks of one job at the same position."""

    job: str | None
    position: Position
    members: list[ProcessStacks]

    @property
    def representative(self) -> ProcessStacks:
        return self.members[0]

    def to_dict(self) -> dict[str, Any]:
        main = self.representative.main_thread()
        user = self.position.user
        return {
            "job": self.job,
            "ranks": [p.rank for p in self.members],
            "pids": [p.pid for p in self.members],
            "hosts": sorted({p.host for p in self.members}),
            "where": user.where() if user is not None else None,
            "call": self.position.call,
            "summary": f"{format_ranks(self.members)} {'is' if len(self.members) == 1 else 'are'} "
                       f"{self.position.describe()}",
            "stack": [f.where() for f in main.frames] if main is not None else [],
        }


@dataclass
class JobReport:
    """One job's verdict: groups largest first, the outliers, the ranks we could not see."""

    job: str | None
    groups: list[Group]
    failed: list[ProcessStacks]
    world_size: int | None
    missing_ranks: list[int]
    tie: bool
    # A job stuck in init_process_group: who waits there, who never arrived, what the job's store said.
    rendezvous: dict[str, Any] | None = None
    # Ranks of this job on other hosts (looking at one host of several), and how they were reached
    # (ddpdoctor.stacks.driver.reach_other_hosts): fetched over HTTP, or the commands to run there.
    elsewhere: list[int] = field(default_factory=list)
    other_hosts: dict[str, Any] | None = None

    @property
    def leaders(self) -> list[Group]:
        """The groups that count as "the normal place": the first group and every group tied with it.

        With no majority (1 vs 1 in two collectives) nobody can say which side is wrong, so none of the
        tied groups may be called an outlier; only groups that lose to them (smaller, or outside any
        collective beside a collective of the same size) are."""
        if not self.groups:
            return []
        return [g for g in self.groups if _sort_key(g)[:2] == _sort_key(self.groups[0])[:2]]

    @property
    def outliers(self) -> list[ProcessStacks]:
        return [p for g in self.groups[len(self.leaders):] for p in g.members]

    @property
    def problem(self) -> bool:
        # Ranks in more than one place is a problem even when no side can be named (a tie).
        return bool(len(self.groups) > 1 or self.failed or self.missing_ranks
                     or (self.rendezvous and self.rendezvous["never_arrived"]))

    def in_rendezvous(self) -> list[ProcessStacks]:
        """The ranks whose main thread is inside ``init_process_group`` (waiting for the others)."""
        return [p for g in self.groups if g.position.call == "init_process_group" for p in g.members]

    def summary(self) -> str:
        """``rank 1 is in barrier() at train.py:80; ranks 0,2-3 are in all_reduce() at train.py:55``."""
        if not self.groups:
            return "no stacks could be taken"
        if len(self.groups) == 1:
            members = self.groups[0].members
            who = "the only process" if len(members) == 1 else f"all {len(members)} processes"
            return f"{who} ({format_ranks(members)}) {'is' if len(members) == 1 else 'are'} " \
                   f"{self.groups[0].position.describe()}"
        parts = [f"{format_ranks(g.members)} {'is' if len(g.members) == 1 else 'are'} {g.position.describe()}"
                 for g in [*self.groups[1:], self.groups[0]]]
        return ("no majority: " if self.tie else "") + "; ".join(parts)


def _sort_key(group: Group) -> tuple[int, int, int]:
    # Largest first; on a tie, the ranks inside a collective are the "normal" ones and the rank that is
    # elsewhere (sleeping, loading data) is the outlier; then the group holding the lowest rank.
    lowest = min((p.rank if p.rank is not None else 1 << 30) for p in group.members)
    return (-len(group.members), 0 if group.position.call is not None else 1, lowest)


def rank_order(p: ProcessStacks) -> tuple[int, int]:
    return (p.rank if p.rank is not None else 1 << 30, p.pid)


def analyze(processes: Sequence[ProcessStacks]) -> list[JobReport]:
    """Group each job's ranks by position; jobs in order of first appearance."""
    jobs: dict[str | None, list[ProcessStacks]] = {}
    for proc in sorted(processes, key=rank_order):
        jobs.setdefault(proc.job, []).append(proc)
    reports = []
    for job, procs in jobs.items():
        by_pos: dict[Position, Group] = {}
        failed = []
        for proc in procs:
            main = proc.main_thread()
            if proc.error is not None or main is None:
                failed.append(proc)
                continue
            pos = position(main.frames)
            by_pos.setdefault(pos, Group(job, pos, [])).members.append(proc)
        groups = sorted(by_pos.values(), key=_sort_key)
        tie = len(groups) > 1 and _sort_key(groups[0])[:2] == _sort_key(groups[1])[:2]
        worlds = {p.world_size for p in procs if p.world_size is not None and 0 < p.world_size <= MAX_WORLD_SIZE}
        world = max(worlds) if worlds else None
        seen = {p.rank for p in procs if p.rank is not None}
        # Only a single-node job, or a merge of several nodes, can name missing ranks: looking at one node
        # of many, the other nodes' ranks are absent by design.
        single_node = bool(procs) and all(p.local_world_size == world for p in procs)
        merged = len({p.host for p in procs}) > 1
        absent = sorted(set(range(world)) - seen) if world is not None else []
        missing = absent if single_node or merged else []
        reports.append(JobReport(job, groups, failed, world, missing, tie, elsewhere=[] if missing else absent))
    return reports


