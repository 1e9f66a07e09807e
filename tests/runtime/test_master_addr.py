"""An unresolvable MASTER_ADDR under a plain env launch is said to be one, in one line (issue 20).

``.invalid`` never resolves (RFC 6761, section 6.4), so the name service gives a real, fast failure here
and on any CI machine. Before the fix c10d's TCPStore retried until its timeout and printed 46 lines of
C++ frames ending in "timed out".
"""

from __future__ import annotations

import pytest

from tests.support import clean_env, run_cli


@pytest.mark.parametrize(("command", "rank"), [("check", "0"), ("check", "1"), ("bench", "1")])
def test_unresolvable_master_addr_is_one_line(command: str, rank: str) -> None:
    env = clean_env({"MASTER_ADDR": "no.such.host.invalid", "MASTER_PORT": "29555", "RANK": rank,
                     "WORLD_SIZE": "2", "LOCAL_RANK": rank})
    proc = run_cli([command, "--timeout", "20"], env=env, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, lines
    assert "MASTER_ADDR 'no.such.host.invalid' does not resolve on" in lines[0]
