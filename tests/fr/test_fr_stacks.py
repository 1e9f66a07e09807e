"""`fr` joined with `ddpdoctor stacks --json` taken from the same hung job, both for real (the session's
stall job, tests/fr/conftest.py: its dumps and its stacks, read while it hung)."""

from __future__ import annotations

from pathlib import Path

from tests.support import run_cli


def test_the_stalled_rank_is_shown_where_it_is_now(fr_dumps: dict[str, Path]) -> None:
    stacks = fr_dumps["stall_stacks"].read_text(encoding="utf-8")
    assert not stacks.startswith("not read: "), stacks
    out = run_cli(["fr", str(fr_dumps["stall"]), str(fr_dumps["stall_stacks"])], timeout=60)
    assert out.returncode == 1, out.stderr
    assert "rank 1 never issued collective #4" in out.stdout
    line = next(line for line in out.stdout.splitlines() if line.strip().startswith("rank 1 now"))
    assert "at fr_hang.py:" in line and "in main" in line and "pid " in line, out.stdout
