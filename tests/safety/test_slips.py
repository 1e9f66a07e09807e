"""Every output option of every command, given each slip a user makes, destroys nothing (issue 27).

The slips: the output names the command's own input (directly, through a symlink, a hardlink, ``./x``),
another output of the same run, an unrelated file of the user's, a Python source, a read-only file, a
symlink to a user's file, or has the wrong extension. Each must be one line and exit 2, and every entry of
the user's folder must keep its bytes, owner, group, mode, mtime and inode (checked by
:func:`tests.safety.conftest.snapshot`); the only thing a refusal may create is the error document of a
``--json`` the run had accepted.

The table of output options is checked against the CLI itself (:func:`test_every_value_option_is_classified`):
a command or an option added later without a decision here fails, so it cannot skip the policy unseen.
Every command runs in-process through the console entry point (:func:`ddpdoctor.cli.main`), the code path
of the installed command. A refusal must come before any work: for ``check``, ``bench`` and ``watch``
before any rank starts, which a guard enforces (starting ranks fails the test instead of starting them),
so they need no subprocess either.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main

from ddpdoctor import outputs
from ddpdoctor.cli import build_app
from tests.safety.conftest import run_main, snapshot

# Every value-taking parameter of every command: the ones that name something written (the policy must
# cover them, and each is tried with every slip below) ...
OUTPUT_OPTIONS: dict[str, set[str]] = {
    "check": {"--json", "--log-dir"}, "bench": {"--json", "--plot", "--output_file", "--log-dir"},
    "watch": {"--json", "--evidence", "--log-dir"},
    "explain": {"--json"}, "unused": {"--json"}, "ras": {"--json"}, "fr": {"--json"}, "env": {"--json"},
    "ckpt inspect": {"--json"}, "ckpt strip": {"--json", "--output"}, "ckpt diff": {"--json"},
    "stacks": {"--json"}, "stacks merge": {"--json"},
}
# ... and the ones that name no output (inputs, numbers, names).
OTHER_PARAMETERS: dict[str, set[str]] = {
    "check": {"--nproc-per-node", "--backend", "--timeout", "--only", "--skip", "--master-port", "--checkpoint",
              "--model", "--batch", "--input-shape", "--min-busbw", "--min-busbw-pct", "--warn-busbw-pct", "--redirects", "--tee", "--local-ranks-filter"},
    "bench": {"test", "--op", "--min-bytes", "--max-bytes", "--step-factor", "--stepbytes", "--iters",
              "--warmup_iters", "--datatype", "--redop", "--root", "--average", "--blocking", "--check",
              "--report_cputime", "--report_timestamps", "--run_cycles", "--min-busbw", "--min-busbw-pct",
              "--warn-busbw-pct", "--nproc-per-node",
              "--backend", "--timeout", "--master-port", "--redirects", "--tee", "--local-ranks-filter",
              # nccl-tests' flags for what ddpdoctor does not do: a note or a refusal, never a file
              "--nthreads", "--ngpus", "--agg_iters", "--parallel_init", "--stream_null", "--cudagraph",
              "--local_register", "--cta_policy", "--device_implementation", "--device_cta_count", "--memory",
              "--unalign", "--per_iter_timing", "--per_iter_skip"},
    "watch": {"script", "--nproc-per-node", "--master-port", "--shutdown-timeout", "--redirects", "--tee",
              "--local-ranks-filter", "--hang-timeout", "--launch"},
    "explain": {"logs"}, "unused": {"model", "--batch", "--input-shape", "--loss", "--steps"},
    "ras": {"--addr", "--timeout"}, "fr": {"paths", "--prefix", "--world-size"}, "env": set(),
    "ckpt inspect": {"path"}, "ckpt strip": {"path", "--prefix", "--key"}, "ckpt diff": {"path", "--model", "--key"},
    "stacks": {"--pid", "--job", "--stack-dir", "--timeout"}, "stacks merge": {"files"},
}
SHORT = {"--output": "-o", "--output_file": "-J"}
DOC_COMMAND = {"stacks merge": "stacks"}  # the JSON document a command writes (a merge is a stacks document)


def _value_parameters() -> dict[str, set[str]]:
    """command path -> the names of its parameters that take a value, read from the typer app itself."""
    root = typer.main.get_command(build_app())
    found: dict[str, set[str]] = {}

    def walk(command: Any, path: list[str]) -> None:
        if path and command.params:
            found[" ".join(path)] = {max(p.opts, key=len) if p.param_type_name == "option" else p.name
                                     for p in command.params
                                     if not getattr(p, "is_flag", False) and not getattr(p, "count", False)
                                     and p.name not in ("help", "version")}
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(root, [])
    return found


def test_every_value_option_is_classified() -> None:
    """A new command, or a new option or argument that takes a value, must be declared an output (and then
    be tried with every slip here) or not: an output added without the policy fails this test."""
    actual = _value_parameters()
    assert set(actual) == set(OUTPUT_OPTIONS), "commands added or gone: classify their options here"
    for command, names in actual.items():
        unknown = names - OUTPUT_OPTIONS[command] - OTHER_PARAMETERS[command]
        assert not unknown, (f"`{command}` has {sorted(unknown)}: add each to OUTPUT_OPTIONS (and make it go "
                             "through ddpdoctor.outputs) or to OTHER_PARAMETERS")
        assert OUTPUT_OPTIONS[command] | OTHER_PARAMETERS[command] <= names, f"stale entries for `{command}`"


@dataclass(frozen=True)
class Recipe:
    """How to run a command on the workspace: arguments before and after the output option, its input."""

    before: Callable[[Path, str], list[str]]
    after: Callable[[Path], list[str]] = lambda ws: []
    primary: str | None = None  # the input file, relative to the workspace


RECIPES: dict[str, Recipe] = {
    "check": Recipe(lambda ws, opt: ["check", "--only", "env", "--nproc", "1", "--timeout", "30", "--checkpoint",
                                     str(ws / "ddp.pt")], primary="ddp.pt"),
    "bench": Recipe(lambda ws, opt: ["bench", "--nproc", "1", "--backend", "gloo", "-b", "1K", "-e", "1K", "-n", "1",
                                     "-w", "0"]),
    "watch": Recipe(lambda ws, opt: ["watch", "--nproc", "1"], lambda ws: [str(ws / "script.py")], "script.py"),
    "explain": Recipe(lambda ws, opt: ["explain", str(ws / "train.log")], primary="train.log"),
    "unused": Recipe(lambda ws, opt: ["unused", f"{ws / 'model.py'}:make", "--input-shape", "4,8"],
                     primary="model.py"),
    "ras": Recipe(lambda ws, opt: ["ras", "--addr", "127.0.0.1:1", "--timeout", "1"]),
    "fr": Recipe(lambda ws, opt: ["fr", str(ws / "dumps")], primary="dumps/nccl_trace_rank_0"),
    "env": Recipe(lambda ws, opt: ["env", "--no-torch"]),
    "ckpt inspect": Recipe(lambda ws, opt: ["ckpt", "inspect", str(ws / "ddp.pt")], primary="ddp.pt"),
    "ckpt strip": Recipe(lambda ws, opt: ["ckpt", "strip", str(ws / "ddp.pt")]
                         + (["-o", str(ws / "new.pt")] if opt != "--output" else []), primary="ddp.pt"),
    "ckpt diff": Recipe(lambda ws, opt: ["ckpt", "diff", str(ws / "ddp.pt"), "--model", f"{ws / 'model.py'}:make"],
                        primary="ddp.pt"),
    "stacks": Recipe(lambda ws, opt: ["stacks", "--signal", "--stack-dir", str(ws / "reg"), "--timeout", "1"],
                     primary="reg/rank0-pid1.json"),
    "stacks merge": Recipe(lambda ws, opt: ["stacks", "merge", str(ws / "node.json")], primary="node.json"),
}

# What each kind of output is called, for slips that need a name that fits it.
EXTENSION = {"--json": ".json", "--plot": ".png", "--output": ".pt", "--evidence": "", "--output_file": ".json",
             "--log-dir": ""}
# (--log-dir is torchrun's base folder: an existing folder of the user's is fine there, as under torchrun,
# since each run adds a new <run id>_<random>/ folder; a file under its name is the slip.)
USER_FILE = {"--json": "user.json", "--plot": "user.png", "--output": "user.pt", "--evidence": "userdir",
             "--output_file": "user.json", "--log-dir": "user.json"}
WRONG_NAME = {"--json": "out.txt", "--plot": "out.txt", "--output": "out.safetensors", "--evidence": "ev.json",
              "--output_file": "out.txt", "--log-dir": "logs.json"}


def _ours(ws: Path, command: str, option: str) -> Path | None:
    """A file ddpdoctor itself wrote, of the kind ``option`` writes (None where nothing of ours is replaced)."""
    if option == "--json":
        path = ws / "ours.json"
        outputs.write_json(path, {"status": "pass"}, DOC_COMMAND.get(command, command))
        return path
    if option == "--plot":
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = ws / "ours.png"
        fig, _ax = plt.subplots(figsize=(1, 1))
        fig.savefig(path, format="png", metadata={"Software": outputs.PLOT_MARK})
        plt.close(fig)
        assert outputs.is_our_plot(path)
        return path
    return None


def _slip_value(slip: str, ws: Path, command: str, option: str) -> tuple[str, Path | None]:
    """(the value given to the option, the folder to run in) for a slip (:func:`_applies`)."""
    primary = RECIPES[command].primary
    ext = EXTENSION[option]
    if slip == "input":
        return str(ws / str(primary)), None
    if slip == "input-symlink":
        (ws / f"alias{ext}").symlink_to(ws / str(primary))
        return str(ws / f"alias{ext}"), None
    if slip == "input-hardlink":
        os.link(ws / str(primary), ws / f"hard{ext}")
        return str(ws / f"hard{ext}"), None
    if slip == "input-dotslash":
        where = (ws / str(primary)).parent
        return f"./{Path(str(primary)).name}", where
    if slip == "user-file":
        return str(ws / USER_FILE[option]), None
    if slip == "python-source":
        return str(ws / "module.py"), None
    if slip == "read-only":
        ours = _ours(ws, command, option)
        assert ours is not None
        ours.chmod(0o444)
        return str(ours), None
    if slip == "symlink-to-user-file":
        (ws / f"link{ext}").symlink_to(ws / USER_FILE[option])
        return str(ws / f"link{ext}"), None
    if slip == "wrong-extension":
        return str(ws / WRONG_NAME[option]), None
    raise AssertionError(slip)


SLIPS = ["input", "input-symlink", "input-hardlink", "input-dotslash", "user-file", "python-source", "read-only",
         "symlink-to-user-file", "wrong-extension", "other-output"]


def _applies(command: str, option: str, slip: str) -> bool:
    """Input slips need an input; read-only needs a file of ours that may be replaced; two outputs to clash."""
    if slip.startswith("input"):
        return RECIPES[command].primary is not None
    if slip == "read-only":
        return option in ("--json", "--plot")
    if slip == "other-output":
        return len(OUTPUT_OPTIONS[command]) > 1
    return True


CASES = [(command, option, slip) for command, options in sorted(OUTPUT_OPTIONS.items()) for option in sorted(options)
         for slip in SLIPS if _applies(command, option, slip)]


@pytest.mark.parametrize(("command", "option", "slip"), CASES, ids=[f"{c}|{o}|{s}" for c, o, s in CASES])
def test_a_slip_is_refused_in_one_line_and_nothing_changes(command: str, option: str, slip: str, workspace: Path,
                                                           no_ranks_start: None, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    recipe = RECIPES[command]
    flags = [SHORT.get(o, o) for o in OUTPUT_OPTIONS[command]]
    if slip == "other-output":
        # Both outputs on one name: the second is refused (the first, --json, may then hold the error).
        other = next(o for o in sorted(OUTPUT_OPTIONS[command]) if o != option)
        value = str(workspace / f"both{EXTENSION[option] or EXTENSION[other]}")
        extra, cwd = [SHORT.get(other, other), value], None
    else:
        value, cwd = _slip_value(slip, workspace, command, option)
        extra = []
    before = snapshot(workspace)
    argv = [*recipe.before(workspace, option), *extra, SHORT.get(option, option), value, *recipe.after(workspace)]
    code, err = run_main(argv, cwd, monkeypatch, capsys)
    assert code == 2, (argv, err)
    assert err.startswith("ddpdoctor: error: ") and err.count("\n") == 1, err
    assert any(flag in err for flag in flags), f"the refusal names the option: {err}"
    after = snapshot(workspace)
    assert {k: v for k, v in after.items() if k in before} == before, f"{argv}: a file changed"
    for new in sorted(set(after) - set(before)):
        # Only the error document of a --json this run accepted (never an older result, never a user file).
        doc = json.loads((workspace / new).read_text())
        assert (doc["tool"], doc["status"]) == ("ddpdoctor", "error") and "--json" in argv, (argv, new)
