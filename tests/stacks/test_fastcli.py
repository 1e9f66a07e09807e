"""`ddpdoctor stacks` without typer: the fast parser reads options exactly as typer does, or declines.

The parity tests run typer's real parser (the `stacks` command of the real app) with the engine replaced
by a recorder, since only the parsed options are compared; the other tests run real processes.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ddpdoctor import cli
from ddpdoctor.stacks.fastcli import StacksOptions, parse_fast
from tests.support import BLOCKED_TARGET, REPO, clean_env, started

ACCEPTED = [
    [],
    ["--pid", "5"],
    ["-p", "5", "--pid=7", "--pid", "5"],
    ["--job", "1234"],
    ["--job=slurm:77.0"],
    ["--job", "--native"],  # typer takes the next word as the value, whatever it looks like
    ["--native", "--all-threads", "--native"],
    ["--json", "out.json", "--json=other.json"],
    ["--json", "/abs/dir/x.json", "--json", "dir/x.json"],
    ["--timeout", "2.5"],
    ["--timeout=1e1", "--job", ""],
    ["--timeout", "0.1"],
]
DECLINED = [
    ["--help"], ["-h"], ["merge", "a.json"], ["--signal"], ["--stack-dir", "d", "--signal"],
    ["--pid", "abc"], ["--pid", "-3"], ["--pid", "٣"], ["--pid"], ["--timeout", "0"], ["--timeout", "nan"],
    ["--timeout", "inf"], ["--timeout", "soon"], ["--bogus"], ["-p5"], ["--native=1"], ["--json"],
    ["--json", ""], ["extra"], ["--"], ["--timeout", "86401"], ["--pid", "9" * 5000],
    # typer's Path rewrites these (`./x` -> `x`): declined, so that both name the file alike
    ["--json", "./x.json"], ["--json", "out.json/"], ["--json", "a//b.json"], ["--json", "//x.json"], ["--json", "///x.json"],
    ["--json", "a/./b.json"], ["--json", "."],
]


def _typer_options(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> StacksOptions:
    seen: list[StacksOptions] = []

    def record(options: StacksOptions) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr("ddpdoctor.commands.stacks.run", record)
    assert cli._run_typer(["stacks", *argv]) == 0
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("argv", ACCEPTED, ids=" ".join)
def test_fast_parser_reads_what_typer_reads(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fast = parse_fast(argv)
    assert fast is not None, argv
    assert fast == _typer_options(argv, monkeypatch)


@pytest.mark.parametrize("argv", DECLINED, ids=" ".join)
def test_fast_parser_leaves_the_rest_to_typer(argv: list[str]) -> None:
    assert parse_fast(argv) is None


def test_declined_input_gets_typers_one_line_error() -> None:
    res = subprocess.run([sys.executable, "-m", "ddpdoctor", "stacks", "--timeout", "0"], capture_output=True,
                         text=True, timeout=120, env=clean_env())
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == ("ddpdoctor: error: Invalid value for '--timeout': 0.0 is not in the range "
                                  "0.1<=x<=86400.0. (see: ddpdoctor stacks --help)")


@contextmanager
def _blocked(python: str, log: Path) -> Iterator[int]:
    """A real Python process blocked with known stacks (tests/targets/blocked_stacks.py)."""
    with started([python, str(BLOCKED_TARGET)], log) as proc:
        yield proc.pid


def test_everyday_stacks_run_imports_neither_typer_nor_psutil_nor_py_spy(tmp_path: Path) -> None:
    """The fast path end to end in a fresh interpreter, against a real process read from its memory."""
    with _blocked(sys.executable, tmp_path / "target.log") as pid:
        probe = subprocess.run(
            [sys.executable, "-c",
             "import sys; from ddpdoctor.cli import main; code = main(sys.argv[1:]);"
             " heavy = {'typer', 'psutil', 'torch', 'subprocess', 'typing', 'dataclasses'} & set(sys.modules);"
             " print('HEAVY', sorted(heavy)); sys.exit(code)",
             "stacks", "--pid", str(pid)],
            capture_output=True, text=True, timeout=120, env=clean_env())
    assert probe.returncode == 0, probe.stderr
    assert "HEAVY []" in probe.stdout
    assert "(stacks by memory)" in probe.stdout
    assert f"the only process (pid {pid}) is at blocked_stacks.py:" in probe.stdout
    assert "in größe()" in probe.stdout


def test_stacks_without_py_spy_typer_or_psutil_installed(tmp_path: Path) -> None:
    """An interpreter with none of ddpdoctor's optional tools (pyenv's bare 3.11, ddpdoctor from the
    checkout): 3.11 ranks are read from memory; a 3.10 process gets a one-line reason naming py-spy."""
    bare = sorted(glob.glob("/root/.pyenv/versions/3.11.*/bin/python3.11"))
    old = sorted(glob.glob("/root/.pyenv/versions/3.10.*/bin/python3.10"))
    if not bare or not old:
        pytest.skip("needs pyenv's CPython 3.11 and 3.10")
    env = clean_env({"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    missing = subprocess.run([bare[-1], "-c", "import importlib.util as u; print([m for m in ('typer', 'psutil') "
                              "if u.find_spec(m)])"], capture_output=True, text=True, timeout=60, env=env)
    if missing.stdout.strip() != "[]" or shutil.which("py-spy", path=env["PATH"]) is not None:
        pytest.skip("this pyenv 3.11 has typer/psutil, or py-spy is on /usr/bin")
    with _blocked(bare[-1], tmp_path / "new.log") as new_pid, _blocked(old[-1], tmp_path / "old.log") as old_pid:
        res = subprocess.run([bare[-1], "-m", "ddpdoctor", "stacks", "--pid", str(new_pid), "--pid", str(old_pid)],
                             capture_output=True, text=True, timeout=120, env=env, cwd=str(REPO))
        # --all-threads without py-spy: every thread still comes from memory (only the main one named).
        threads = subprocess.run([bare[-1], "-m", "ddpdoctor", "stacks", "--pid", str(new_pid), "--all-threads"],
                                 capture_output=True, text=True, timeout=120, env=env, cwd=str(REPO))
    assert threads.returncode == 0, threads.stderr
    assert "(stacks by memory)" in threads.stdout and "thread MainThread (main)" in threads.stdout
    assert "in worker_waits" in threads.stdout
    assert res.returncode == 1, res.stderr  # one process could not be read: not a clean bill
    assert "Traceback" not in res.stderr
    assert f"pid {new_pid}" in res.stdout and "in größe()" in res.stdout
    assert (f"pid {old_pid} on {os.uname().nodename}: no stack: py-spy is needed (CPython before 3.11 (no "
            "Py_Version symbol)) but not found") in res.stdout
    assert "(stacks by memory)" in res.stdout  # py-spy never ran


def test_unwritable_json_and_bad_pid_through_the_fast_path(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "ddpdoctor", "stacks", "--pid", "4194304", "--json",
                          str(tmp_path / "missing-dir" / "x.json")], capture_output=True, text=True, timeout=120,
                         env=clean_env())
    assert res.returncode == 2 and res.stdout == "" and "does not exist" in res.stderr
    out = tmp_path / "x.json"
    res = subprocess.run([sys.executable, "-m", "ddpdoctor", "stacks", "--pid", "4194304", "--json", str(out)],
                         capture_output=True, text=True, timeout=120, env=clean_env())
    assert res.returncode == 1, res.stderr
    assert "pid 4194304" in res.stdout and "no such process" in res.stdout and f"wrote {out}" in res.stdout
    assert '"error": "no such process"' in out.read_text()


def test_huge_pid_and_non_numeric_timeout_are_one_line_usage_errors() -> None:
    for args, text in ((["--pid", "9" * 5000], "is not a valid int"),
                       (["--timeout", "nan"], "is not a number of seconds"),
                       (["--timeout", "inf"], "is not in the range 0.1<=x<=86400.0")):
        res = subprocess.run([sys.executable, "-m", "ddpdoctor", "stacks", *args], capture_output=True, text=True,
                             timeout=120, env=clean_env())
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert text in res.stderr and res.stderr.count("\n") == 1


def test_output_to_a_closed_pipe_ascii_terminal_or_closed_stdout(tmp_path: Path) -> None:
    """`ddpdoctor stacks | head -1` that closes early, LANG=C-like stdout, and `>&-`: no traceback."""
    out = tmp_path / "stacks.json"
    with _blocked(sys.executable, tmp_path / "target.log") as pid:
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before anything is written: every write is EPIPE
        try:
            closed = subprocess.run([sys.executable, "-m", "ddpdoctor", "stacks", "--pid", str(pid), "--json",
                                     str(out)], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
                                    env=clean_env())
        finally:
            os.close(write_end)
        ascii_out = subprocess.run([sys.executable, "-m", "ddpdoctor", "stacks", "--pid", str(pid)],
                                   capture_output=True, text=True, timeout=120,
                                   env=clean_env({"PYTHONIOENCODING": "ascii"}))
        no_stdout = subprocess.run(["bash", "-c", f'"{sys.executable}" -m ddpdoctor stacks --pid {pid} >&-'],
                                   capture_output=True, text=True, timeout=120, env=clean_env())
    assert closed.returncode == 1 and closed.stderr == ""
    assert '"größe"' in out.read_text(encoding="utf-8") or "gr\\u00f6\\u00dfe" in out.read_text()
    assert ascii_out.returncode == 0, ascii_out.stderr
    assert "in gr\\xf6\\xdfe()" in ascii_out.stdout
    assert no_stdout.returncode == 0 and "Traceback" not in no_stdout.stderr, no_stdout.stderr
