"""`check --checkpoint` on a hostile checkpoint ends, with a finding, inside its deadline (issue 20).

The memo bomb (tests/ckpt/hostile.py: 2^39 leaves in ~200 bytes) used to be hashed in C while the check
ran: the deadline thread never got the GIL and `check --timeout 5` did not end. The reader now refuses it
while reading (its expanded-size limit), so the check fails with the reason in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.ckpt import hostile as h
from tests.support import REPO, run_cli


def test_check_with_a_memo_bomb_checkpoint_ends_with_a_failure(tmp_path: Path) -> None:
    bomb = h.write_torch_zip(tmp_path / "bomb.pt", h.memo_bomb())
    before = bomb.read_bytes()
    report = tmp_path / "report.json"
    # A regression is this subprocess's timeout (TimeoutExpired), never a hung test run.
    res = run_cli(["check", "--nproc", "1", "--only", "state_dict", "--checkpoint", str(bomb), "--timeout", "10",
                   "--json", str(report)], cwd=REPO, timeout=120)
    assert res.returncode == 1, (res.stdout[-2000:], res.stderr[-2000:])
    [finding] = [f for f in json.loads(report.read_text())["findings"] if f["check"] == "state_dict"]
    assert finding["status"] == "fail"
    assert "expands to more than 50,000,000 objects (shared references)" in finding["summary"]
    assert bomb.read_bytes() == before
