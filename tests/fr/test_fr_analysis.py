"""The verdict as a pure function of dumps, for what gloo cannot record here.

Test doubles, labelled: gloo in torch 2.13 records no send/recv in the Flight Recorder, and NCCL cannot run
without a GPU, so the p2p and size-mismatch dumps below are written by hand in the NCCL dump layout of
FlightRecorder.cpp (version 2.10 keys; profiling names 'nccl:send 0->1' / 'nccl:recv 1<-0' as
ProcessGroupNCCL builds them; pg_config ranks as the string "[0, 1]"). Everything else is tested on real
dumps in test_fr_jobs.py.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from ddpdoctor.fr import diagnose, render_text, to_json


def _entry(seq: int, op: str, sizes: list[list[int]], *, p2p_seq: int = 0, created: int = 0,
           line: int = 10, state: str = "completed") -> dict[str, Any]:
    is_p2p = op.startswith(("send", "recv"))
    return {"record_id": created, "pg_id": 0, "process_group": ["0", "default_pg"],
            "collective_seq_id": 0 if is_p2p else seq, "p2p_seq_id": p2p_seq, "op_id": seq, "is_p2p": is_p2p,
            "profiling_name": f"nccl:{op}", "time_created_ns": 1000 + created, "input_sizes": sizes,
            "input_dtypes": ["Float"] * len(sizes), "output_sizes": sizes, "output_dtypes": ["Float"] * len(sizes),
            "state": state, "timeout_ms": 600000,
            "frames": [{"name": "all_reduce", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/"
                        "distributed_c10d.py", "line": 2500},
                       {"name": "train_step", "filename": "/job/train.py", "line": line}]}


def _write(folder: Path, rank: int, entries: list[dict[str, Any]], world: int = 2) -> None:
    doc = {"version": "2.10", "comm_lib_version": "2.21.5",
           "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(world)))}},
           "pg_status": {"0": {"last_enqueued_collective": max([e["collective_seq_id"] for e in entries] + [0]),
                               "last_started_collective": -1, "last_completed_collective": -1}},
           "entries": entries}
    (folder / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(doc))


def test_a_send_without_its_recv_names_the_rank_that_never_posted_it(tmp_path: Path) -> None:
    _write(tmp_path, 0, [_entry(1, "all_reduce", [[4]]), _entry(0, "send 0->1", [[8]], p2p_seq=1, created=1),
                         _entry(0, "send 0->1", [[8]], p2p_seq=2, created=2, line=20, state="scheduled")])
    _write(tmp_path, 1, [_entry(1, "all_reduce", [[4]]), _entry(0, "recv 1<-0", [[8]], p2p_seq=1, created=1)])
    report = diagnose([str(tmp_path)])
    found = report.groups[0].divergences[0]
    assert found.kind == "p2p_unmatched" and found.diverged_ranks == [1]
    assert found.summary == ("p2p on the default group: rank 0 sent 2 time(s) to rank 1 but rank 1 posted 1 recv(s) "
                             "from rank 0: the last send (send at train.py:20 (train_step)) has no matching recv")


def test_different_shapes_in_one_all_reduce_show_both_shapes(tmp_path: Path) -> None:
    _write(tmp_path, 0, [_entry(1, "all_reduce", [[4]]), _entry(2, "all_reduce", [[1024, 4]])])
    _write(tmp_path, 1, [_entry(1, "all_reduce", [[4]]), _entry(2, "all_reduce", [[1024, 8]])])
    report = diagnose([str(tmp_path)])
    found = report.groups[0].divergences[0]
    assert found.kind == "size_mismatch" and found.seq == 2
    assert found.summary == ("collective #2 (all_reduce) on the default group has different tensors: rank 0 with "
                             "input [[1024, 4]] Float at train.py:10 (train_step); rank 1 with input [[1024, 8]] "
                             "Float at train.py:10 (train_step)")


def test_groups_are_matched_by_rank_set_and_a_missing_last_rank_is_named(tmp_path: Path) -> None:
    # world 4 from pg_config's ranks: ranks 2 and 3 left no dump, and the text says so.
    _write(tmp_path, 0, [_entry(1, "all_reduce", [[4]])], world=4)
    _write(tmp_path, 1, [_entry(1, "all_reduce", [[4]])], world=4)
    report = diagnose([str(tmp_path)])
    assert report.missing == [2, 3] and report.groups[0].ranks_known
    assert "no dump from ranks 2-3: they died or could not write" in render_text(report)
    assert to_json(report)["groups"][0]["ranks_from"] == "pg_config"


def test_a_diverging_rank_gets_its_current_stack_from_a_stacks_json(tmp_path: Path) -> None:
    # The stacks document's layout is the one docs/stacks.md shows (written by `ddpdoctor stacks --json`).
    _write(tmp_path, 0, [_entry(1, "all_reduce", [[4]]), _entry(2, "all_reduce", [[4]])])
    _write(tmp_path, 1, [_entry(1, "all_reduce", [[4]])])
    frames = [{"function": "wait", "file": "/usr/lib/python3.11/threading.py", "line": 320, "where": "x"},
              {"function": "load_batch", "file": "/job/data.py", "line": 77, "where": "data.py:77 in load_batch"}]
    stacks = {"tool": "ddpdoctor", "version": "0.1.0", "host": "node-b", "source": "py-spy",
              "processes": [{"pid": 4242, "rank": 1, "host": "node-b", "error": None,
                             "threads": [{"thread_id": 1, "name": "MainThread", "main": True, "frames": frames}]}]}
    (tmp_path / "node-b.json").write_text(json.dumps(stacks))
    report = diagnose([str(tmp_path)])
    text = render_text(report)
    assert "rank 1 never issued collective #2" in text
    assert "rank 1 now at data.py:77 in load_batch (pid 4242 on node-b)" in text  # the stdlib frame skipped
    assert to_json(report)["groups"][0]["divergences"][0]["stacks"]["1"]["where"] == "data.py:77 in load_batch"


def test_an_old_version_1_dump_is_read_by_its_own_field_names(tmp_path: Path) -> None:
    # Dump version 1.x (NCCLUtils.hpp dump() before collective_seq_id existed): 'seq_id', 'pg_id', no
    # process_group, no dtypes, no pg_status. Written by hand in that layout (no such torch here).
    for rank, ops in ((0, ["all_reduce", "all_reduce"]), (1, ["all_reduce", "broadcast"])):
        entries = [{"pg_id": 0, "seq_id": i + 1, "profiling_name": f"nccl:{op}", "input_sizes": [[4]],
                    "output_sizes": [[4]], "state": "scheduled", "time_created_ns": 1000 + i,
                    "frames": [{"name": "step", "filename": "/job/train.py", "line": 30 + i}]}
                   for i, op in enumerate(ops)]
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(
            pickle.dumps({"version": "1.4", "pg_config": {}, "entries": entries}, protocol=2))
    report = diagnose([str(tmp_path)])
    assert report.summary() == ("collective #2 on the default group: rank 0 in all_reduce at train.py:31 (step); "
                                "rank 1 in broadcast at train.py:31 (step)")


def test_file_names_give_the_rank_with_or_without_a_prefix(tmp_path: Path) -> None:
    # watch's bundle names dumps fr_rank_<N>; other writers pick their own prefix (--prefix).
    _write(tmp_path, 0, [_entry(1, "all_reduce", [[4]])])
    _write(tmp_path, 1, [_entry(1, "all_reduce", [[4]])])
    (tmp_path / "nccl_trace_rank_1.json").rename(tmp_path / "fr_rank_1")
    (tmp_path / "README.txt").write_text("notes, not a dump")
    report = diagnose([str(tmp_path)])
    assert [d.rank for d in report.dumps] == [0, 1] and report.status == "pass"
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "nccl_trace_rank_0.json").rename(other / "job7-trace-12.json")
    assert [d.rank for d in diagnose([str(other)], prefix="job7-trace-").dumps] == [12]


def test_other_files_in_a_dumps_folder_are_skipped_not_fatal(tmp_path: Path) -> None:
    """`ddpdoctor fr /tmp` (PyTorch's default dump folder) meets files like tmpab3k9 and core.12345."""
    _write(tmp_path, 0, [_entry(1, "all_reduce", [[4]])])
    _write(tmp_path, 1, [_entry(1, "all_reduce", [[4]])])
    (tmp_path / "tmpab3k9").write_bytes(b"some other program's scratch file")
    (tmp_path / "core.12345").write_bytes(b"\x7fELF core dump")
    report = diagnose([str(tmp_path)])
    assert report.status == "pass" and [d.rank for d in report.dumps] == [0, 1]


def test_a_damaged_sequence_jump_or_rank_is_refused_not_allocated(tmp_path: Path) -> None:
    """A dump whose numbers would make us allocate billions of slots is one clear error (exit 2)."""
    import pytest

    from ddpdoctor.errors import DoctorError

    _write(tmp_path, 0, [_entry(1, "all_reduce", [[4]]), _entry(10**10, "all_reduce", [[4]])])
    with pytest.raises(DoctorError, match="damaged"):
        diagnose([str(tmp_path / "nccl_trace_rank_0.json")])
    (tmp_path / "nccl_trace_rank_0.json").unlink()
    _write(tmp_path, 0, [_entry(1, "all_reduce", [[4]])])
    (tmp_path / "nccl_trace_rank_0.json").rename(tmp_path / "nccl_trace_rank_999999999999.json")
    with pytest.raises(DoctorError, match="more ranks than any job"):
        diagnose([str(tmp_path)])


def test_ranks_on_several_hosts_are_named_per_host_from_the_stacks_files(tmp_path: Path) -> None:
    # Flight Recorder dumps carry no host name; the `stacks --json` files of each host (a `stacks merge`
    # document as well) say where each rank runs.
    _write(tmp_path, 0, [_entry(1, "all_reduce", [[4]]), _entry(2, "all_reduce", [[4]])])
    _write(tmp_path, 1, [_entry(1, "all_reduce", [[4]])])
    frames = [{"function": "main", "file": "/job/train.py", "line": 9, "where": "train.py:9 in main"}]
    for rank, host, command in ((0, "node-a", "stacks"), (1, "node-b", "stacks merge")):
        doc = {"tool": "ddpdoctor", "command": command, "version": "0.1.0", "host": host, "source": "py-spy",
               "processes": [{"pid": 100 + rank, "rank": rank, "host": host, "error": None,
                              "threads": [{"thread_id": 1, "name": "MainThread", "main": True, "frames": frames}]}]}
        (tmp_path / f"{host}.json").write_text(json.dumps(doc))
    report = diagnose([str(tmp_path)])
    assert "  hosts: node-a: rank 0; node-b: rank 1" in render_text(report).splitlines()
    assert to_json(report)["hosts"] == {"node-a": [0], "node-b": [1]}


def test_one_collective_agreed_on_is_said_in_the_singular(tmp_path: Path) -> None:
    """"all 2 ranks agree on collectives #1" for a single collective (an explorer's find); a span stays plural."""
    for rank in (0, 1):
        _write(tmp_path, rank, [_entry(1, "all_reduce", [[4]])])
    assert "all 2 ranks agree on collective #1 (last: #1 all_reduce" in render_text(diagnose([str(tmp_path)]))
    for rank in (0, 1):
        _write(tmp_path, rank, [_entry(1, "all_reduce", [[4]]), _entry(2, "all_reduce", [[4]], created=1)])
    assert "all 2 ranks agree on collectives #1-#2 (last: #2 all_reduce" in render_text(diagnose([str(tmp_path)]))
