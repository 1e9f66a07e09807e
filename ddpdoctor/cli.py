"""The ``ddpdoctor`` command line: parse options, call the engine, map errors to exit codes.

One parser for every command: typer. Each command family lives in ``ddpdoctor/commands/<family>.py``
and adds itself to the app through its ``register(app)`` function. Those modules import nothing heavy at
import time: ``ddpdoctor --help``, ``stacks``, ``explain`` and ``env --no-torch`` must start without
importing torch.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import importlib
import io
import sys
from collections.abc import Callable

import typer

from ddpdoctor import __version__, outputs
from ddpdoctor.errors import EXIT_BUG, EXIT_PROBLEM, EXIT_USAGE, DoctorError

# Command name -> the module under ddpdoctor/commands that registers it. Only the invoked command's
# module is imported (the others' imports are start-up time that `ddpdoctor stacks` on a hung node need
# not pay); `ddpdoctor --help` imports them all to list them.
COMMANDS = {"check": "check", "env": "env", "bench": "bench", "ckpt": "ckpt", "stacks": "stacks",
            "watch": "watch", "explain": "explain", "unused": "unused",
            "ras": "ras", "fr": "fr"}


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"ddpdoctor {__version__}")
        raise typer.Exit(0)


def build_app(command: str | None = None) -> typer.Typer:
    """The typer app with every command, or with only ``command`` when that names one."""
    app = typer.Typer(
        name="ddpdoctor",
        help="Diagnose PyTorch DistributedDataParallel jobs: before training, while running, after a hang or crash.",
        add_completion=True,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def _root(
        version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                     help="Print the version and exit."),
    ) -> None:
        """ddpdoctor: one-screen diagnoses for DDP training problems, with the fix."""

    families = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for family in families:
        importlib.import_module(f"ddpdoctor.commands.{family}").register(app)
    return app


def __getattr__(name: str) -> typer.Typer:
    # `from ddpdoctor.cli import app` (tests, typer.testing) gets the full app, built on demand.
    if name == "app":
        return build_app()
    raise AttributeError(f"module 'ddpdoctor.cli' has no attribute {name!r}")


def bug_report(exc: BaseException) -> str:
    """Exit-3 text: what broke and the versions a maintainer needs."""
    import platform
    import traceback

    torch_version = "not imported"
    if "torch" in sys.modules:
        torch_version = getattr(sys.modules["torch"], "__version__", "?")
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return (
        f"{tb}\nddpdoctor {__version__} hit an internal error: {type(exc).__name__}: {exc}\n"
        f"python {platform.python_version()}, torch {torch_version}, {platform.platform()}\n"
        "This is a ddpdoctor bug: please report it with the text above."
    )


_invocation: list[str] = []


def invocation_args() -> list[str]:
    """The arguments ddpdoctor was started with: self-launched ranks are started with the same ones."""
    return list(_invocation)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the command and turn every outcome into an exit code (0/1/2/3)."""
    args = sys.argv[1:] if argv is None else argv
    _invocation[:] = args
    _escape_unencodable_output()
    failure: list[str] = []
    outputs.begin_session()
    code = _guarded(lambda: _run(args), failure)
    # A failed run's --json file gets the error, never an older run's result (see ddpdoctor.outputs).
    outputs.end_session(code, failure[0] if failure else None, __version__)
    return code


def _escape_unencodable_output() -> None:
    """Print what the terminal cannot encode as escapes instead of crashing on it.

    Names from users' files reach the report verbatim: a pickle decodes strings with ``surrogatepass``,
    so a checkpoint key may hold a lone surrogate (``'module.\\udc80w'``), and a log may hold bytes that
    are not UTF-8. Written to a pipe or a C-locale terminal, such a character would raise
    ``UnicodeEncodeError`` after the work is done; escaped, the user still sees which key it is.
    """
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


# Shells typer writes completion scripts for.
COMPLETION_SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _completion_for(flag: str, shell: str) -> int:
    """``--show-completion SHELL`` / ``--install-completion SHELL``: for that shell, not the detected one.

    typer's own options detect the running shell and take no value, so ``--show-completion zsh`` typed in
    bash would print bash's script and drop ``zsh`` unsaid; with a shell named, the same typer functions
    are called for that shell.
    """
    from typer._completion_shared import get_completion_script, install

    if shell not in COMPLETION_SHELLS:
        raise DoctorError(f"{flag} takes one of {', '.join(COMPLETION_SHELLS)} (or nothing: the shell it runs in), "
                          f"got: {shell!r}")
    complete_var = "_DDPDOCTOR_COMPLETE"
    if flag == "--show-completion":
        print(get_completion_script(prog_name="ddpdoctor", complete_var=complete_var, shell=shell))
        return 0
    installed_shell, path = install(shell=shell, prog_name="ddpdoctor", complete_var=complete_var)
    print(f"{installed_shell} completion installed in {path}")
    print("Completion will take effect once you restart the terminal")
    return 0


def _run(args: list[str]) -> int:
    if len(args) == 2 and args[0] in ("--show-completion", "--install-completion") and not args[1].startswith("-"):
        return _completion_for(args[0], args[1])
    # The click exceptions typer raises: from click itself, or from the copy newer typer releases vendor.
    click_exc = sys.modules[typer.BadParameter.__module__]
    command = next((arg for arg in args if not arg.startswith("-")), None)
    app = build_app(command)
    try:
        result = app(args=args, prog_name="ddpdoctor", standalone_mode=False)
    except click_exc.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # click >= 8.2: `ddpdoctor`, `ddpdoctor ckpt` with no command
            # The help is what was asked for; it is not an error message to put after "error:".
            what = f"ddpdoctor {command}" if command in COMMANDS else "ddpdoctor"
            print(exc.format_message().rstrip(), file=sys.stderr)
            print(f"\nddpdoctor: error: no command given to {what} (the commands are listed above)", file=sys.stderr)
            return EXIT_USAGE
        # One line, not click's three-line usage block: the user sees what is wrong at once.
        # click leaves ctx unset for some parse errors (an option missing its value): name the command then.
        if exc.ctx is not None and " " in exc.ctx.command_path:
            where = exc.ctx.command_path.split(" ", 1)[1] + " "
        else:
            where = f"{command} " if command in COMMANDS else ""
        hint = f" (see: ddpdoctor {where}--help)"
        print(f"ddpdoctor: error: {exc.format_message()}{hint}", file=sys.stderr)
        return EXIT_USAGE
    except typer.Abort:
        print("ddpdoctor: aborted", file=sys.stderr)
        return 130
    except typer.Exit as exc:
        return int(exc.exit_code)
    except click_exc.ClickException as exc:
        print(f"ddpdoctor: error: {exc.format_message()}", file=sys.stderr)
        return EXIT_USAGE
    return int(result) if isinstance(result, int) else 0


def printable(text: str) -> str:
    """``text`` with control and separator characters escaped (``\\x1b``, ``\\n``, ``\\u2028``).

    Error lines quote names taken from users' files (a global in a checkpoint's pickle, a key, a path):
    a name holding a newline or ``\\x1d`` would break the one-line error into several, and one holding
    ``ESC[`` would drive the user's terminal.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


# A write that failed for want of room or a device error: the environment's, not a bug of ours.
_OUTPUT_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO))


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush has nowhere to fail again."""
    import os

    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _guarded(command: Callable[[], int], failure: list[str] | None = None) -> int:
    """Run ``command``; a DoctorError is one line and its exit code, anything unexpected a bug report.

    ``failure`` receives the one-line text of a failure, for the error document of ``--json``."""
    said = failure if failure is not None else []
    try:
        code = command()
        sys.stdout.flush()  # here, not in the interpreter's last flush: a full disk is then one line, not a trace
        return code
    except DoctorError as exc:
        print(f"ddpdoctor: error: {printable(str(exc))}", file=sys.stderr)
        said.append(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        print("ddpdoctor: interrupted", file=sys.stderr)
        said.append("interrupted")
        return 130
    except BrokenPipeError:  # `ddpdoctor stacks | head`: the reader has what it wanted
        _stdout_to_devnull()
        return EXIT_PROBLEM
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in _OUTPUT_ERRNOS:
            # `ddpdoctor ckpt inspect x.pt > /dev/full`, a full disk or quota under a redirect: printed a traceback
            # and "This is a ddpdoctor bug" (an explorer's find). Where our own files are written, outputs.py
            # says which file; here it was the report on stdout.
            _stdout_to_devnull()
            print(f"ddpdoctor: error: cannot write the output ({exc.strerror or exc})", file=sys.stderr)
            said.append(f"cannot write the output ({exc.strerror or exc})")
            return EXIT_USAGE
        print(bug_report(exc), file=sys.stderr)
        said.append(f"ddpdoctor internal error: {type(exc).__name__}: {exc}"[:500])
        return EXIT_BUG


def entry() -> None:
    code = main()
    # The interpreter's last act is a garbage collection that walks every object the imports made: ~20 ms
    # of a 0.15 s `ckpt strip`, more than strip's own work on a 1 GiB file. Our outputs are closed and
    # synced by now (ddpdoctor.outputs) and the standard streams are flushed by the interpreter itself, so
    # that walk finds nothing to finish; freezing skips it (gc.freeze: the objects stay, uncollected).
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
