"""`ddpdoctor stacks` and `stacks merge` through their one parser (typer): in-process with CliRunner and
``main``, and as the real command in a subprocess, against a real blocked Python process read by real
py-spy (tests/targets/blocked_stacks.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app, main
from tests.support import BLOCKED_TARGET, clean_env, run_cli, started

NO_PID = "4194304"  # above the kernel's largest pid_max: no process can have it


@pytest.fixture(scope="module")
def blocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The pid of a real Python process blocked in ``größe()`` (main thread) and ``worker_waits`` (thread)."""
    log = tmp_path_factory.mktemp("target") / "target.log"
    with started([sys.executable, str(BLOCKED_TARGET)], log) as proc:
        yield proc.pid


def _main_frames(doc: dict[str, Any], pid: int) -> list[str]:
    [proc] = [p for p in doc["processes"] if p["pid"] == pid]
    [main_thread] = [t for t in proc["threads"] if t["main"]]
    return [f["function"] for f in main_thread["frames"]]


def test_json_dash_prints_only_the_json_document(blocked: int) -> None:
    result = CliRunner().invoke(app, ["stacks", "--pid", str(blocked), "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the whole of stdout: no report around it
    assert doc["source"] == "py-spy"
    assert _main_frames(doc, blocked)[2:4] == ["größe", "größe"]
    assert {t["name"] for t in doc["processes"][0]["threads"]} == {"MainThread", "worker"}
    assert "wrote" not in result.stdout


def test_json_path_is_written_and_the_report_still_printed(blocked: int, tmp_path: Path) -> None:
    out = tmp_path / "node.json"
    result = CliRunner().invoke(app, ["stacks", "-p", str(blocked), "--all-threads", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert f"the only process (pid {blocked}) is at blocked_stacks.py:" in result.stdout
    assert "in größe() (not in a torch.distributed call)" in result.stdout
    assert "thread worker of pid" in result.stdout  # --all-threads
    assert result.stdout.endswith(f"wrote {out}\n")
    assert "größe" in _main_frames(json.loads(out.read_text(encoding="utf-8")), blocked)


def test_merge_json_path_and_json_dash(blocked: int, tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    assert main(["stacks", "--pid", str(blocked), "--json", str(node)]) == 0
    merged = tmp_path / "merged.json"
    written = CliRunner().invoke(app, ["stacks", "merge", str(node), "--json", str(merged)])
    assert written.exit_code == 0, written.output
    assert f"the only process (pid {blocked}) is at blocked_stacks.py:" in written.stdout
    assert written.stdout.endswith(f"wrote {merged}\n")
    printed = CliRunner().invoke(app, ["stacks", "merge", str(node), "--json", "-"])
    assert printed.exit_code == 0, printed.output
    doc = json.loads(printed.stdout)
    assert doc["processes"] == json.loads(merged.read_text(encoding="utf-8"))["processes"]
    assert doc["jobs"][0]["summary"].startswith(f"the only process (pid {blocked}) is at blocked_stacks.py:")


def test_real_command_json_dash_and_no_torch_import(blocked: int) -> None:
    """The console entry in a fresh interpreter: stdout is the JSON document alone, and torch is never
    imported (ddpdoctor stacks attaches to a stuck job; torch would cost seconds)."""
    code = ("import sys; from ddpdoctor.cli import main; rc = main(sys.argv[1:]);"
            " print('TORCH' if 'torch' in sys.modules else '', file=sys.stderr); sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, "stacks", "--pid", str(blocked), "--json", "-"],
                         capture_output=True, text=True, timeout=120, env=clean_env())
    assert res.returncode == 0, res.stderr
    assert "TORCH" not in res.stderr
    assert "größe" in _main_frames(json.loads(res.stdout), blocked)


# typer before 0.29 words value errors as click does ("... is not in the range ..."), typer 0.29 through
# pydantic ("Input should be ..."): either way the user gets the option's name, the reason, and exit 2.
RANGE = r"(is not in the range 0\.1<=x<=86400\.0|Input should be (greater|less) than or equal to)"


@pytest.mark.parametrize(("args", "message"), [
    (["--timeout", "0"], r"Invalid value for '--timeout': (0\.0 is not in the range 0\.1<=x<=86400\.0\.|"
                         r"Input should be greater than or equal to 0\.1)"),
    (["--timeout", "86401"], RANGE),
    (["--timeout", "inf"], RANGE),
    (["--timeout", "nan"], r"Invalid value for '--timeout': (is not a number of seconds|Input should be)"),
    (["--timeout", "soon"], r"('soon' is not a valid float|'--timeout': Input should be a valid number)"),
    (["--pid", "abc"], r"('abc' is not a valid int|'--pid' / '-p': Input should be a valid integer)"),
    (["--pid", "-3"], r"(-3 is not in the range (x>=1|1<=x<=4194304)|'--pid' / '-p': Input should be greater than or equal to 1)"),
    # Refused by Python's int-digits limit, or where that is lifted (PYTHONINTMAXSTRDIGITS=0) by the range.
    (["--pid", "9" * 5000], r"(is not a valid int|'--pid' / '-p': Unable to parse input string as an integer|"
                            r"is not in the range)"),
    (["--pid", "4194305"], r"4194305 is not in the range 1<=x<=4194304"),
    (["--bogus"], r"No such option: --bogus"),
    (["--json"], r"Option '--json' requires an argument"),
    (["--json", "/nonexistent/dir/out.json"], r"the folder '/nonexistent/dir' does not exist"),
    (["--signal", "--native"], r"--native needs py-spy; --signal dumps only Python frames"),
    # py-spy refuses the pair for every rank: each read as "no stack: py-spy failed", exit 1 (an explorer's find).
    (["--pid", "1", "--native", "--nonblocking"], r"--native cannot be combined with --nonblocking"),
    (["merge"], r"Missing argument 'FILES'"),
])
def test_bad_values_exit_2_with_one_line(args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stacks", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was dumped or printed first
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error: ") and re.search(message, lines[0]), \
        captured.err


def test_bad_value_through_the_real_command() -> None:
    res = run_cli(["stacks", "--timeout", "0"], timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert re.fullmatch(r"ddpdoctor: error: Invalid value for '--timeout': (0\.0 is not in the range "
                        r"0\.1<=x<=86400\.0\.|Input should be greater than or equal to 0\.1) "
                        r"\(see: ddpdoctor stacks --help\)\n", res.stderr), res.stderr


def test_without_py_spy_one_line_names_pip_and_the_signal_fallback(
        blocked: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # py-spy is a dependency, so "not installed" cannot be arranged here for real: the lookup is replaced.
    monkeypatch.setattr("ddpdoctor.stacks.engine.find_py_spy", lambda: None)
    assert main(["stacks", "--pid", str(blocked), "--all-threads"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "`pip install py-spy`" in err and "`ddpdoctor stacks --signal`" in err


def test_missing_pid_with_json_file_reports_it_and_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    res = run_cli(["stacks", "--pid", NO_PID, "--json", str(out)], timeout=120)
    assert res.returncode == 1, res.stderr
    assert f"pid {NO_PID} on {os.uname().nodename}: no stack: no such process" in res.stdout
    assert res.stdout.endswith(f"wrote {out}\n")
    assert json.loads(out.read_text())["processes"][0]["error"] == "no such process"


def test_closed_pipe_ascii_terminal_and_closed_stdout(blocked: int, tmp_path: Path) -> None:
    """`ddpdoctor stacks --json F | head` whose reader is gone, LANG=C-like stdout, and `>&-`: no
    traceback, and the JSON file is written before the report (so a closed pipe does not cost it)."""
    out = tmp_path / "stacks.json"
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written: every write is EPIPE
    try:
        closed = subprocess.run([sys.executable, "-m", "ddpdoctor", "stacks", "--pid", str(blocked), "--json",
                                 str(out)], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
                                env=clean_env())
    finally:
        os.close(write_end)
    ascii_out = run_cli(["stacks", "--pid", str(blocked)], timeout=120,
                        env=clean_env({"PYTHONIOENCODING": "ascii"}))
    no_stdout = subprocess.run(["bash", "-c", f'"{sys.executable}" -m ddpdoctor stacks --pid {blocked} >&-'],
                               capture_output=True, text=True, timeout=120, env=clean_env())
    assert closed.returncode == 1 and closed.stderr == ""
    assert "größe" in _main_frames(json.loads(out.read_text(encoding="utf-8")), blocked)
    assert ascii_out.returncode == 0, ascii_out.stderr
    assert "in gr\\xf6\\xdfe()" in ascii_out.stdout
    assert no_stdout.returncode == 0 and "Traceback" not in no_stdout.stderr, no_stdout.stderr


def test_help_lists_the_options_and_the_merge_command() -> None:
    result = CliRunner().invoke(app, ["stacks", "--help"])
    assert result.exit_code == 0
    for text in ("--pid", "--job", "--native", "--all-threads", "--json", "- prints the JSON", "--signal",
                 "--stack-dir", "--timeout", "merge"):
        assert text in result.stdout, text


def test_merge_never_replaces_a_hosts_capture(blocked: int, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: `stacks merge --json nodeA.json nodeB.json` took nodeA.json as its output (--json's value)
    and replaced that host's capture with a merge of nodeB alone. A merge is its own kind of document."""
    node_a, node_b, merged = tmp_path / "nodeA.json", tmp_path / "nodeB.json", tmp_path / "merged.json"
    assert main(["stacks", "--pid", str(blocked), "--json", str(node_a)]) == 0
    node_b.write_bytes(node_a.read_bytes())
    before = node_a.read_bytes()
    capsys.readouterr()
    assert main(["stacks", "merge", "--json", str(node_a), str(node_b)]) == 2
    err = capsys.readouterr().err
    assert "exists and is a ddpdoctor `stacks` document; stacks merge replaces only its own documents" in err, err
    assert node_a.read_bytes() == before
    assert main(["stacks", "merge", str(node_a), str(node_b), "--json", str(merged)]) == 0
    assert json.loads(merged.read_text(encoding="utf-8"))["command"] == "stacks merge"
    assert main(["stacks", "merge", str(node_a), str(node_b), "--json", str(merged)]) == 0  # a merge replaces a merge
    capsys.readouterr()
    assert main(["stacks", "--pid", str(blocked), "--json", str(merged)]) == 2  # a capture never replaces a merge
    assert "is a ddpdoctor `stacks merge` document" in capsys.readouterr().err
