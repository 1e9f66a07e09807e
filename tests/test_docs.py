"""Every ``ddpdoctor`` command line shown in README.md and docs/ names a real command and real options.

Docs rot silently: a renamed flag still reads well. Each command line in a fenced code block (``ddpdoctor
...``, ``$ ddpdoctor ...``, ``torchrun ... -m ddpdoctor ...``, ``srun ... ddpdoctor ...``) is parsed with
the shell's rules and checked against the typer app itself: the command path exists and every ``--option``
it uses is one that command declares. The check reads the app through click's own objects, so it needs no
list kept by hand.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main

from ddpdoctor.cli import build_app

REPO = Path(__file__).resolve().parent.parent
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _command_lines(text: str) -> list[str]:
    """Lines of code blocks that run ddpdoctor, with continuation lines joined and comments dropped."""
    lines: list[str] = []
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for raw in joined.splitlines():
            line = re.sub(r"\s#\s.*$", "", raw.strip().removeprefix("$ ")).strip()
            # Output shown beside the commands: "ddpdoctor check: 2 ranks ...", aligned table columns.
            if (re.search(r"(^|\s|/)ddpdoctor\s+[a-z]+(\s|$)", line) and not line.startswith("#")
                    and "   " not in line and "`" not in line):
                lines.append(line)
    return lines


def _invocation(line: str) -> list[str] | None:
    """The arguments after ``ddpdoctor`` (or ``-m ddpdoctor``) of a shell line; None if not one we run."""
    for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:  # an output line that merely mentions ddpdoctor
            return None
        for i, word in enumerate(words):
            if word == "ddpdoctor" or word.endswith("/ddpdoctor"):
                return words[i + 1:]
    return None


def _resolve(root: Any, args: list[str]) -> tuple[Any, list[str]] | None:
    """Walk the command path through groups; the command and the arguments left for it."""
    command = root
    # click's objects (typer's own copy of click in newer releases): a group has `commands`.
    while hasattr(command, "commands") and args and not args[0].startswith("-"):
        sub = command.commands.get(args[0])
        if sub is None:
            if command is root:
                return None
            break  # an argument of a group with a callback (`stacks`), not a subcommand
        command, args = sub, args[1:]
    return command, args


def _options(command: Any) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        if param.param_type_name == "option":
            names.update(param.opts + param.secondary_opts)
    return names


def test_docs_show_command_lines() -> None:
    assert sum(len(_command_lines(p.read_text())) for p in DOCS) > 20, "the docs show how to run ddpdoctor"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_line_exists(doc: Path) -> None:
    root = typer.main.get_command(build_app())
    assert hasattr(root, "commands")
    problems = []
    for line in _command_lines(doc.read_text()):
        args = _invocation(line)
        if not args or args[0] in ("--help", "-h", "--version") or "<" in args[0] or "..." in args[0]:
            continue
        found = _resolve(root, list(args))
        if found is None:
            problems.append(f"{line!r}: no command {args[0]!r}")
            continue
        command, rest = found
        known = _options(command)
        takes_value = {name for param in command.params if param.param_type_name == "option"
                       and not param.is_flag for name in param.opts}
        words = iter(rest)
        for word in words:
            if word in takes_value:
                next(words, None)
                continue
            if not word.startswith(("-", "[")) and not command.context_settings.get(
                    "allow_interspersed_args", command.allow_interspersed_args):
                break  # `watch SCRIPT ARGS...`: what follows the script is the script's
            # Synopsis lines too: "[--json PATH|-]", "[--pid PID]...", "--only/--skip".
            for flag in word.split("=", 1)[0].strip("[]().,").split("/"):
                if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in known:
                    problems.append(f"{line!r}: {command.name} has no option {flag}")
    assert not problems, f"{doc.relative_to(REPO)}:\n" + "\n".join(problems)
