"""Bad input never runs code, never hangs, never prints a traceback: one line and exit 2. No torch import."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, clean_env, run_cli


class _RunsCode:
    """What a hostile 'dump' carries: unpickling it would call os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.fixture()
def real(fr_dumps: dict[str, Path]) -> Path:
    return fr_dumps["mismatch"]  # real pickle dumps of a 3-rank gloo job


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [{"x": _RunsCode(marker)}]}
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(hostile, protocol=2))
    out = run_cli(["fr", str(path)], timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr
    assert "refused: the pickle names the Python global posix.system" in out.stderr
    assert not marker.exists()


def test_a_truncated_dump_names_its_rank_and_the_others_are_still_judged(real: Path, tmp_path: Path) -> None:
    """Rank 0's dump cut in half (killed while writing): named with why, counted as a rank with no readable dump
    (exit 1, never PASS), the other ranks' dumps still judged; alone, it is one line and exit 2."""
    data = (real / "nccl_trace_rank_0").read_bytes()
    cut = tmp_path / "nccl_trace_rank_0"
    cut.write_bytes(data[: len(data) // 2])
    out = run_cli(["fr", str(cut), str(real / "nccl_trace_rank_1"), str(real / "nccl_trace_rank_2")], timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"rank 0's dump {cut} cannot be read: truncated or corrupt Flight Recorder dump" in out.stdout
    assert "Result: FAIL: " in out.stdout and "Rank(s) 0 left no readable dump" in out.stdout
    alone = run_cli(["fr", str(cut)], timeout=60)
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1, alone.stderr
    assert alone.stderr.startswith(f"ddpdoctor: error: no readable Flight Recorder dump: {cut}: truncated or corrupt")
    assert (real / "nccl_trace_rank_0").read_bytes() == data  # inputs never changed


def test_a_folder_with_empty_and_garbage_dumps_is_never_a_pass(real: Path, tmp_path: Path) -> None:
    """An explorer's find: ranks 1 and 2 left an empty file and garbage under the dump names, and `fr FOLDER`
    skipped both as not dumps, guessed a world of 1 and printed PASS (exit 0). A file named otherwise whose bytes
    are no dump (/tmp's core.12345) is still passed over."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    (folder / "nccl_trace_rank_0").write_bytes((real / "nccl_trace_rank_0").read_bytes())
    (folder / "nccl_trace_rank_1").write_bytes(b"")
    (folder / "nccl_trace_rank_2.json").write_bytes(b"[" * 100_000)
    (folder / "core.12345").write_bytes(b"ELF core")
    out = run_cli(["fr", str(folder), "--json", "-"], timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == "fail" and doc["world_size"] == 3 and doc["missing_ranks"] == [1, 2]
    assert [(u["rank"], u["why"].split(" (")[0]) for u in doc["unreadable_dumps"]] == [
        (1, "empty file"), (2, "not a Flight Recorder dump")]
    assert "core.12345" not in out.stdout


def test_bad_inputs_each_say_what_is_wrong(tmp_path: Path) -> None:
    nameless = tmp_path / "trace.json"
    nameless.write_text(json.dumps({"version": "2.10", "entries": []}))
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        str(tmp_path / "nope"): "no such file or directory",
        str(nameless): "cannot tell which rank wrote it",
        str(empty): "no Flight Recorder dump found",
    }
    text = tmp_path / "nccl_trace_rank_3"
    text.write_text("hello")
    cases[str(text)] = "not a Flight Recorder dump"
    # An empty argument (an unset shell variable) is named as such, not as ": no such file or directory".
    cases[""] = "ddpdoctor: error: PATH is empty (''): give the dump files or their folder"
    for arg, message in cases.items():
        out = run_cli(["fr", arg], timeout=60)
        assert out.returncode == 2, (arg, out.stdout)
        assert message in out.stderr and out.stderr.count("\n") == 1, out.stderr
    # A --world-size beyond any job is refused as the option it is, not blamed on the dumps (which hold rank 3).
    out = run_cli(["fr", str(text.parent), "--world-size", "5000000"], timeout=60)
    assert out.returncode == 2, out.stdout
    assert out.stderr == "ddpdoctor: error: --world-size 5000000: more ranks than any job has (at most 1048576)\n"


def test_fr_never_imports_torch(real: Path) -> None:
    probe = ("import sys; from ddpdoctor.cli import main; code = main(['fr', sys.argv[1]]); "
             "print('torch' in sys.modules); sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", probe, str(real)], capture_output=True, text=True, timeout=60,
                         env=clean_env(), cwd=str(REPO))
    assert out.returncode == 1, out.stderr  # the mismatch job: a divergence found
    assert out.stdout.strip().endswith("False")
