"""Import user code named as ``MODULE:FACTORY`` (``--model``, ``--batch``) with one-line errors.

The user's factory may fail to import or raise; that is bad input (exit 2), not a ddpdoctor bug, so every
failure becomes a :class:`DoctorError` that summarises the user's exception in one line. ``MODULE`` may be a
dotted module name importable from the current directory, or a path to a ``.py`` file.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any, TextIO

from ddpdoctor.errors import DoctorError, typed_error


def _user_frame(exc: BaseException) -> str:
    """' (at file.py:LINE)' for the innermost frame outside torch, ddpdoctor and importlib: the user's line."""
    skip = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(importlib.__file__))]
    torch_file = getattr(sys.modules.get("torch"), "__file__", None)  # torch not imported: no torch frames
    if torch_file:
        skip.append(os.path.dirname(os.path.abspath(torch_file)))
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen") and not os.path.abspath(f.filename).startswith(tuple(skip))]
    return f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, at most 200 characters: the CLI prints errors as one line."""
    text = typed_error(exc)
    return text if len(text) <= 200 else text[:197] + "..."


def user_error(what: str, exc: BaseException) -> DoctorError:
    """The user's exception as one DoctorError line: ``WHAT raised Type: message (at file.py:LINE)``."""
    return DoctorError(f"{what} raised {_one_line(exc)}{_user_frame(exc)}")


def _import_module(module_name: str, spec: str) -> Any:
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if os.path.isdir(path):
            raise DoctorError(f"{spec!r}: {module_name!r} is a folder; give the .py file that defines the factory "
                              f"(e.g. {os.path.join(module_name, 'models.py')}:FACTORY)")
        if not os.path.isfile(path):
            raise DoctorError(f"{spec!r}: no such file {module_name!r}")
        name = f"_ddpdoctor_user_{abs(hash(path))}"
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise DoctorError(f"{spec!r}: cannot import {module_name!r} as Python")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        loader_spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        # Like `python -m`, user modules in the working directory are importable.
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module_name)


def users_prints_to_stderr() -> contextlib.redirect_stdout[TextIO]:
    """What the user's module prints while it is imported or builds the model goes to stderr: stdout may be the
    report as JSON (`ckpt diff --json -`: a factory's "building model..." went in front of the document)."""
    return contextlib.redirect_stdout(sys.stderr)


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable named by ``MODULE:NAME``; DoctorError (exit 2) when it cannot be had."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise DoctorError(f"expected MODULE:FACTORY (e.g. mypkg.models:build), got: {spec!r}")
    try:
        with users_prints_to_stderr():
            module = _import_module(module_name, spec)
    except DoctorError:
        raise
    except BaseException as exc:  # the user's code: anything it raises is their error, not ours
        if isinstance(exc, KeyboardInterrupt):
            raise
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
            # The named module itself (or its package) is not importable from here, not an import inside it.
            hint = (f"; a dotted MODULE is imported from the current folder ({os.getcwd()}) and the installed "
                    "packages: run from the folder that holds it, or give its file (path/to/models.py:FACTORY)")
        raise DoctorError(
            f"cannot import {module_name!r} for {spec!r}: {_one_line(exc)}{_user_frame(exc)}{hint}"
        ) from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise DoctorError(f"{module_name!r} has no attribute {part!r} (from {spec!r})")
        target = getattr(target, part)
    if not callable(target):
        raise DoctorError(f"{spec!r} is not callable (it is a {type(target).__name__})")
    return target


def build_model(spec: str, *, try_meta: bool = False) -> Any:
    """The ``torch.nn.Module`` the factory ``spec`` returns; DoctorError when it returns something else.

    ``try_meta``: call it under ``torch.device("meta")`` first (no memory for weights: enough to compare
    keys and shapes), and again normally if it cannot build there. The module is imported once either way.
    """
    import torch

    factory = load_factory(spec)
    if try_meta:
        try:
            with torch.device("meta"):
                return _module_from(spec, factory)
        except DoctorError:
            pass
    return _module_from(spec, factory)


def _module_from(spec: str, factory: Callable[..., Any]) -> Any:
    """Call the factory; the user's exception becomes one DoctorError line."""
    import torch

    try:
        with users_prints_to_stderr():
            model = factory()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise user_error(repr(spec), exc) from None
    if not isinstance(model, torch.nn.Module):
        raise DoctorError(f"{spec!r} returned {type(model).__name__}, expected a torch.nn.Module")
    return model


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``--input-shape``: '4,16' or '8x3x32x32' -> (4, 16) / (8, 3, 32, 32); DoctorError on anything else."""
    if text is None:
        return None
    parts = [part.strip() for part in re.split(r"[,x]", text)]
    shape = tuple(int(part) for part in parts) if all(part.isdigit() for part in parts) else ()
    if not shape or any(dim <= 0 for dim in shape):
        raise DoctorError(f"--input-shape takes positive sizes like 4,16 or 8x3x32x32, got: {text!r}")
    return shape
