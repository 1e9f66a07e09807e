"""The CLI contract: exit codes, one-line errors, and no torch import for commands that need none."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app, main
from tests.support import clean_env, run_cli


@pytest.mark.parametrize(("args", "message"), [
    (["check", "--nproc", "0"], "--nproc must be at least 1"),
    (["check", "--only", "nosuch"], "unknown check id 'nosuch'"),
    (["check", "--skip", "env,bogus"], "unknown check id 'bogus'"),
    # An unset shell variable (`--only "$CHECKS"`) ran every check (an explorer's find).
    (["check", "--only", ""], "--only names no check id"),
    (["check", "--timeout", "-1"], "--timeout must be a positive"),
    (["check", "--timeout", "inf"], "--timeout must be a positive"),
    (["check", "--json", "/nonexistent/dir/r.json"], "does not exist"),
    (["check", "--backend", "mpi"], "--backend must be one of"),
    (["check", "--input-shape", "4,x"], "--input-shape takes positive sizes"),
    (["check", "--checkpoint", "/nonexistent/ckpt.pt"], "no such file"),
    (["check", "--nproc", "two"], "Invalid value for '--nproc'"),
    (["check", "--model", "m:f"], "--model needs an input for the unused_params check"),
    # An input for a model never named was ignored without a word (an explorer's find).
    (["check", "--input-shape", "4,16"], "--input-shape is an input for --model's model: give --model"),
    (["check", "--batch", "data:batch"], "--batch is an input for --model's model: give --model"),
    # typer's Path("") is ".": an unset variable read as the current folder ("not a regular file (a directory)").
    (["stacks", "merge", ""], "FILES holds an empty path"),
    (["stacks", "--signal", "--stack-dir", ""], "--stack-dir is an empty path"),
    (["--bogus"], "No such option: --bogus"),
])
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    proc = run_cli(args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [[], ["ckpt"]], ids=["ddpdoctor", "ddpdoctor-ckpt"])
def test_no_command_prints_the_help_then_one_error_line(args: list[str]) -> None:
    """The help was printed after "ddpdoctor: error: ", as if the whole help were the error (an explorer's find)."""
    proc = run_cli(args, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"Usage: {' '.join(['ddpdoctor', *args])} [OPTIONS] COMMAND")
    assert lines[-1] == f"ddpdoctor: error: no command given to {' '.join(['ddpdoctor', *args])} (the commands are listed above)"
    assert sum(line.startswith("ddpdoctor: error") for line in lines) == 1 and "Traceback" not in proc.stderr


def test_in_process_main_maps_bad_input_to_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--nproc", "0"]) == 2
    assert capsys.readouterr().err.strip() == "ddpdoctor: error: --nproc must be at least 1, got: 0"


def test_typer_app_is_usable_in_process() -> None:
    result = CliRunner().invoke(app, ["check", "--help"])
    assert result.exit_code == 0 and "--nproc" in result.output


def test_help_and_version_do_not_import_torch() -> None:
    code = ("import sys; from ddpdoctor.cli import main; rc = main(['--help']); "
            "assert rc == 0; assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")
    assert "check" in proc.stdout and "ckpt" in proc.stdout


def test_version() -> None:
    assert main(["--version"]) == 0


def test_internal_error_is_exit_3_with_versions(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import ddpdoctor.commands.check as check_command

    def broken(only: list[str], skip: list[str]) -> list:  # type: ignore[type-arg]
        raise ZeroDivisionError("deliberate")

    monkeypatch.setattr(check_command, "select_checks", broken)
    assert main(["check"]) == 3
    err = capsys.readouterr().err
    assert "internal error: ZeroDivisionError: deliberate" in err and "python" in err and "report" in err


_ABSURD = ["9" * 25, "100000"]


@pytest.mark.parametrize("args", [
    *[[cmd, "--nproc", n] for cmd in ("check", "bench") for n in ("0", "-1", *_ABSURD)],
    ["watch", "--nproc", "100000", "train.py"],  # the shared option: watch refuses it too
    *[[cmd, "--timeout", t] for cmd in ("check", "bench") for t in ("0", "-5", "nan", "inf", "1e400", "9" * 40)],
    *[[cmd, "--master-port", p] for cmd in ("check", "bench") for p in ("0", "70000", "-1", "9" * 40)],
    *[[cmd, "--backend", b] for cmd in ("check", "bench") for b in ("weird", "", "NCCL", "gloo\n")],
    *[[cmd, "--min-busbw", v] for cmd in ("check", "bench") for v in ("nan", "inf", "-1")],
    ["bench", "-n", "9" * 30], ["bench", "-w", "9" * 30], ["bench", "-n", "0"], ["bench", "-w", "-1"],
    ["bench", "-c", "9" * 30], ["bench", "-f", "nan"], ["bench", "-d", "float128"],
    ["unused", "--steps", "9" * 30, "m:f"], ["unused", "--steps", "0", "m:f"],
])
def test_absurd_flags_are_one_line_exit_2_before_anything_starts(
        args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # In-process: a flag that slipped through would start ranks and fail this test by its output.
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddpdoctor: error: "), err
    if "--nproc" in args and args[args.index("--nproc") + 1] in _ABSURD:
        assert "this machine can run at most" in err[0] and "MiB per rank" in err[0]


# -- torchrun's conventions for self-launched ranks (issue 28) -----------------------------------------
# Names and meanings from torch/distributed/run.py (--log-dir, -r/--redirects, -t/--tee,
# --local-ranks-filter, each with its underscore spelling where it has a dash; --nproc-per-node).


def test_torchrun_log_options_reach_the_self_launched_ranks(tmp_path: Path) -> None:
    """--tee 3 copies each rank's streams to DIR and the console ([default<local rank>]: prefixes, as
    torchrun); --local_ranks_filter 0 keeps rank 1 off the console but not out of its files. TMPDIR is the
    test's: the launch leaves no torchelastic_* directory there (torchrun's default would). DIR's missing
    parents are created, as torchrun's os.makedirs does (the output policy refused them before)."""
    logs, tmp = tmp_path / "runs" / "logs", tmp_path / "tmp"
    tmp.mkdir()
    proc = run_cli(["check", "--only", "env,barrier", "--nproc_per_node", "2", "--log_dir", str(logs), "--tee", "3",
                    "--local_ranks_filter", "0"], timeout=240, env=clean_env({"TMPDIR": str(tmp)}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = [line for line in proc.stdout.splitlines() if "Result: PASS" in line]
    assert report and all(line.startswith("[default0]:") for line in report)
    assert "[default1]:" not in proc.stdout + proc.stderr
    [run_dir] = list(logs.iterdir())
    assert "Result: PASS" in (run_dir / "attempt_0" / "0" / "stdout.log").read_text()
    assert (run_dir / "attempt_0" / "1" / "stdout.log").exists()
    assert f"the ranks' logs are in {run_dir}/attempt_0/" in proc.stderr
    assert not [p.name for p in tmp.iterdir() if p.name.startswith(("torchelastic_", "ddpdoctor-logs-"))]


def test_redirected_and_filtered_rank_0_reports_into_its_file_only(tmp_path: Path) -> None:
    """--redirects 3 with only local rank 1 on the console: the report (rank 0's) is in rank 0's file, and
    the exit code still comes from rank 0."""
    logs = tmp_path / "logs"
    proc = run_cli(["bench", "--nproc-per-node", "2", "-b", "4K", "-e", "4K", "-n", "1", "-w", "1",
                    "--log-dir", str(logs), "--redirects", "3", "--local-ranks-filter", "1"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Out of bounds values" not in proc.stdout
    [rank0] = list(logs.glob("*/attempt_0/0/stdout.log"))
    assert "# Out of bounds values : 0 OK" in rank0.read_text()


@pytest.mark.parametrize("args, needle", [
    (["--tee", "5"], "--tee takes 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"),
    (["--redirects", "0:9"], "--redirects takes 0 (none)"),
    (["--local-ranks-filter", "0,a"], "--local-ranks-filter must be a comma-separated list of local ranks"),
    (["--nproc", "2", "--local-ranks-filter", "5"], "no such local rank among the 2 started"),
    (["--log-dir", "FILE"], "exists and is not a folder"),
    (["--log-dir", "FILE/logs"], "FILE' is not a folder; give a path of folders"),
])
@pytest.mark.parametrize("command", ["check", "bench"])
def test_bad_torchrun_log_options_are_one_line_exit_2(command: str, args: list[str], needle: str,
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "FILE").write_text("x")
    args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
    assert main([command, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


# -- shell completion (issue 28) ---------------------------------------------------------------------
# typer writes the scripts; they call `ddpdoctor` back with _DDPDOCTOR_COMPLETE=complete_<shell> and the
# words typed (COMP_WORDS/COMP_CWORD for bash, _TYPER_COMPLETE_ARGS for zsh).


def _completion_env(home: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return clean_env({"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home)})


def _bash_complete(script: str, words: list[str], env: dict[str, str]) -> list[str]:
    """Source the script in a real bash and run the completion function as bash would for ``words``."""
    line = " ".join(words)
    program = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
               "_ddpdoctor_completion ddpdoctor\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_bash_completion_script_completes_commands_and_options(tmp_path: Path) -> None:
    env = _completion_env(tmp_path)
    shown = subprocess.run(["ddpdoctor", "--show-completion", "bash"], capture_output=True, text=True, timeout=60,
                           env=env)
    assert shown.returncode == 0 and "_DDPDOCTOR_COMPLETE=complete_bash" in shown.stdout
    script = shown.stdout
    assert _bash_complete(script, ["ddpdoctor", "be"], env) == ["bench"]
    assert set(_bash_complete(script, ["ddpdoctor", "c"], env)) == {"check", "ckpt"}
    assert {"--log-dir", "--log_dir", "--local-ranks-filter", "--local_ranks_filter"} <= \
        set(_bash_complete(script, ["ddpdoctor", "bench", "--lo"], env))
    assert "--locals" in _bash_complete(script, ["ddpdoctor", "stacks", "--lo"], env)
    assert _bash_complete(script, ["ddpdoctor", "ckpt", "st"], env) == ["strip"]


def test_zsh_completion_script_and_its_callback_complete_commands_and_options(tmp_path: Path) -> None:
    env = _completion_env(tmp_path)
    shown = subprocess.run(["ddpdoctor", "--show-completion", "zsh"], capture_output=True, text=True, timeout=60,
                           env=env)
    assert shown.returncode == 0 and shown.stdout.startswith("#compdef ddpdoctor")
    assert "_TYPER_COMPLETE_ARGS=" in shown.stdout and "_DDPDOCTOR_COMPLETE=complete_zsh" in shown.stdout

    def zsh_callback(typed: str) -> str:  # what the script's function runs, with the words zsh passes
        proc = subprocess.run(["ddpdoctor"], capture_output=True, text=True, timeout=60,
                              env={**env, "_TYPER_COMPLETE_ARGS": typed, "_DDPDOCTOR_COMPLETE": "complete_zsh"})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert '"watch":' in zsh_callback("ddpdoctor wa") and '"check":' not in zsh_callback("ddpdoctor wa")
    assert '"--nonblocking":' in zsh_callback("ddpdoctor stacks --non")
    if shutil.which("zsh"):  # the script itself must at least parse in a real zsh
        check = subprocess.run(["zsh", "-n"], input=shown.stdout, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("shell, installed", [("bash", ".bash_completions/ddpdoctor.sh"), ("zsh", ".zfunc/_ddpdoctor")])
def test_install_completion_writes_the_script_for_the_shell_named(shell: str, installed: str, tmp_path: Path) -> None:
    env = _completion_env(tmp_path)
    proc = subprocess.run(["ddpdoctor", "--install-completion", shell], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / installed
    assert f"{shell} completion installed in {script}" in proc.stdout
    assert f"_DDPDOCTOR_COMPLETE=complete_{shell}" in script.read_text()


def test_completion_for_an_unknown_shell_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--show-completion", "tcsh"]) == 2
    assert capsys.readouterr().err.strip() == ("ddpdoctor: error: --show-completion takes one of bash, zsh, fish, "
                                               "powershell, pwsh (or nothing: the shell it runs in), got: 'tcsh'")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this machine")
@pytest.mark.parametrize("argv", [["env", "--no-torch"], ["explain", "LOG"]])
def test_a_report_that_cannot_be_written_is_one_line_exit_2(argv: list[str], tmp_path: Path) -> None:
    """stdout on a full disk (/dev/full: every write fails with ENOSPC): a traceback and "This is a ddpdoctor
    bug", exit 3, before (an explorer's find: `ckpt inspect x.pt > /dev/full`)."""
    log = tmp_path / "job.log"
    log.write_text("hello\n")
    cmd = [sys.executable, "-m", "ddpdoctor", *(str(log) if a == "LOG" else a for a in argv)]
    with open("/dev/full", "w") as full:
        run = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, env=clean_env(), timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr == "ddpdoctor: error: cannot write the output (No space left on device)\n"
