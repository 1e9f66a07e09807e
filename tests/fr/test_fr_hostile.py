"""`ddpdoctor fr` under hostile input (issue 20), without a job: crafted pickles (memo sharing, deep
nesting, huge integers, infinities), JSON dumps with numbers no writer emits, and FIFOs. Each case
hung or exited 3 before the fix; now each is one line and exit 2 (a FIFO in a folder is skipped)."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import can_drop_root_read, clean_env, run_cli, without_root_read

HANG_S = 60  # a hang in the code under test becomes TimeoutExpired: a failure, not a stuck CI run


def _entry(**fields: Any) -> dict[str, Any]:
    """A 2.x entry as FlightRecorder::dump writes it (torch/csrc/distributed/c10d/FlightRecorder.cpp)."""
    entry = {"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1,
             "p2p_seq_id": 0, "op_id": 1, "profiling_name": "gloo:all_reduce", "time_created_ns": 1,
             "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
             "state": "completed", "is_p2p": False, "frames": []}
    entry.update(fields)
    return entry


def _dump(entries: list[Any], **doc: Any) -> dict[str, Any]:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}},
            "pg_status": {"0": {"last_enqueued_collective": 1, "last_started_collective": 1,
                                "last_completed_collective": 1}}, "entries": entries, **doc}


def _exit_2(res: subprocess.CompletedProcess[str], *texts: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr[-2000:])
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert all(t in res.stderr for t in texts), res.stderr


def _binunicode(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _deep_profiling_name(depth: int) -> bytes:
    """A protocol-2 pickle of one dump whose entry's profiling_name is a list nested ``depth`` deep:
    Python's pickler cannot write that (it recurses), so the opcodes are written by hand."""
    nested = b"]" * depth + b"a" * (depth - 1)  # EMPTY_LIST x depth, then APPEND each into its parent
    entry = b"}" + b"(" + _binunicode("profiling_name") + nested + _binunicode("collective_seq_id") + b"K\x01" + b"u"
    return b"\x80\x02}" + _binunicode("entries") + b"]" + entry + b"a" + b"s."


def _shared_sizes(n: int) -> dict[str, Any]:
    inner = list(range(n))
    sizes = [inner] * n  # one list, referenced n times: the pickle memo keeps the file small
    return _dump([_entry(input_sizes=sizes)] * n)


def _tuple_bomb(levels: int) -> bytes:
    """Opcodes of ``t(levels)``, ``t0 = 1``, ``t(k+1) = (tk, tk)`` through the memo (BINPUT/BINGET): 2^levels
    leaves in a few hundred bytes. Written by hand: building it in Python to pickle it would hash it."""
    body = b"K\x01q\x00"
    for k in range(levels):
        body += b"h" + bytes([k]) + b"h" + bytes([k]) + b"\x86q" + bytes([k + 1])  # BINGET x2, TUPLE2, BINPUT
    return body


def _doubling_name(levels: int) -> dict[str, Any]:
    name: Any = ("all_reduce",)
    for _ in range(levels):
        name = (name, name)  # 2**levels leaves, levels+1 objects
    return _dump([_entry(profiling_name=name)])


@pytest.mark.parametrize(("build", "said"), [
    (lambda: pickle.dumps(_shared_sizes(3000), protocol=2), "expand to"),
    (lambda: pickle.dumps(_doubling_name(40), protocol=2), "expand to"),
    (lambda: _deep_profiling_name(100_000), "nested deeper"),
    (lambda: pickle.dumps(_dump([_entry(pg_id=10**5000)]), protocol=2), "integer"),
    (lambda: pickle.dumps(_dump([_entry(time_created_ns=float("inf"))]), protocol=2), "inf"),
    (lambda: json.dumps(_dump([_entry(time_created_ns=1)])).replace('"time_created_ns": 1', '"time_created_ns": 1e400').encode(), "1e400"),
    (lambda: json.dumps(_dump([_entry(time_created_ns=1)])).replace('"time_created_ns": 1', '"time_created_ns": Infinity').encode(), "Infinity"),
    (lambda: json.dumps(_dump([_entry()])).replace('"ranks": "[0]"', '"ranks": "[1e400]"').encode(), "ranks"),
    # Found by the long fuzz run: a tuple of 2^39 leaves (through the memo) as a dict KEY was hashed in C by
    # the C unpickler's SETITEM, before any check could run: a hang no deadline stops.
    (lambda: b"\x80\x02}" + _tuple_bomb(39) + b"K\x01s.", "a tuple used as a dict key"),
    (lambda: pickle.dumps(_dump([_entry(state={"completed"})]), protocol=4), "a set"),  # EMPTY_SET + ADDITEMS
], ids=["memo-quadratic", "memo-exponential", "deep", "huge-int", "inf-float", "json-1e400", "json-infinity",
        "ranks-1e400", "tuple-bomb-key", "set"])
def test_hostile_dump_is_one_line_exit_2(tmp_path: Path, build: Any, said: str) -> None:
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(build())
    before = path.read_bytes()
    res = run_cli(["fr", str(path)], timeout=HANG_S)
    _exit_2(res, str(path), said)
    assert path.read_bytes() == before


def test_stacks_file_with_infinite_pid_is_one_line_exit_2(tmp_path: Path) -> None:
    dump = tmp_path / "nccl_trace_rank_0.json"
    dump.write_text(json.dumps(_dump([_entry()])))
    stacks = tmp_path / "node.json"
    stacks.write_text('{"tool": "ddpdoctor", "processes": [{"pid": Infinity, "rank": 0, "host": "h", '
                      '"threads": [{"main": true, "frames": [{"function": "f", "file": "/w/t.py", "line": 1}]}]}]}')
    res = run_cli(["fr", str(dump), str(stacks)], timeout=HANG_S)
    _exit_2(res, str(stacks), "Infinity")
    assert res.stdout == "", res.stdout[:500]  # refused before any verdict is printed


def test_fifos_are_never_opened(tmp_path: Path) -> None:
    """A FIFO named like a dump: given by name it is refused, in a folder it is skipped; never opened."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    (folder / "nccl_trace_rank_0.json").write_text(json.dumps(_dump([_entry()])))
    os.mkfifo(folder / "nccl_trace_rank_1")
    os.mkfifo(folder / "stacks.json")
    res = run_cli(["fr", str(folder), "--json", "-"], timeout=HANG_S)
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr
    assert json.loads(res.stdout)["world_size"] == 1
    _exit_2(run_cli(["fr", str(folder / "nccl_trace_rank_1")], timeout=HANG_S), "not a regular file")


@pytest.mark.skipif(not can_drop_root_read(), reason="as root, needs setpriv to drop the capabilities that "
                    "skip permission checks")
def test_a_folder_this_user_may_not_enter_is_one_line(tmp_path: Path) -> None:
    """A dump folder of mode 000: listing it was exit 3 (PermissionError); a dump inside it was 'no such file'."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    (folder / "nccl_trace_rank_0").write_bytes(b"\x80\x02}q\x00.")
    folder.chmod(0)
    try:
        for target, words in ((folder, "cannot list the folder (Permission denied)"),
                              (folder / "nccl_trace_rank_0", "permission denied")):
            res = subprocess.run(without_root_read([sys.executable, "-m", "ddpdoctor", "fr", str(target)]),
                                 capture_output=True, text=True, timeout=120, env=clean_env())
            assert res.returncode == 2, res.stderr[-2000:]
            assert res.stderr.startswith("ddpdoctor: error: ") and words in res.stderr, res.stderr
            assert len(res.stderr.strip().splitlines()) == 1
    finally:
        folder.chmod(0o755)
