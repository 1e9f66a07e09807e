"""py-spy's own flags through `ddpdoctor stacks` (issue 28): ``--locals`` and ``--nonblocking`` reach py-spy as
py-spy spells them, and what they bring back reaches the user. Real py-spy against a real blocked process
(tests/targets/blocked_stacks.py: ``größe(depth)`` recursing down to ``depth == 0``, then waiting)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.stacks.engine import py_spy_dump_args
from tests.support import BLOCKED_TARGET, run_cli, started


@pytest.fixture(scope="module")
def blocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    log = tmp_path_factory.mktemp("target") / "target.log"
    with started([sys.executable, str(BLOCKED_TARGET)], log) as proc:
        yield proc.pid


def _groesse_frames(doc: dict, pid: int) -> list[dict]:
    [proc] = [p for p in doc["processes"] if p["pid"] == pid]
    [main] = [t for t in proc["threads"] if t["main"]]
    return [f for f in main["frames"] if f["function"] == "größe"]


def test_locals_shows_each_frames_variables_in_the_report_and_the_json(blocked: int, tmp_path: Path) -> None:
    out = tmp_path / "node.json"
    result = CliRunner().invoke(app, ["stacks", "--pid", str(blocked), "--locals", "--json", str(out)])
    assert result.exit_code == 0, result.output
    # The innermost größe frame holds depth 0, each caller one more: the values py-spy read, in order.
    frames = _groesse_frames(json.loads(out.read_text(encoding="utf-8")), blocked)
    assert [[(v["name"], v["repr"], v["arg"]) for v in f["locals"]] for f in frames] == \
        [[("depth", str(d), True)] for d in range(4)]
    assert "          depth = 0  (argument)" in result.stdout
    assert "          depth = 3  (argument)" in result.stdout
    # A process without a rank is named by its pid once ("pid N@host", not "pid N=pid N@host").
    assert f"    pid {blocked}@" in result.stdout and f"pid {blocked}=pid" not in result.stdout


def test_without_locals_no_variables_are_read_or_shown(blocked: int) -> None:
    result = CliRunner().invoke(app, ["stacks", "--pid", str(blocked), "--json", "-"])
    assert result.exit_code == 0, result.output
    assert all("locals" not in f for f in _groesse_frames(json.loads(result.stdout), blocked))


def test_locals_survive_stacks_merge(blocked: int, tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    assert CliRunner().invoke(app, ["stacks", "--pid", str(blocked), "-l", "--json", str(node)]).exit_code == 0
    merged = CliRunner().invoke(app, ["stacks", "merge", str(node)])
    assert merged.exit_code == 0, merged.output
    assert "depth = 0  (argument)" in merged.stdout


def test_nonblocking_reads_the_same_stack_without_pausing_it(blocked: int) -> None:
    result = CliRunner().invoke(app, ["stacks", "--pid", str(blocked), "--nonblocking", "--json", "-"])
    assert result.exit_code == 0, result.output
    assert len(_groesse_frames(json.loads(result.stdout), blocked)) == 4


def test_flags_reach_py_spy_as_py_spy_spells_them() -> None:
    assert py_spy_dump_args(7) == ["dump", "--json", "--pid", "7"]
    assert py_spy_dump_args(7, native=True, locals_level=2, nonblocking=True) == \
        ["dump", "--json", "--pid", "7", "--native", "--locals", "--locals", "--nonblocking"]


@pytest.mark.parametrize("flag", ["--locals", "--nonblocking", "--native"])
def test_py_spy_flags_with_signal_mode_are_one_line_exit_2(flag: str, tmp_path: Path) -> None:
    proc = run_cli(["stacks", "--signal", flag, "--stack-dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and f"{flag} needs py-spy; --signal dumps only" in proc.stderr
