"""Who a process is in a DDP job, read from its environment (pure functions, no psutil, no torch).

Shared by the attaching side (``ddpdoctor stacks``, which reads ``/proc/<pid>/environ``) and the in-process
fallback (``install_stack_dumps``, which reads ``os.environ``), so both name ranks and jobs the same way and
``ddpdoctor stacks merge`` can join files written on different nodes.

torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``TORCHELASTIC_RUN_ID`` in every worker
(https://pytorch.org/docs/stable/elastic/run.html#environment-variables); ``srun`` sets ``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` in every task
(https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    """A process's place in a job; any field may be unknown (None)."""

    rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    job: str | None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def is_rank_env(env: Mapping[str, str]) -> bool:
    """True for a torchrun worker or a SLURM task: a rank variable plus a launcher's job id."""
    has_rank = "RANK" in env or "LOCAL_RANK" in env or "SLURM_PROCID" in env
    has_launcher = "TORCHELASTIC_RUN_ID" in env or "SLURM_STEP_ID" in env or "SLURM_JOB_ID" in env
    return has_rank and has_launcher


def job_key(env: Mapping[str, str]) -> str | None:
    """A job id that is the same on every node of one job.

    torchrun's default run id is the literal "none" (``--rdzv-id`` default), so the rendezvous address is
    part of the key: two jobs on one machine never share MASTER_ADDR:MASTER_PORT.
    """
    if "TORCHELASTIC_RUN_ID" in env:
        where = f"@{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if "MASTER_PORT" in env and "MASTER_ADDR" in env else ""
        return f"torchrun:{env['TORCHELASTIC_RUN_ID']}{where}"
    if "SLURM_JOB_ID" in env:
        step = env.get("SLURM_STEP_ID")
        return f"slurm:{env['SLURM_JOB_ID']}" + (f".{step}" if step is not None else "")
    return None


def identity(env: Mapping[str, str]) -> Identity:
    """Rank, local rank, world sizes and job from a process environment (torchrun wins over SLURM)."""
    def first(torchrun: str, slurm: str) -> int | None:
        value = _int(env.get(torchrun))
        return value if value is not None else _int(env.get(slurm))

    return Identity(first("RANK", "SLURM_PROCID"), first("LOCAL_RANK", "SLURM_LOCALID"),
                    first("WORLD_SIZE", "SLURM_NTASKS"), first("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"),
                    job_key(env))


def job_matches(wanted: str, env: Mapping[str, str], job: str | None, parent_pid: int | None) -> bool:
    """``--job ID`` accepts the full key, torchrun's run id, the SLURM job id (or job.step), or the
    pid of the torchrun agent that started the ranks."""
    candidates = {job, env.get("TORCHELASTIC_RUN_ID"), env.get("SLURM_JOB_ID")}
    if "SLURM_JOB_ID" in env and "SLURM_STEP_ID" in env:
        candidates.add(f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}")
    if parent_pid is not None:
        candidates.add(str(parent_pid))
    return wanted in {c for c in candidates if c}
