"""Every ``ddpdoctor`` command line shown in README.md and docs/ names a real command and real options.

Docs rot silently: a renamed flag still reads well. Each command line in a fenced code block (``ddpdoctor
...``, ``$ ddpdoctor ...``, ``torchrun ... -m ddpdoctor ...``, ``srun ... ddpdoctor ...``) is parsed with
the shell's rules and checked against the typer app itself: the command path exists and every ``--option``
it uses is one that command declares. The check reads the app through click's own objects, so it needs no
list kept by hand.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
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


# -- values, not only names (issue 28) ------------------------------------------------------------------
# A documented command line must also parse: its values convert (click's types), and the values
# ddpdoctor itself validates (check ids, bench's sizes/types/ops, launch options) are ones it accepts.

# A word that stands for a value the reader supplies: N, PATH, SEC, M:F, FILE.json, <...>, [...], a|b.
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_:.]*$|[<>\[\]|*]|\.\.\.")


def _validate_values(name: str, params: dict[str, Any]) -> None:
    """ddpdoctor's own validation of a parsed command line, without running the command."""
    from ddpdoctor.bench import (
        foreign_notes,
        op_from_binary,
        parse_dtypes,
        parse_ops,
        parse_redops,
        parse_size,
    )
    from ddpdoctor.commands.check import select_checks
    from ddpdoctor.commands.options import launch_logs
    from ddpdoctor.runtime.entry import validate_launch_options

    if name in ("check", "bench"):
        validate_launch_options(params["nproc"], params["backend"], params["master_port"], params["timeout"])
        launch_logs(params["log_dir"], params["redirects"], params["tee"], params["local_ranks_filter"])
    if name == "check":
        select_checks(params["only"], params["skip"])
    if name == "bench":
        parse_ops(params["op"] or (op_from_binary(params["test"]) if params["test"] else "all_reduce"))
        parse_dtypes(params["dtype"])
        parse_redops(params["redop"])
        for key in ("min_bytes", "max_bytes"):
            parse_size(params[key])
        foreign_notes({p: params[p.lstrip("-")] for p in ("--ngpus", "--nthreads", "--agg_iters", "--cudagraph")})


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_line_parses_with_valid_values(doc: Path) -> None:
    from ddpdoctor.errors import DoctorError

    root = typer.main.get_command(build_app())
    click_exc = __import__(typer.BadParameter.__module__, fromlist=["UsageError"])
    problems = []
    for line in _command_lines(doc.read_text()):
        args = _invocation(line)
        if not args or args[0].startswith("-") or any(_PLACEHOLDER.search(a) for a in args) or "--help" in args:
            continue  # synopsis lines and root options (--install-completion would install)
        found = _resolve(root, list(args))
        if found is None:
            continue  # reported by test_every_documented_command_line_exists
        command, rest = found
        try:
            ctx = command.make_context(command.name, list(rest), resilient_parsing=False)
            _validate_values(command.name, ctx.params)
        except (click_exc.UsageError, click_exc.BadParameter, DoctorError) as exc:
            problems.append(f"{line!r}: {exc}")
    assert not problems, f"{doc.relative_to(REPO)}:\n" + "\n".join(problems)


# -- environment variables ---------------------------------------------------------------------------
# Every variable the docs name is one the code reads, or one documented for another program with why.

# Read by another program; the docs name it because the user sets or looks at it there.
DOCUMENTED_EXTERNAL = {
    "CUDA_KERNEL_ASSERT": "not a variable: PyTorch's kernel assertion macro, whose output explain.md says is recognised",
    "MASTER_HOST": "torchpack's dist-run sets it and its scripts read it; explain.md names its KeyError as env-not-set",
    "KEEP_LOGS": "scripts/gpu-tests.sh reads it (every log left loose, not packed); testing.md says so",
    "NCCL_GRAPH_FILE": "NCCL reads it (graph search override); explain.md names it as the cause of an error",
    "NCCL_TOPO_FILE": "NCCL reads it (topology override); explain.md names it as the cause of an error",
    "TMPDIR": "Python's tempfile reads it; testing.md says where the tests' temporary files go",
    "TORCHELASTIC_ERROR_FILE": "torchrun sets it for each worker; explain.md says where the error file is",
    "TORCH_DISTRIBUTED_DEBUG": "PyTorch reads it; watch.md says how it relates to watch's own checks",
    "TORCH_FR_DUMP_TEMP_FILE": "PyTorch reads it (where Flight Recorder dumps go); watch.md points at it",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "PyTorch reads it (the older name of the dump prefix); fr.md points at it",
    "TORCH_WARN": "not a variable: PyTorch's C++ warning macro, one of the message sources explain-kb.md names",
}
_ENV_PREFIX = (r"(?:NCCL|TORCH|GLOO|CUDA|SLURM|MASTER|DDPDOCTOR|PET|TORCHELASTIC|OMPI|PMI|PMIX|LOCAL|WORLD|GROUP|"
               r"ROLE|NVIDIA|OMP|PYTHON|UCX|FI)")
_ENV_NAME = re.compile(rf"(?<![A-Za-z0-9_./-])(?:\$\{{?([A-Z][A-Z0-9_]*[A-Z0-9])|({_ENV_PREFIX}_[A-Z0-9_]*[A-Z0-9])\b"
                       r"|([A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9])(?==))")


def _string_constants(roots: list[Path]) -> set[str]:
    """Every string literal of the Python sources under ``roots`` that is not a docstring: what the code can
    look up (``os.environ.get("X")``, a tuple of watched names), not what it merely talks about."""
    found: set[str] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text())
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)}
            found |= {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                      and isinstance(node.value, str) and id(node) not in docstrings}
    return found


def test_every_environment_variable_in_the_docs_is_read_or_documented_external() -> None:
    code = _string_constants([REPO / "ddpdoctor", REPO / "benchmarks", REPO / "examples"])
    suite = _string_constants([REPO / "tests"])  # docs/testing.md describes the suite's own variables
    problems = []
    for doc in DOCS:
        names = {next(g for g in m.groups() if g) for m in _ENV_NAME.finditer(doc.read_text())}
        for name in sorted(names):
            # testing.md and the internals pages describe the suite's own variables (DDPDOCTOR_SHOW_HELD_OUT).
            read = name in code or ((doc.name == "testing.md" or doc.parent.name == "internals") and name in suite)
            if not read and name not in DOCUMENTED_EXTERNAL:
                problems.append(f"{doc.relative_to(REPO)} names {name}, which nothing in ddpdoctor reads (read it, "
                                "or list it in DOCUMENTED_EXTERNAL with the program that does)")
    assert not problems, "\n".join(problems)
    unused = [n for n in DOCUMENTED_EXTERNAL if not any(n in d.read_text() for d in DOCS)]
    assert not unused, f"DOCUMENTED_EXTERNAL lists names no doc mentions any more: {unused}"


# -- example scripts ----------------------------------------------------------------------------------

# A script the line runs (not ``examples/m.py:make`` given to ddpdoctor as MODULE:FACTORY).
_SCRIPT = re.compile(r"(?<![\w/])((?:examples|benchmarks|scripts)/[\w./-]+\.(?:py|sh|sbatch))(?![\w:])")


def _script_flags(path: Path) -> set[str]:
    """The options a script takes, read from its source: what its argparse declares
    (``add_argument("--x", ...)``) and the ``--x`` it looks for by hand (``"--x" in sys.argv``)."""
    flags = {"-h", "--help"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"--?[a-z][a-z0-9-]*",
                                                                                            node.value):
            flags.add(node.value)
    return flags


def test_every_script_the_docs_run_exists_and_takes_the_flags_shown() -> None:
    problems = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            for raw in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = re.sub(r"\s#\s.*$", "", raw.strip().removeprefix("$ "))
                for match in _SCRIPT.finditer(line):
                    path = REPO / match.group(1)
                    if not path.is_file():
                        problems.append(f"{doc.relative_to(REPO)}: {match.group(1)} does not exist")
                        continue
                    if path.suffix != ".py":
                        continue
                    rest = re.split(r"\s*(?:&&|\|\||;|\||>)\s*", line[match.end():])[0]
                    known = _script_flags(path)
                    for word in rest.split():
                        flag = word.split("=", 1)[0]
                        if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in known:
                            problems.append(f"{doc.relative_to(REPO)}: {match.group(1)} has no option {flag}")
    assert not problems, "\n".join(problems)


def test_the_fr_example_with_a_missing_out_folder_is_one_line_not_tracebacks(tmp_path: Path) -> None:
    """docs/fr.md runs examples/fr_hang.py --out DIR: a DIR that does not exist is one line from the script
    (and exit 2 from every rank before any process group exists), not each rank's traceback."""
    from tests.support import clean_env, free_port, torchrun_cmd

    missing = tmp_path / "nosuch" / "fr"
    cmd = [*torchrun_cmd(), "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(REPO / "examples" / "fr_hang.py"), "--mode", "mismatch", "--out", str(missing)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=clean_env())
    assert proc.returncode != 0
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("fr_hang.py:")]
    assert ours == [f"fr_hang.py: --out {missing} does not exist: create it first (mkdir -p {missing})"]
    assert "FileNotFoundError" not in proc.stderr and 'fr_hang.py", line' not in proc.stderr
    assert "exitcode  : 2" in proc.stderr  # torchrun's own summary: every rank left with 2
    assert not missing.exists()


# -- lists that help and docs both give ---------------------------------------------------------------


def _help(*args: str) -> str:
    from typer.testing import CliRunner

    result = CliRunner().invoke(build_app(args[0]), [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_check_ids_in_help_registry_and_docs_agree() -> None:
    from ddpdoctor.checks import CHECK_IDS

    text = _help("check")
    for flag in ("--only", "--skip"):
        listed = re.search(rf"{flag} IDS .*?: ([a-z_, ]+)\.", text)
        assert listed, f"check --help lists the ids {flag} takes"
        assert tuple(x.strip() for x in listed.group(1).split(",")) == CHECK_IDS
    section = (REPO / "docs" / "checks.md").read_text().split("## Check ids", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M)) == set(CHECK_IDS)


def test_strip_outputs_in_help_code_and_docs_agree() -> None:
    from ddpdoctor.outputs import TORCH_FILE

    single_file = TORCH_FILE.extensions  # what the output policy lets `strip -o` write as one torch.save file
    helped = re.search(r"if OUT ends in ([./a-z]+);", _help("ckpt", "strip"))
    assert helped and tuple(helped.group(1).split("/")) == single_file
    row = next(line for line in (REPO / "docs" / "ckpt.md").read_text().splitlines() if line.startswith("| `-o OUT`"))
    documented = re.search(r"when OUT ends in ((?:`\.[a-z.]+`/?)+)", row)
    assert documented and tuple(documented.group(1).replace("`", "").split("/")) == single_file
    policy_doc = " ".join((REPO / "docs" / "outputs.md").read_text().split())
    policy = re.search(r"the name fits what is written: .*?; ((?:`\.[a-z.]+`(?:, | or ))+)`\.safetensors`", policy_doc)
    assert policy and tuple(re.findall(r"`(\.[a-z.]+)`", policy.group(1))) == single_file


def test_bench_lists_in_help_code_and_docs_agree() -> None:
    from ddpdoctor.bench.analysis import DTYPES, OP_NAMES, REDOPS

    text = _help("bench")
    dtypes = re.search(r"-d, --dtype, --datatype <str> ([a-z0-9, ]+) \(nccl-tests' names\)", text)
    assert dtypes and tuple(x.strip() for x in dtypes.group(1).split(",")) == tuple(DTYPES)
    ops = re.search(r"--op <str> all_reduce \(default\), ([a-z_, ]+) \(comma-separated\)", text)
    assert ops and ("all_reduce", *(x.strip() for x in ops.group(1).split(","))) == OP_NAMES
    redops = re.search(r"-o, --redop <str> Reduction of all_reduce and reduce_scatter: ([a-z, ]+), or all", text)
    assert redops and tuple(x.strip() for x in redops.group(1).split(",")) == tuple(REDOPS)
    page = (REPO / "docs" / "bench.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `-d"))
    assert tuple(re.findall(r"`([a-z0-9]+)`", row.split("|")[2]))[:len(DTYPES)] == tuple(DTYPES)


def test_exit_codes_in_help_and_docs_agree() -> None:
    """Where a command's --help states its exit codes, its docs page states the same ones, and for `ras`
    (whose help gives each code's meaning) in the same words."""
    text = _help("ras")
    clauses = dict(re.findall(r"(\d): (.*?)(?=; \d: |\.$| Options:)", text.split("Exit ", 1)[1]))
    assert set(clauses) == {"0", "1", "2"}
    page = " ".join((REPO / "docs" / "ras.md").read_text().split())
    for code, meaning in clauses.items():
        assert f"`{code}` {meaning}" in page, f"docs/ras.md gives exit {code} as ras --help does: {meaning!r}"
    root = typer.main.get_command(build_app())
    stated = 0
    for name, command in root.commands.items():
        leaves = {(name, sub): c for sub, c in command.commands.items()} if hasattr(command, "commands") else {}
        for args in [(name,), *leaves]:
            said = re.findall(r"Exit (\d)|[,;] (\d)(?::| when| otherwise| if)", _help(*args).split("Options:")[0])
            codes = {c for group in said for c in group if c}
            if not codes:
                continue
            page = (REPO / "docs" / f"{name}.md").read_text()
            missing = [c for c in codes if not re.search(rf"(?i)\bexit (?:code:? )?`?{c}\b|`{c}`", page)]
            assert not missing, f"ddpdoctor {' '.join(args)} --help states exit {missing}; docs/{name}.md does not"
            stated += 1
    assert stated >= 3  # ras, ckpt inspect, ckpt diff state theirs


def test_readme_claims_of_shared_options_hold() -> None:
    """A README sentence "`a` and `b` share `--x`..." (or "They share ..." after one naming them) is true
    of every command it names; options after "no"/"in place of" are claims of absence and are skipped."""
    root = typer.main.get_command(build_app())
    text = " ".join((REPO / "README.md").read_text().split())
    sentences = re.split(r"(?<=\.) (?=[A-Z`])", text)
    checked = 0
    for i, sentence in enumerate(sentences):
        for clause in sentence.split(";"):
            match = re.search(r"\bshares?\b", clause)
            if not match:
                continue
            subject = clause[:match.start()]
            commands = [c for c in re.findall(r"`([a-z]+)`", subject) if c in root.commands]
            if not commands and i:
                commands = [c for c in re.findall(r"`([a-z]+)`", sentences[i - 1]) if c in root.commands]
            claimed = clause[match.end():]
            claimed = re.sub(r"(?:\bno|in place of) `[^`]*`", "", claimed)
            options = re.findall(r"`(--[a-z][a-z0-9-]*)[^`]*`", claimed)
            for command in commands:
                known = _options(root.commands[command])
                missing = [o for o in options if o not in known]
                assert not missing, f"README: {command} has no {missing} (in: {clause.strip()!r})"
                checked += len(options)
    assert checked, "the README says which options the multi-rank commands share"
