"""Which process-group backend and device this rank uses: NCCL on its local GPU when there is one, else gloo."""

from __future__ import annotations

import socket

from ddpdoctor.errors import DoctorError


def require_usable_backend(requested: str) -> None:
    """DoctorError when this host cannot run ``requested`` at all (NCCL without a visible CUDA GPU)."""
    import torch

    if requested == "nccl" and not torch.cuda.is_available():
        raise DoctorError(f"--backend nccl needs a CUDA GPU and none is visible on {socket.gethostname()}; "
                          "use --backend gloo (or auto)")


def resolve_backend(requested: str, local_rank: int) -> tuple[str, str]:
    """(backend, device) for this rank: NCCL on its local GPU when there is one, else gloo on CPU.

    ``local_rank`` comes from the launcher detection: srun and mpirun do not set LOCAL_RANK, and reading it
    would put every rank of a node on cuda:0 (NCCL's "Duplicate GPU detected").
    """
    import torch

    require_usable_backend(requested)
    backend = requested
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and torch.distributed.is_nccl_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return backend, f"cuda:{torch.cuda.current_device()}"
    return backend, "cpu"
