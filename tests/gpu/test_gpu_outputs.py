"""The output policy with NCCL's own Flight Recorder dumps on a GPU (issue 27).

Needs one NVIDIA GPU (``requires_cuda``). A rank writes its real NCCL dump through ``write_dump`` (a new
file under the umask, never over an older run's dump), and ``fr`` never takes its own verdict, written
into the dump folder, for a dump.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor import outputs
from tests.gpu.support import TARGETS, one_rank_env
from tests.support import REPO, run_cli

pytestmark = pytest.mark.requires_cuda


def test_a_rank_writes_its_nccl_dump_as_a_new_file_and_never_over_an_older_one(tmp_path: Path) -> None:
    env = one_rank_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000"})
    made = subprocess.run([sys.executable, str(TARGETS / "nccl_write_dump.py"), str(tmp_path)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.umask(0o027))
    assert made.returncode == 0, made.stdout + made.stderr
    dump = tmp_path / "nccl_trace_rank_0"
    assert f"first {dump}" in made.stdout and "second refused:" in made.stdout, made.stdout
    assert dump.stat().st_size > 0 and dump.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nccl_trace_rank_0"]  # no partial file left


def test_fr_never_reads_its_own_verdict_beside_a_real_nccl_dump(tmp_path: Path) -> None:
    """A verdict written among the dumps, named like one (``verdict_rank_0.json``), is never read as rank 0's
    dump; asked to write it there again, fr refuses (the file is now in the folder it reads: ambiguous) and
    says what to do -- write it outside the folder -- leaving the first verdict as it was."""
    env = one_rank_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    made = subprocess.run([sys.executable, str(TARGETS / "nccl_fr_dump.py"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    verdict = tmp_path / "verdict_rank_0.json"
    first = run_cli(["fr", str(tmp_path), "--json", str(verdict)], timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    assert outputs.is_our_json(verdict, "fr") and json.loads(verdict.read_text())["ranks"] == [0]
    written = verdict.read_bytes()
    again = run_cli(["fr", str(tmp_path)], timeout=120)  # the verdict beside the dump is not a second rank 0
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    refused = run_cli(["fr", str(tmp_path), "--json", str(verdict)], timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("ddpdoctor: error: --json") and "write it outside" in refused.stderr
    assert verdict.read_bytes() == written
    outside = tmp_path.parent / f"{tmp_path.name}-verdict.json"  # the way out the message names
    moved = run_cli(["fr", str(tmp_path), "--json", str(outside)], timeout=120)
    assert moved.returncode == 0 and json.loads(outside.read_text())["ranks"] == [0], moved.stderr
