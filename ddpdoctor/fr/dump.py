"""Writing this rank's Flight Recorder dump from inside a job (for ``watch``, or a user's own hang handler).

The same calls PyTorch's dump-on-timeout makes (torch/csrc/distributed/c10d/init.cpp binds them):
``_dump_fr_trace(includeCollectives, includeStackTraces, onlyActive)`` returns the pickle,
``_dump_fr_trace_json(includeCollectives, onlyActive)`` the JSON. Both exist from torch 2.5 on and record
gloo collectives too (checked on 2.13's CPU build) when ``TORCH_FR_BUFFER_SIZE`` > 0 (2000 by default since
2.7). torch is imported here only, inside the rank that already has it loaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ddpdoctor import outputs
from ddpdoctor.errors import DoctorError

# What a job must have in its environment for the dumps to hold anything (set before the process group).
ENABLE_ENV = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}


def dump_name(rank: int, fmt: str = "pickle") -> str:
    """PyTorch's own file name for a rank's dump (TORCH_NCCL_DEBUG_INFO_TEMP_FILE's default prefix)."""
    return f"nccl_trace_rank_{rank}" + (".json" if fmt == "json" else "")


def write_dump(directory: str | os.PathLike[str], rank: int, fmt: str = "pickle") -> Path:
    """Write this process's Flight Recorder buffer to ``directory/nccl_trace_rank_<rank>`` (atomically)."""
    import torch

    c10d: Any = torch._C._distributed_c10d  # private bindings, absent from torch's type stubs
    try:
        if fmt == "json":
            data = c10d._dump_fr_trace_json(True, False)
        else:
            data = c10d._dump_fr_trace(True, True, False)
    except AttributeError:
        raise DoctorError(f"torch {torch.__version__} has no Flight Recorder dump function "
                          "(_dump_fr_trace: torch 2.5 or later)") from None
    raw = data.encode() if isinstance(data, str) else bytes(data)
    target = Path(directory) / dump_name(rank, fmt)
    # PyTorch's format, not a ddpdoctor document: written as a new file, never over an older run's dump.
    outputs.write_bytes(outputs.resolve("Flight Recorder dump", target, outputs.FR_DUMP), raw)
    return target
