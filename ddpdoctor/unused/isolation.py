"""Leaving the caller's world untouched: the analysis runs on a deep copy of the model (unwrapped from DDP
or DataParallel), and the caller's random streams are restored after it."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ddpdoctor.errors import DoctorError

if TYPE_CHECKING:
    import torch



@contextmanager
def preserved_rng() -> Iterator[None]:
    """Dropout in the analysed forward must not shift the caller's random streams."""
    import torch

    py_state = random.getstate()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    np_state = None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # numpy is optional
        np = None  # type: ignore[assignment]
    try:
        yield
    finally:
        random.setstate(py_state)
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        if np is not None and np_state is not None:
            np.random.set_state(np_state)


def unwrap(model: Any) -> tuple[Any, bool | None]:
    """The plain module inside DDP / torch.compile wrappers, and DDP's find_unused_parameters if wrapped."""
    flag: bool | None = None
    for _ in range(4):
        if hasattr(model, "find_unused_parameters") and hasattr(model, "module"):  # DistributedDataParallel
            flag = bool(model.find_unused_parameters)
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            break
    return model, flag


def model_for_analysis(model: torch.nn.Module, copy_model: bool) -> torch.nn.Module:
    """The model (a deep copy unless ``copy_model`` is False) in train mode with no gradients, as DDP sees it."""
    clone = model
    if copy_model:
        try:
            clone = copy.deepcopy(model)
        except Exception as exc:
            raise DoctorError(f"cannot deep-copy the model to analyse it safely: {type(exc).__name__}: {exc}; "
                              "pass copy_model=False if it may be changed") from None
    clone.train()
    for p in clone.parameters():
        p.grad = None
    return clone
