"""Where am I: detect the launcher (torchrun, SLURM, Open MPI / PMI) from the environment.

Each launcher spells rank, world size and local rank differently; this module turns them into one
:class:`LaunchInfo`. With no launcher, ``ddpdoctor check`` self-launches local ranks (``selflaunch``).
:func:`torchrun_env` goes the other way: under srun or mpirun it spells the job the way torchrun does
(RANK, LOCAL_RANK, WORLD_SIZE, ...), so a script written for ``init_process_group("env://")`` runs
unchanged under ``ddpdoctor watch``.
No torch here: it is used by commands that must start fast.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from ddpdoctor.errors import DoctorError

DEFAULT_MASTER_PORT = 29500
# torchrun's --master-addr default (torch/distributed/run.py) for a job whose ranks all run on one host.
LOCAL_MASTER_ADDR = "127.0.0.1"
# Job-derived ports: 29500 (torchrun's default) + 2 x (job id mod 1250). Every rank computes the same port
# from the same job id without talking; the step of 2 leaves MASTER_PORT+1 (watch's channel) to each job,
# so jobs with consecutive ids on one head node (Slurm numbers them in order) never meet; 29500-31999 stays
# below Linux's ephemeral range (32768+), where an outgoing connection could take the port first.
JOB_PORT_SLOTS = 1250


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
    # torchrun's GROUP_RANK / GROUP_WORLD_SIZE (this node's index, the number of nodes); -1 / 0 where the
    # launcher does not say (Open MPI across hosts exports no node index).
    node_rank: int = -1
    num_nodes: int = 0

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
    default_port = job_port(job)
    num_nodes = _first_int(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES") or len(nodes)
    # One node: the local host, as torchrun does (a node's own name need not resolve inside it).
    first = nodes[0] if nodes and num_nodes != 1 else LOCAL_MASTER_ADDR
    master_addr = env.get("MASTER_ADDR") or first
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
        node_rank=node_id,
        num_nodes=num_nodes,
    )


def _from_mpi(env: Mapping[str, str], rank: str, size: str, local_rank: str, local_size: str) -> LaunchInfo:
    world_size = _int(env, size)
    # Only a local size the launcher states is evidence that every rank is here (PMI launchers may omit it).
    one_host = local_size in env and _int(env, local_size) == world_size
    if "MASTER_ADDR" in env:
        master_addr = env["MASTER_ADDR"]
    elif one_host:
        master_addr = LOCAL_MASTER_ADDR  # as torchrun does for a single node
    else:
        raise DoctorError(
            "launched by MPI across hosts but MASTER_ADDR is not set: export MASTER_ADDR=<host of rank 0> "
            "(and MASTER_PORT) on every rank, e.g. mpirun -x MASTER_ADDR=node01 -x MASTER_PORT=29500"
        )
    job = mpi_job_id(env)
    return LaunchInfo(
        launcher="mpi",
        rank=_int(env, rank),
        world_size=world_size,
        local_rank=_int(env, local_rank) if local_rank in env else 0,
        local_world_size=_int(env, local_size) if local_size in env else world_size,
        master_addr=master_addr,
        master_port=_port(env, job_port(job) if job else DEFAULT_MASTER_PORT),
        agent_store=False,
        run_id=f"mpi.{job or '0'}",
        node_rank=0 if one_host else -1,
        num_nodes=1 if one_host else _first_int(env, "OMPI_MCA_orte_num_nodes"),
    )


def _first_int(env: Mapping[str, str], *names: str) -> int:
    """The first of ``names`` that holds a non-negative integer, else 0 (these counts are optional)."""
    for name in names:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def mpi_job_id(env: Mapping[str, str]) -> str:
    """The MPI job's id, the same on every rank: Open MPI 4's ess jobid, a PMIx namespace (Open MPI 5,
    where it reads like ``prterun-host-1234@1``), or PMI's; "" when the launcher exports none (Hydra)."""
    for name in ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID"):
        if env.get(name):
            return env[name]
    return ""


def job_port(job_id: str) -> int:
    """The MASTER_PORT every rank of job ``job_id`` derives alike: 29500 + 2 x (id mod 1250), with a crc32
    for an id that is not a number."""
    number = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return DEFAULT_MASTER_PORT + 2 * (number % JOB_PORT_SLOTS)


def torchrun_env(info: LaunchInfo) -> dict[str, str]:
    """The variables torchrun's agent gives each worker, derived from ``info``; {} under torchrun or a
    hand-made RANK/WORLD_SIZE (they are already there).

    The set is what torch's LocalElasticAgent._start_workers exports (torch/distributed/elastic/agent/
    server/local_elastic_agent.py, torch 2.13): RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
    GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME ("default", torchrun's role), MASTER_ADDR and
    MASTER_PORT. GROUP_* are left out where the launcher gives no node index. TORCHELASTIC_* are left out on
    purpose: they say an elastic agent (and its store) is there, and none is.
    """
    if info.launcher not in ("slurm", "mpi"):
        return {}
    env = {
        "RANK": str(info.rank),
        "LOCAL_RANK": str(info.local_rank),
        "WORLD_SIZE": str(info.world_size),
        "LOCAL_WORLD_SIZE": str(info.local_world_size),
        "ROLE_RANK": str(info.rank),
        "ROLE_WORLD_SIZE": str(info.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": info.master_addr,
        "MASTER_PORT": str(info.master_port),
    }
    if info.node_rank >= 0 and info.num_nodes > 0:
        env["GROUP_RANK"] = str(info.node_rank)
        env["GROUP_WORLD_SIZE"] = str(info.num_nodes)
    return env
