"""ddpdoctor: diagnose PyTorch DistributedDataParallel training problems.

Importing ``ddpdoctor`` is cheap (no torch). The Python API is loaded on first use:
``ddpdoctor.strip_prefix``, ``ddpdoctor.load_checkpoint_into``, ``ddpdoctor.install_stack_dumps``,
``ddpdoctor.find_unused_parameters``.
"""

from __future__ import annotations

import importlib
import os
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs start-up (see stacks_cli)
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from typing import Any

__version__ = "0.1.0"

# Public name -> module that defines it; imported lazily so `import ddpdoctor` stays fast.
_LAZY = {
    "strip_prefix": "ddpdoctor.ckpt",
    "load_checkpoint_into": "ddpdoctor.ckpt",
    "install_stack_dumps": "ddpdoctor.stackdump",
    "find_unused_parameters": "ddpdoctor.unused",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpdoctor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def _install_checkout_finder() -> None:
    """Make ``ddpdoctor.checks`` importable in a source checkout, where ``checks/`` sits beside the package.

    The wheel maps ``checks/`` to ``ddpdoctor.checks``; but ``python -m ddpdoctor`` (or ``torchrun -m
    ddpdoctor``) run from the repository root imports this directory instead of the installed package,
    and there ``checks/`` is a sibling. The finder is consulted last, so an installed copy wins.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    sibling = os.path.join(os.path.dirname(here), "checks", "__init__.py")
    if os.path.isdir(os.path.join(here, "checks")) or not os.path.isfile(sibling):
        return
    class CheckoutChecksFinder:
        """A meta path finder (the protocol needs only find_spec; importlib.abc would cost ~30 ms)."""

        def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
            if name != "ddpdoctor.checks":
                return None
            import importlib.util

            return importlib.util.spec_from_file_location(
                name, sibling, submodule_search_locations=[os.path.dirname(sibling)])

    sys.meta_path.append(CheckoutChecksFinder())


_install_checkout_finder()
