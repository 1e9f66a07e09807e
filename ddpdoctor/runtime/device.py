"""Bind every rank to its GPU explicitly, so PyTorch never has to guess which device a rank owns.

A process group initialised without ``device_id`` makes PyTorch guess on NCCL, and say so on every rank:
``barrier()`` warns (``torch/distributed/distributed_c10d.py``)::

    UserWarning: barrier(): using the device under current context. You can specify `device_id` in
    `init_process_group` to mute this warning.

and ProcessGroupNCCL logs, when it picks the barrier's device from the global rank::

    [rank0]:[W515 13:17:30.584756157 ProcessGroupNCCL.cpp:5188] Guessing device ID based on global rank.
    This can cause a hang if rank to GPU mapping is heterogeneous. You can specify device_id in
    init_process_group()

A doctor must not print the warnings it would diagnose, and the guess is wrong whenever each rank sees
only its own GPU as ``cuda:0`` (SLURM ``--gpus-per-task``). So ``check`` and ``bench`` pass
``device_id=torch.device("cuda", local_index)`` to ``init_process_group`` where the installed torch takes
it (added in torch 2.3; the signature is asked, not the version string) and ``device_ids=[index]`` to
every barrier. On gloo (CPU) nothing is passed: there is no device to bind.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

# The texts PyTorch prints when it guesses a rank's device (see the module docstring for their sources).
DEVICE_GUESS_WARNINGS = (
    "Guessing device ID based on global rank",
    "barrier(): using the device under current context",
)
_GUESS = re.compile("|".join(re.escape(text) for text in DEVICE_GUESS_WARNINGS))


def _cuda_index(backend: str, device: str) -> int | None:
    """The CUDA device index this rank binds to, or None when there is nothing to bind (gloo, CPU)."""
    if backend != "nccl" or not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else None


def takes_device_id(init_fn: Callable[..., Any]) -> bool:
    """Whether this ``init_process_group`` accepts ``device_id`` (torch >= 2.3), asked of its signature."""
    try:
        return "device_id" in inspect.signature(init_fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: assume the old form
        return False


def init_device_kwargs(backend: str, device: str, init_fn: Callable[..., Any] | None = None) -> dict[str, Any]:
    """``{"device_id": torch.device("cuda", i)}`` for an NCCL rank on ``cuda:i`` when ``init_fn`` (default:
    ``torch.distributed.init_process_group``) takes it; ``{}`` otherwise."""
    index = _cuda_index(backend, device)
    if index is None:
        return {}
    import torch

    if init_fn is None:
        init_fn = torch.distributed.init_process_group
    if not takes_device_id(init_fn):
        return {}
    return {"device_id": torch.device("cuda", index)}


def barrier_kwargs(backend: str, device: str) -> dict[str, Any]:
    """``{"device_ids": [i]}`` for an NCCL rank on ``cuda:i`` (``barrier`` has taken it since torch 1.8)."""
    index = _cuda_index(backend, device)
    return {} if index is None else {"device_ids": [index]}


def bound_barrier(**kwargs: Any) -> Any:
    """``torch.distributed.barrier`` on the default group, told this rank's device when the group is NCCL."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend())
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    return dist.barrier(**barrier_kwargs(backend, device), **kwargs)


def device_guess_lines(text: str) -> list[str]:
    """The lines of a run's output where PyTorch says it guessed a rank's device (none after binding)."""
    return [line for line in text.splitlines() if _GUESS.search(line)]
