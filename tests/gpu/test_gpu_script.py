"""scripts/gpu-tests.sh on a machine without a GPU, or without time: it never passes and always ends with
its summary line (issue 35). Runs here, on CPU, in a second: with no time left every step is skipped before
it starts. (The full dry run, every pytest step with its GPU tests skipped, is in docs/testing.md.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import REPO, clean_env


def test_without_time_every_step_is_skipped_and_the_summary_is_the_last_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = clean_env({"OUT": str(out), "SUITE_LIMIT": "1", "PYTHON": sys.executable})
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu-tests.sh")], capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu-tests: NO GPU here (the versions step ended skipped"), last
    assert "nothing was tested on a GPU: 0/" in last and "skipped (no time left): install" in last, last
    assert "watch-overhead" in last and f"logs in {out}" in last, last
    assert (out / "summary.txt").read_text().strip() == last
    steps = (out / "steps.txt").read_text()
    assert "versions" in steps and "check-failing" in steps and "watch-overhead" in steps


def test_what_a_device_machine_hands_back_holds_every_log(tmp_path: Path) -> None:
    """A device machine returns at most 8 files of $OUT: the logs travel in one archive, and the logs of the
    steps that did not pass stay beside it (the first H100 run brought back 8 of 41 files, not those)."""
    import tarfile

    out = tmp_path / "out"
    env = clean_env({"OUT": str(out), "SUITE_LIMIT": "1", "PYTHON": sys.executable})
    subprocess.run(["bash", str(REPO / "scripts" / "gpu-tests.sh")], capture_output=True, text=True, timeout=120,
                   env=env, cwd=tmp_path)
    left = sorted(p.name for p in out.iterdir())
    assert len(left) <= 8 and {"summary.txt", "steps.txt", "logs.tar.gz"} <= set(left), left
    with tarfile.open(out / "logs.tar.gz") as archive:
        names = archive.getnames()
    assert {"./steps.txt", "./summary.txt", "./status/versions", "./status/watch-overhead"} <= set(names), names
    assert "logs.tar.gz" in (out / "summary.txt").read_text()
