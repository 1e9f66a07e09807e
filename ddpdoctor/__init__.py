"""ddpdoctor: diagnose PyTorch DistributedDataParallel training problems.

One package per command family (``check``/``checks``, ``bench``, ``ckpt``, ``stacks``, ``watch``, ``env``),
single-file features as modules (``explain``, ``unused``), the launch and control-plane runtime in
``runtime``, and the command line in ``cli`` + ``commands``. Importing ``ddpdoctor`` is cheap (no torch):
the Python API below is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> module that defines it; imported lazily so `import ddpdoctor` stays fast.
_LAZY = {
    "strip_prefix": "ddpdoctor.ckpt",
    "load_checkpoint_into": "ddpdoctor.ckpt",
    "install_stack_dumps": "ddpdoctor.stacks",
    "find_unused_parameters": "ddpdoctor.unused",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpdoctor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
