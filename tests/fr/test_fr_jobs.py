"""`ddpdoctor fr` on real dumps of real gloo jobs that hang three ways, a healthy one, and a rank that died."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support import run_cli


def test_a_healthy_run_passes(fr_dumps: dict[str, Path]) -> None:
    out = run_cli(["fr", str(fr_dumps["healthy"])], timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Result: PASS" in out.stdout and "all 2 ranks agree" in out.stdout


def test_ranks_calling_different_ops_are_named_with_the_users_lines(fr_dumps: dict[str, Path]) -> None:
    out = run_cli(["fr", str(fr_dumps["mismatch"])], timeout=60)
    assert out.returncode == 1, out.stderr
    assert ("collective #4 on the default group: ranks 0,2 in all_reduce at fr_hang.py:"
            in out.stdout), out.stdout
    assert "(train_step); rank 1 in barrier at fr_hang.py:" in out.stdout and "(sync_odd_path)" in out.stdout


def test_a_rank_stalled_before_a_collective_is_the_one_that_never_issued_it(fr_dumps: dict[str, Path]) -> None:
    out = run_cli(["fr", str(fr_dumps["stall"]), "--json", "-"], timeout=60)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    first = doc["groups"][0]["divergences"][0]
    assert (first["kind"], first["seq"], first["diverged_ranks"]) == ("not_issued", 4, [1])
    assert first["summary"].startswith("rank 1 never issued collective #4 (all_reduce at fr_hang.py:")
    assert "its last was #3 (all_reduce at fr_hang.py:" in first["summary"]


def test_a_skipped_collective_from_json_dumps_without_frames(fr_dumps: dict[str, Path]) -> None:
    # Rank 1 skipped step 3's all_reduce: it runs one collective ahead, and its final barrier meets the
    # others' last all_reduce (#6). JSON dumps carry no frames: ops only.
    out = run_cli(["fr", str(fr_dumps["skip"])], timeout=60)
    assert out.returncode == 1, out.stderr
    assert "collective #6 on the default group: ranks 0,2 in all_reduce; rank 1 in barrier" in out.stdout
    assert "no Python frames in these dumps" in out.stdout


def test_a_rank_that_died_is_named_and_the_others_still_judged(fr_dumps: dict[str, Path], tmp_path: Path) -> None:
    out = run_cli(["fr", str(fr_dumps["crash"]), "--world-size", "3"], timeout=60)
    assert out.returncode == 1, out.stderr
    assert "no dump from rank 1: it died or could not write" in out.stdout
    assert "all 2 ranks agree on collectives #1-#4 (last: #4 all_reduce at fr_hang.py:" in out.stdout
    # Partial evidence of a hang: the stall job without rank 0's dump still names rank 1.
    partial = tmp_path / "partial"
    shutil.copytree(fr_dumps["stall"], partial)
    (partial / "nccl_trace_rank_0").unlink()
    out = run_cli(["fr", str(partial), "--world-size", "3"], timeout=60)
    assert out.returncode == 1
    assert "no dump from rank 0" in out.stdout and "rank 1 never issued collective #4" in out.stdout


def test_json_written_atomically_and_text_still_printed(fr_dumps: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "fr.json"
    out = run_cli(["fr", str(fr_dumps["mismatch"]), "--json", str(target)], timeout=60)
    assert out.returncode == 1 and "Result: FAIL" in out.stdout
    doc = json.loads(target.read_text())
    assert doc["status"] == "fail" and doc["ranks"] == [0, 1, 2] and doc["missing_ranks"] == []
    side = doc["groups"][0]["divergences"][0]["sides"][1]
    assert side["ranks"] == [1] and side["call"]["op"] == "barrier" and side["call"]["function"] == "sync_odd_path"
    assert [p.name for p in tmp_path.iterdir()] == ["fr.json"]


def test_old_entries_overwritten_on_one_rank_are_not_a_divergence(fr_dumps: dict[str, Path], tmp_path: Path) -> None:
    # A ring buffer that wrapped further on one rank (more traffic on another group) holds fewer old
    # entries: rank 0's first three entries dropped from its real dump, the rest untouched.
    folder = tmp_path / "wrapped"
    shutil.copytree(fr_dumps["healthy"], folder)
    path = folder / "nccl_trace_rank_0.json"
    doc = json.loads(path.read_text())
    doc["entries"] = doc["entries"][3:]
    path.write_text(json.dumps(doc))
    out = run_cli(["fr", str(folder)], timeout=60)
    assert out.returncode == 0, out.stdout
    assert "buffer holds from #4" in out.stdout


def test_two_groups_waiting_on_each_other_are_a_deadlock_named_per_group(fr_dumps: dict[str, Path]) -> None:
    # Ranks 0-1 also all_reduce on new_group([0, 1]); rank 1 skips that once: rank 0 waits in the pair's #4,
    # rank 1 in the default group's #4. gloo writes no rank lists: the pair's members come from the dumps.
    out = run_cli(["fr", str(fr_dumps["subgroup"]), "--json", "-"], timeout=60)
    assert out.returncode == 1, out.stderr
    groups = {g["label"]: g for g in json.loads(out.stdout)["groups"]}
    assert set(groups) == {"the default group", "group 1 (ranks 0-1)"}
    pair = groups["group 1 (ranks 0-1)"]["divergences"][0]
    assert (pair["kind"], pair["seq"], pair["diverged_ranks"]) == ("not_issued", 4, [1])
    assert "a deadlock (the ranks issue collectives on these groups in different orders)" in pair["summary"]
    world = groups["the default group"]["divergences"][0]
    assert world["diverged_ranks"] == [0] and "rank 0 is waiting in collective #4 on group 1" in world["summary"]
