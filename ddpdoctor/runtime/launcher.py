"""Where am I: detect the launcher (torchrun, SLURM, Open MPI / PMI) from the environment.

Each launcher spells rank, world size and local rank differently; this module turns them into one
:class:`LaunchInfo`. With no launcher, ``ddpdoctor check`` self-launches local ranks (``selflaunch``).
No torch here: it is used by commands that must start fast.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ddpdoctor.errors import DoctorError

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class LaunchInfo:
    """This process's place in the job, whatever launched it."""

    launcher: str  # "torchrun", "slurm", "mpi", "env" (RANK/WORLD_SIZE set by hand), or "none"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    # torchrun's agent already hosts a TCPStore at MASTER_ADDR:MASTER_PORT; ranks connect as clients.
    agent_store: bool
    run_id: str
    nodes: tuple[str, ...] = ()

    @property
    def is_launched(self) -> bool:
        return self.launcher != "none"


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact host list to names: ``node[01-03,07],gpu5`` -> node01 node02 node03 node07 gpu5.

    Zero padding is kept (``01-03`` gives ``01, 02, 03``), as ``scontrol show hostnames`` does.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        if not item:
            continue
        hosts.extend(_expand_item(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise DoctorError(f"malformed SLURM nodelist (unbalanced ']'): {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise DoctorError(f"malformed SLURM nodelist (unbalanced '['): {text!r}")
    parts.append("".join(current))
    return parts


def _expand_item(item: str) -> list[str]:
    match = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", item)
    if not match:
        return [item]
    prefix, ranges, rest = match.groups()
    suffixes = _expand_item(rest) if rest else [""]
    names: list[str] = []
    for part in ranges.split(","):
        if "-" in part:
            low, high = part.split("-", 1)
            if not (low.isdigit() and high.isdigit()) or int(high) < int(low):
                raise DoctorError(f"malformed SLURM nodelist range {part!r} in {item!r}")
            width = len(low)
            numbers = [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
        else:
            if not part.isdigit():
                raise DoctorError(f"malformed SLURM nodelist entry {part!r} in {item!r}")
            numbers = [part]
        names.extend(f"{prefix}{number}{suffix}" for number in numbers for suffix in suffixes)
    return names


def parse_tasks_per_node(spec: str) -> list[int]:
    """SLURM's ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) to one count per node: [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise DoctorError(f"malformed SLURM_TASKS_PER_NODE: {spec!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise DoctorError(f"{name} must be an integer, got: {value!r}") from None


def port_from_env(name: str, env: Mapping[str, str] | None = None) -> int | None:
    """The TCP port in environment variable ``name`` (None when unset); DoctorError when it is not one."""
    env = os.environ if env is None else env
    if name not in env:
        return None
    port = _int(env, name)
    if not 0 < port < 65536:
        raise DoctorError(f"{name} must be in 1-65535, got: {port}")
    return port


def _port(env: Mapping[str, str], default: int) -> int:
    port = port_from_env("MASTER_PORT", env)
    return default if port is None else port


def detect(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """The launcher this process runs under, or launcher="none" when it should self-launch."""
    info = _detect(os.environ if env is None else env)
    if info.world_size < 1 or not 0 <= info.rank < info.world_size:
        raise DoctorError(f"rank {info.rank} is outside world size {info.world_size} (from {info.launcher}'s "
                          "environment): fix RANK/WORLD_SIZE or the launcher's task count")
    if not 0 <= info.local_rank < max(1, info.local_world_size):
        raise DoctorError(f"local rank {info.local_rank} is outside local world size {info.local_world_size} "
                          f"(from {info.launcher}'s environment)")
    return info


def _detect(env: Mapping[str, str]) -> LaunchInfo:
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
        info = _from_torchrun(env)
        if env.get("DDPDOCTOR_SELF_LAUNCHED") == "1":
            return LaunchInfo(**{**info.__dict__, "launcher": "local"})
        return info
    if "RANK" in env and "WORLD_SIZE" in env:
        info = _from_torchrun(env)
        return LaunchInfo(**{**info.__dict__, "launcher": "env", "agent_store": False})
    # SLURM_STEP_ID is set by srun only: inside a bare sbatch script SLURM_NTASKS may say 16 while one
    # process runs, and waiting for 15 ranks that never come would hang until the deadline.
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        return _from_slurm(env)
    if "OMPI_COMM_WORLD_RANK" in env:
        return _from_mpi(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                         "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if "PMI_RANK" in env:
        return _from_mpi(env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    # PMIx alone exports no world size: such launches set RANK/WORLD_SIZE/LOCAL_RANK themselves ("env").
    return LaunchInfo("none", 0, 1, 0, 1, "127.0.0.1", _port(env, DEFAULT_MASTER_PORT), False, "local")


def _from_torchrun(env: Mapping[str, str]) -> LaunchInfo:
    world_size = _int(env, "WORLD_SIZE")
    return LaunchInfo(
        launcher="torchrun",
        rank=_int(env, "RANK"),
        world_size=world_size,
        local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
        local_world_size=_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world_size,
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_port(env, DEFAULT_MASTER_PORT),
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        run_id=f"{env.get('TORCHELASTIC_RUN_ID', 'env')}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}",
    )


def _from_slurm(env: Mapping[str, str]) -> LaunchInfo:
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    nodes = tuple(expand_nodelist(nodelist)) if nodelist else ()
    world_size = _int(env, "SLURM_NTASKS") if "SLURM_NTASKS" in env else _int(env, "SLURM_NPROCS")
    tasks_spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node_id = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    local_world_size = world_size
    if tasks_spec:
        per_node = parse_tasks_per_node(tasks_spec)
        local_world_size = per_node[node_id] if node_id < len(per_node) else per_node[-1]
    job = env.get("SLURM_JOB_ID", "0")
    # Concurrent jobs whose first node is the same host must not fight over one port; 29500-31999 stays
    # below Linux's ephemeral range (32768+), where an outgoing connection could take the port first.
    default_port = 29500 + (int(job) % 2500 if job.isdigit() else 0)
    master_addr = env.get("MASTER_ADDR") or (nodes[0] if nodes else "127.0.0.1")
    return LaunchInfo(
        launcher="slurm",
        rank=_int(env, "SLURM_PROCID"),
        world_size=world_size,
        local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
        local_world_size=local_world_size,
        master_addr=master_addr,
        master_port=_port(env, default_port),
        agent_store=False,
        run_id=f"slurm.{job}.{env.get('SLURM_STEP_ID', env.get('SLURM_STEPID', '0'))}",
        nodes=nodes,
    )


def _from_mpi(env: Mapping[str, str], rank: str, size: str, local_rank: str, local_size: str) -> LaunchInfo:
    if "MASTER_ADDR" not in env:
        raise DoctorError(
            "launched by MPI but MASTER_ADDR is not set: export MASTER_ADDR=<host of rank 0> "
            "(and MASTER_PORT) on every rank, e.g. mpirun -x MASTER_ADDR=node01 -x MASTER_PORT=29500"
        )
    world_size = _int(env, size)
    return LaunchInfo(
        launcher="mpi",
        rank=_int(env, rank),
        world_size=world_size,
        local_rank=_int(env, local_rank) if local_rank in env else 0,
        local_world_size=_int(env, local_size) if local_size in env else world_size,
        master_addr=env["MASTER_ADDR"],
        master_port=_port(env, DEFAULT_MASTER_PORT),
        agent_store=False,
        run_id=f"mpi.{env.get('OMPI_COMM_WORLD_JOBID', env.get('PMI_JOBID', '0'))}",
    )
