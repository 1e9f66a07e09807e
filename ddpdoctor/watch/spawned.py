"""Scripts that start their own ranks: ``torch.multiprocessing.spawn`` / ``start_processes``, or a
``multiprocessing.Process`` per rank (the style of PyTorch's DDP tutorial).

Started N times like a torchrun script, such a script would start N x N processes that fight over one
MASTER_PORT (``EADDRINUSE``, reported as a crash). So ``watch`` runs it once (the *launcher*) and watches
every process it starts: the launcher wraps the target of every ``start_processes`` call and of every
``Process`` the script itself starts in :class:`Entry`, a picklable callable that, inside the child, installs
the recorder and a watchdog before calling the user's function. The child connects to the channel as
``-pid`` (it has no rank yet); its ``init_process_group`` claim binds it to the rank it claims. Processes
started by torch or a library (DataLoader workers) are left alone.

:func:`spawn_sites` recognises such a script before it runs, from its source (an AST walk: no code runs).
"""

from __future__ import annotations

import ast
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from ddpdoctor.watch import pitfalls as pitfall_hooks
from ddpdoctor.watch import recorder as recording
from ddpdoctor.watch.recorder import site_name
from ddpdoctor.watch.script import enter, execute, failure
from ddpdoctor.watch.watchdog import Watchdog, enable_flight_recorder, line_buffered_if_piped

_SPAWN_FUNCS = ("spawn", "start_processes")
_MP_MODULES = ("torch.multiprocessing", "multiprocessing", "torch.multiprocessing.spawn")


class _Imports(ast.NodeVisitor):
    """Names bound to the multiprocessing modules and their spawn/Process functions."""

    def __init__(self) -> None:
        self.modules: set[str] = set()  # local names of torch.multiprocessing / multiprocessing
        self.funcs: dict[str, str] = {}  # local name -> "spawn" / "start_processes" / "Process"

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in _MP_MODULES:
                self.modules.add(alias.asname or alias.name)
            elif alias.name == "torch" and alias.asname is None:
                self.modules.add("torch.multiprocessing")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            if module in _MP_MODULES and alias.name in (*_SPAWN_FUNCS, "Process"):
                self.funcs[alias.asname or alias.name] = alias.name
            elif module == "torch" and alias.name == "multiprocessing":
                self.modules.add(alias.asname or alias.name)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    if isinstance(node, ast.Call):  # mp.get_context("spawn").Process
        return _dotted(node.func)
    return ""


def spawn_sites(path: str) -> list[str]:
    """'train.py:52 mp.spawn' for each place the script starts processes itself; [] when none (or the
    file is not Python we can parse: then it is run the torchrun way, as before)."""
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    imports = _Imports()
    imports.visit(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if not name:
            continue
        head, _, last = name.rpartition(".")
        hit = False
        if not head:
            hit = name in imports.funcs
        elif last in (*_SPAWN_FUNCS, "Process"):
            root = head.split(".get_context")[0]
            hit = root in imports.modules or any(root == m or root.startswith(m + ".") for m in imports.modules)
        if hit:
            found.append(f"{site_name(os.path.abspath(path))}:{node.lineno} {name}")
    return found


# -- in the processes ------------------------------------------------------------------------------

class Entry:
    """The wrapped target of a process the script starts; pickled by reference to the user's function."""

    def __init__(self, fn: Callable[..., Any], address: str, indexed: bool) -> None:
        self.fn = fn
        self.address = address
        self.indexed = indexed  # start_processes passes the process index first

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        index = args[0] if self.indexed and args and isinstance(args[0], int) else None
        dog = start_watch(self.address, "child", index)
        try:
            result = self.fn(*args, **kwargs)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            dog.finish(code, False, "")
            raise
        except BaseException as exc:
            dog.finish(1, True, failure(exc))
            raise
        dog.finish(0, False, "")
        return result


_pitfalls: Any = None


def start_watch(address: str, role: str, index: int | None) -> Watchdog:
    """Recorder and watchdog in this process (once per process; a forked child starts afresh)."""
    line_buffered_if_piped()  # the processes share the script's pipes: whole lines keep them apart
    enable_flight_recorder()
    recorder = recording.install(-1, -1)
    global _pitfalls
    if _pitfalls is None:
        # Once per process: a forked child inherits the wrapped constructors and keeps filling its copy
        # of the parent's log (wrapping them again would record every object twice).
        _pitfalls = pitfall_hooks.install(recorder)
    pitfalls = _pitfalls
    dog = Watchdog(recorder, pitfalls, address, exit_on_lost=True, key=-os.getpid(), bind_on_init=True,
                   hello={"role": role, "index": index})
    recorder.init_hook = dog.on_init
    recorder.started = True
    dog.start()
    return dog


def _from_user_code() -> bool:
    """Whether Process.start() was called by the script (not by torch, a library or multiprocessing)."""
    frame: Any = sys._getframe(2)
    filename = frame.f_code.co_filename if frame is not None else ""
    stdlib = os.path.dirname(os.__file__) + os.sep
    return not (filename.startswith(recording.skip_dirs()) or filename.startswith(stdlib) or filename.startswith("<"))


def install_spawn_hooks(address: str) -> None:
    """In the launcher: every process the script starts runs its target inside :class:`Entry`."""
    import multiprocessing.process as mp_process

    import torch.multiprocessing as torch_mp

    spawn_module: Any = sys.modules["torch.multiprocessing.spawn"]
    original_start_processes = spawn_module.start_processes

    @functools.wraps(original_start_processes)
    def start_processes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return original_start_processes(Entry(fn, address, indexed=True), *args, **kwargs)

    spawn_module.start_processes = start_processes
    setattr(torch_mp, "start_processes", start_processes)  # noqa: B010 (torch's stubs omit it)

    original_start = mp_process.BaseProcess.start

    @functools.wraps(original_start)
    def start(self: Any) -> None:
        target = getattr(self, "_target", None)
        if target is not None and not isinstance(target, Entry) and _from_user_code():
            self._target = Entry(target, address, indexed=False)
        original_start(self)

    mp_process.BaseProcess.start = start  # type: ignore[method-assign]


def run_launcher(script: str, args: list[str], address: str) -> int:
    """The launcher: run the script once, watched like its children (it may join a group itself)."""
    dog = start_watch(address, "launcher", None)
    install_spawn_hooks(address)
    enter(script, args)
    code, crashed, error = execute(script)
    dog.finish(code, crashed, error)
    return code
