"""The shape of the package, checked: a package per command family, layers that point one way.

What a newcomer relies on (issue 14): a command's code, tests and docs are found from its name; a family is
used from outside only through its package's public API (``from ddpdoctor.ckpt import strip_file``, never
``ddpdoctor.ckpt.strip``); ``runtime/`` (the launch and control-plane infrastructure under every multi-rank
command) knows nothing of the CLI; no arrow between families runs back up.
Imports are read with :mod:`ast` from the source, so lazy imports inside functions count too.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from ddpdoctor.cli import COMMANDS

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ddpdoctor"

# Shared by every family; they import no family themselves.
CORE = {"errors", "fileio", "findings", "modelspec", "outputs", "ports", "ranks", "safejson", "__init__"}
# Lower layers never import higher ones: core < runtime < families < checks < the command line.
LAYER = {"runtime": 1, "check": 2, "bench": 2, "ckpt": 2, "stacks": 2, "watch": 2, "env": 2, "explain": 2,
         "unused": 2, "ras": 2, "fr": 2, "checks": 3, "commands": 4, "cli": 4, "__main__": 4}


def _unit(module: str) -> str:
    """'ddpdoctor.ckpt.strip' -> 'ckpt'; 'ddpdoctor.errors' -> 'errors'; 'ddpdoctor' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every ddpdoctor import in the file, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ddpdoctor":
                found.extend((node.lineno, f"ddpdoctor.{alias.name}") for alias in node.names)
            elif node.module.startswith("ddpdoctor."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:  # `from . import x` inside a package
            base = _module_name(path).split(".")
            base = base[: len(base) - node.level + (path.name == "__init__.py")]
            found.extend((node.lineno, ".".join([*base, node.module or alias.name])) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names if alias.name.startswith("ddpdoctor"))
    return found


def _third_party(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return names


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_family_is_a_package_with_a_docstring() -> None:
    for family in ("check", "checks", "bench", "ckpt", "stacks", "watch", "env", "fr", "ras", "runtime", "commands",
                   "explain"):
        init = PACKAGE / family / "__init__.py"
        assert init.is_file(), f"ddpdoctor/{family}/ is a package"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} says what the family does"
    flat = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert set(flat) <= CORE | {"cli", "__main__", "unused"}, f"top-level modules that belong to a family: {flat}"
    for path in SOURCES:
        assert ast.get_docstring(ast.parse(path.read_text())) or path.name == "__main__.py", \
            f"{path.relative_to(REPO)} has no module docstring saying why it exists"


def test_a_command_is_found_from_its_name() -> None:
    """ddpdoctor/commands/<cmd>.py, its tests and docs/<cmd>.md, for every command the CLI has."""
    for command in COMMANDS:
        assert (PACKAGE / "commands" / f"{command}.py").is_file(), command
        assert (REPO / "docs" / f"{command}.md").is_file(), command
        assert any((REPO / "tests" / command).glob("test_*.py")), f"tests/{command}/ holds {command}'s tests"


def test_families_are_used_only_through_their_package() -> None:
    offenders = []
    for path in SOURCES:
        me = _unit(_module_name(path))
        for line, module in _imports(path):
            parts = module.split(".")
            target = _unit(module)
            # runtime/ is the infrastructure every multi-rank command stands on, not a command family.
            if target == me or target in CORE or target in ("cli", "runtime", "commands"):
                continue
            if len(parts) > 2 and (PACKAGE / target).is_dir():
                offenders.append(f"{path.relative_to(REPO)}:{line} imports {module}; "
                                 f"use the public API: from ddpdoctor.{target} import ...")
    assert not offenders, "\n".join(offenders)


def test_layers_point_one_way() -> None:
    offenders = []
    edges: set[tuple[str, str]] = set()
    for path in SOURCES:
        me = _unit(_module_name(path))
        for line, module in _imports(path):
            target = _unit(module)
            if target == me:
                continue
            if me in CORE and target not in CORE:
                offenders.append(f"{path.relative_to(REPO)}:{line}: shared module imports {module}")
            elif me in LAYER and target in LAYER and LAYER[target] > LAYER[me]:
                offenders.append(f"{path.relative_to(REPO)}:{line}: {me} (layer {LAYER[me]}) imports "
                                 f"{module} (layer {LAYER[target]})")
            if me in LAYER and target in LAYER and LAYER[me] == LAYER[target] == 2:
                edges.add((me, target))
    assert not offenders, "\n".join(offenders)
    # Families may use each other's public API, but never both ways round (no arrow back up).
    families = {a for edge in edges for a in edge}
    reach = {f: {b for a, b in edges if a == f} for f in families}
    for _ in families:
        for f in families:
            reach[f] |= set(itertools.chain.from_iterable(reach[g] for g in reach[f]))
    cycles = sorted(f for f in families if f in reach[f])
    assert not cycles, f"families that import each other in a cycle: {cycles} (edges: {sorted(edges)})"


def test_only_the_command_line_imports_typer() -> None:
    users = sorted(str(p.relative_to(REPO)) for p in SOURCES if "typer" in _third_party(p)
                   and _unit(_module_name(p)) not in ("commands", "cli"))
    assert not users, f"typer outside cli.py/commands/: {users} (runtime takes argv and returns an exit code)"


def test_explain_and_unused_do_not_reach_into_the_check_engine() -> None:
    for path in [*sorted((PACKAGE / "explain").glob("*.py")), *sorted((PACKAGE / "unused").glob("*.py"))]:
        imported = {module for _, module in _imports(path)}
        assert not {m for m in imported if _unit(m) in ("check", "checks")}, path.name


def _module_imports(path: Path) -> set[str]:
    """The ddpdoctor modules a file imports, at any depth (``TYPE_CHECKING`` and function-level imports
    count: a cycle dodged by a late import is still a cycle). ``from pkg import mod`` names the module
    ``pkg.mod``; ``from pkg import name`` names ``pkg`` (its ``__init__``, where the name comes from)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("ddpdoctor"):
            for alias in node.names:
                sub = REPO / node.module.replace(".", "/") / alias.name
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                found.add(f"{node.module}.{alias.name}" if is_module else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("ddpdoctor"))
    found.update(module for line, module in _imports(path)
                 if any(isinstance(n, ast.ImportFrom) and n.level and n.lineno == line
                        for n in ast.walk(ast.parse(path.read_text(), str(path)))))
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# Cycles known and owned elsewhere, each with where it is being removed; a new cycle fails the test.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def test_no_package_has_modules_that_import_each_other_in_a_circle() -> None:
    """A circle (ckpt had formats -> sharded -> formats, and model <-> dcp/sharded through TYPE_CHECKING)
    means no module of it can be read, tested or changed on its own, and is dodged with late imports that
    fail only at run time. Each package's modules must form layers."""
    graph = {_module_name(p): _module_imports(p) for p in SOURCES}
    packages = sorted({m.rsplit(".", 1)[0] for m in graph if m.count(".") >= 2})
    offenders = []
    for package in packages:
        members = {m for m in graph if m == package or m.startswith(package + ".")}
        local = {m: {t for t in graph[m] if t in members and t != m} for m in members}
        offenders += [c for c in _cycles(local) if tuple(c) not in KNOWN_CYCLES]
    assert not offenders, "modules that import each other in a circle (break it into layers): " + \
        "; ".join(" <-> ".join(c) for c in offenders)


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert _cycles({"p.a": {"p.b"}, "p.b": set()}) == []
