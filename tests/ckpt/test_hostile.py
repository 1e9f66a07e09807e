"""Hostile and absurd checkpoints (issue 20): every command ends quickly, in one line with exit 2 or normally.

The files are built opcode by opcode (tests/ckpt/hostile.py) inside the containers torch writes. Each case
here broke ddpdoctor before the reader got its limits: a hang (the memo bomb, hashed in C), a search of
n^3 paths, or an internal error (exit 3) on a huge integer, a deep nesting, a list used as a key.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ddpdoctor.outputs import PARTIAL_SUFFIX
from tests.ckpt import hostile as h
from tests.support import REPO, can_drop_root_read, run_cli, without_root_read

MODEL = "examples.ckpt_models:make_mlp"


def _state(directory: Path) -> dict[str, tuple[str, int]]:
    """Name -> (SHA-256, mtime) of every file: inputs unchanged, nothing new (no output, no partial file)."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir", p.stat().st_mtime_ns)
            for p in directory.iterdir()}


def _one_line_exit_2(res: Any, expected: str) -> None:
    assert res.returncode == 2, (res.stdout[-2000:], res.stderr[-2000:])
    assert res.stderr.startswith("ddpdoctor: error: ") and expected in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def _with_model(*extra: bytes) -> bytes:
    """``{"model": {"module.w": tensor}, **extra}``."""
    return h.pkl(pickle.EMPTY_DICT + pickle.MARK + h.s("model") + h.state_dict() + b"".join(extra) + pickle.SETITEMS)


def _payload(marker: Path) -> bytes:
    """``"payload": os.system("touch MARKER")`` (posix.system, as pickle names it on Linux)."""
    return (h.s("payload") + h.glob("posix", "system") + h.s(f"touch {marker}") + pickle.TUPLE1 + pickle.REDUCE)


@pytest.mark.parametrize("container", ["zip", "legacy"])
def test_memo_bomb_is_refused_at_once_and_runs_nothing(tmp_path: Path, container: str) -> None:
    """{t39: 1} with t(k+1) = (tk, tk) through the memo: 2^39 leaves. Before: every command hashed forever."""
    src_dir = tmp_path / "in"
    src_dir.mkdir()
    marker = tmp_path / "PWNED"
    # {t39: 1, "payload": os.system(...)}: the bomb is refused before the payload's GLOBAL is even read.
    bomb = h.pkl(pickle.EMPTY_DICT + pickle.MARK + h.bomb_tuple() + b"K\x01" + _payload(marker) + pickle.SETITEMS)
    write = h.write_torch_zip if container == "zip" else h.write_legacy
    src = write(src_dir / "bomb.pt", bomb)
    assert src.stat().st_size < 2048
    before = _state(src_dir)
    for args in (["ckpt", "inspect", str(src), "--trust"], ["ckpt", "strip", str(src), "-o", str(tmp_path / "o.pt")]):
        res = run_cli(args, cwd=REPO, timeout=90)
        _one_line_exit_2(res, "pickle expands to more than 50,000,000 objects (shared references); refusing")
    assert _state(src_dir) == before
    assert not marker.exists() and not (tmp_path / "o.pt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]


def test_memo_bomb_grown_after_sharing_is_measured_again() -> None:
    """A list shared 2^20 times through tuples, filled only afterwards: the sizes seen while reading were 1."""
    from ddpdoctor.ckpt import unpickler

    body = pickle.EMPTY_LIST + h.put(0) + h.put(1)
    for k in range(1, 21):
        body += h.get(k) + pickle.TUPLE2 + h.put(k + 1)
    # Back to the list, and 100 items into it: 2^21 * 100 leaves in the finished graph.
    body += pickle.POP + h.get(0) + pickle.MARK + b"K\x01" * 100 + pickle.APPENDS + pickle.POP + h.get(21)
    with pytest.raises(unpickler.PickleLimitError, match="expands to more than"):
        unpickler.loads(h.pkl(body), trust=True)


def test_state_dict_search_judges_each_shared_mapping_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dicts sharing one dict at each of 3 levels, 60 keys each: the search looked at 60^3 paths (~60^4 steps)."""
    from ddpdoctor.ckpt import locate, open_checkpoint

    src = h.write_torch_zip(tmp_path / "shared.pt", h.shared_dicts(60, 3))
    ckpt = open_checkpoint(src)
    calls = 0
    real = locate._state_dict_pairs

    def counting(node: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(node)

    monkeypatch.setattr(locate, "_state_dict_pairs", counting)
    [loc] = locate.find_state_dicts(ckpt.root)
    assert loc.path == ("k0", "k0", "k0") and loc.name == "k0/k0/k0"
    assert calls <= 4, calls  # one per distinct mapping (before: 60 + 60^2 + 60^3)


def _optimizer(lr: bytes, group_key: bytes = h.s("lr")) -> bytes:
    """``"optimizer": {"state": {}, "param_groups": [{group_key: lr}]}`` (a real dict for the group)."""
    group = pickle.EMPTY_DICT + group_key + lr + pickle.SETITEM
    return (h.s("optimizer") + pickle.EMPTY_DICT + pickle.MARK + h.s("state") + pickle.EMPTY_DICT
            + h.s("param_groups") + pickle.EMPTY_LIST + group + pickle.APPEND + pickle.SETITEMS)


_OD = h.glob("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.REDUCE
_HUGE = h.long4(1 << 400_000)  # a 50,001-byte integer
_INT2040 = h.long4(1 << 2040)  # 256 bytes: within the reader's limit, beyond LONG1
_INT2039 = h.long4((1 << 2039) - 1)  # 255 bytes: the largest our writer (LONG1) keeps; far beyond int64

# name -> (pickle, expected: "ok" or a phrase of the one-line error)
CASES: dict[str, tuple[bytes, str]] = {
    "huge_epoch": (_with_model(h.s("epoch"), _HUGE), "an integer of 50,001 bytes"),
    "huge_lr": (_with_model(_optimizer(_HUGE)), "an integer of 50,001 bytes"),
    "huge_shape": (h.pkl(h.state_dict(h.s("b"), h.tensor(shape=_HUGE + pickle.TUPLE1))), "an integer of 50,001"),
    "huge_storage_size": (h.pkl(h.state_dict(h.s("b"), h.tensor(numel=_HUGE))), "an integer of 50,001 bytes"),
    "int2039_shape": (h.pkl(h.state_dict(h.s("b"), h.tensor(shape=_INT2039 + pickle.TUPLE1))), "ok"),
    "int2039_storage_size": (h.pkl(h.state_dict(h.s("b"), h.tensor(numel=_INT2039))), "ok"),
    "int2039_lr": (_with_model(_optimizer(_INT2039)), "ok"),
    "list_key_in_param_group": (_with_model(_optimizer(b"K\x01", pickle.EMPTY_LIST)), "a list used as a dict key"),
    "list_key_in_ordered_dict_group": (_with_model(h.s("optimizer") + pickle.EMPTY_DICT + pickle.MARK + h.s("state")
                                                   + pickle.EMPTY_DICT + h.s("param_groups") + pickle.EMPTY_LIST
                                                   + _OD + pickle.EMPTY_LIST + b"K\x01" + pickle.SETITEM
                                                   + pickle.APPEND + pickle.SETITEMS), "ok"),
    "deep_tuple_key": (h.deep_tuple_key(100_000), "nests objects more than 200 levels deep"),
    "deep_list": (h.deep_list(2000), "nests objects more than 200 levels deep"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_absurd_values_are_one_line_or_read_normally(case: str, tmp_path: Path, cli: Any) -> None:
    data, expected = CASES[case]
    src_dir, out = tmp_path / "in", tmp_path / "o.pt"
    src_dir.mkdir()
    srcs = [h.write_torch_zip(src_dir / "c.pt", data), h.write_legacy(src_dir / "legacy.pt", data)]
    before = _state(src_dir)
    for src in srcs:
        runs = [["ckpt", "inspect", str(src)], ["ckpt", "inspect", str(src), "--json", "-"],
                ["ckpt", "strip", str(src), "-o", str(out)], ["ckpt", "diff", str(src), "--model", MODEL]]
        if src.name == "legacy.pt":  # --trust converts with torch.save, which recursed past its limit
            runs.append(["ckpt", "strip", str(src), "-o", str(out), "--trust"])
        for args in runs:
            res = cli(args)
            if expected == "ok" and src.name == "c.pt":
                assert res.returncode in (0, 1), (args, res.stderr)
            elif expected == "ok":  # legacy files go through torch.load, which may refuse sizes beyond int64
                assert res.returncode in (0, 1, 2), (args, res.stderr)
                assert res.returncode != 2 or len(res.stderr.strip().splitlines()) == 1, res.stderr
            else:
                _one_line_exit_2(res, expected)
                assert res.stdout == ""
            out.unlink(missing_ok=True)
    assert _state(src_dir) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]


def test_strip_of_an_integer_beyond_long1_is_refused_in_one_line(tmp_path: Path, cli: Any) -> None:
    """2^2040 needs 256 bytes: LONG1 holds 255, and torch.load(weights_only=True) does not read LONG4.
    Before: strip crashed in our writer (exit 3). Now it refuses before writing; 2^2039 - 1 still round-trips."""
    from ddpdoctor.ckpt import unpickler

    for value in ((1 << 2039) - 1, -(1 << 2039)):
        assert unpickler.loads(unpickler.dumps({"v": value}))[0] == {"v": value}
    src = h.write_torch_zip(tmp_path / "c.pt", _with_model(h.s("epoch"), _INT2040))
    res = cli(["ckpt", "strip", str(src), "-o", str(tmp_path / "o.pt")])
    _one_line_exit_2(res, "an integer of 256 bytes cannot be written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
    fits = h.write_torch_zip(tmp_path / "fits.pt", _with_model(h.s("epoch"), h.long4((1 << 2039) - 1)))
    assert cli(["ckpt", "strip", str(fits), "-o", str(tmp_path / "o.pt")]).returncode == 0
    loaded = torch.load(tmp_path / "o.pt", weights_only=True)
    assert loaded["epoch"] == (1 << 2039) - 1 and list(loaded["model"]) == ["w"]


def _safetensors(path: Path, header: bytes) -> Path:
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    return path


_ENTRY = '"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'
ST_HEADERS = {
    "infinity": ('{"module.w": {"dtype": "F32", "shape": [Infinity], "data_offsets": [0, 8]}}', "Infinity"),
    "5000_digits": ('{"module.w": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 8]}}',
                    "5000 digits"),
    "deep": ('{"module.w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": '
             + "[" * 100_000 + "]" * 100_000 + "}", "deep"),
    "float_size": ('{"module.w": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}', "lacks a valid"),
    "negative_size": ('{"module.w": {"dtype": "F32", "shape": [-2, -1], "data_offsets": [0, 8]}}', "lacks a valid"),
}


@pytest.mark.parametrize("case", sorted(ST_HEADERS))
def test_absurd_safetensors_headers_and_shard_indexes(case: str, tmp_path: Path, cli: Any) -> None:
    header, expected = ST_HEADERS[case]
    src = _safetensors(tmp_path / "c.safetensors", header.encode())
    before = _state(tmp_path)
    for args in (["ckpt", "inspect", str(src)], ["ckpt", "strip", str(src), "-o", str(tmp_path / "o.safetensors")]):
        res = cli(args)
        _one_line_exit_2(res, "corrupt safetensors header")
        assert expected in res.stderr, res.stderr
    assert _state(tmp_path) == before
    # The same absurdity in a shard index (model.safetensors.index.json), next to a valid shard.
    shards = tmp_path / "shards"
    shards.mkdir()
    _safetensors(shards / "model-00001-of-00001.safetensors", ("{" + _ENTRY + "}").encode())
    index = '{"metadata": {"total_size": X}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}'
    value = {"infinity": "Infinity", "5000_digits": "9" * 5000, "deep": "[" * 100_000 + "]" * 100_000}.get(case)
    if value is None:
        return
    (shards / "model.safetensors.index.json").write_text(index.replace("X", value))
    res = cli(["ckpt", "inspect", str(shards)])
    _one_line_exit_2(res, "not a valid shard index")


@pytest.mark.parametrize("attack", ["bomb", "deep", "huge_int"])
def test_absurd_dcp_metadata(attack: str, tmp_path: Path, cli: Any) -> None:
    """``.metadata`` is a pickle too (torch/distributed/checkpoint/filesystem.py): the same limits apply."""
    d = tmp_path / "dcp"
    d.mkdir()
    data = {"bomb": h.memo_bomb(), "deep": h.deep_tuple_key(100_000),
            "huge_int": h.pkl(pickle.EMPTY_DICT + h.s("version") + _HUGE + pickle.SETITEM)}[attack]
    (d / ".metadata").write_bytes(data)
    (d / "__0_0.distcp").write_bytes(b"\0" * 64)
    before = _state(d)
    expected = {"bomb": "expands to more than", "deep": "more than 200 levels deep", "huge_int": "50,001 bytes"}
    for args in (["ckpt", "inspect", str(d)], ["ckpt", "strip", str(d), "-o", str(tmp_path / "out")]):
        res = cli(args) if attack != "bomb" else run_cli(args, cwd=REPO, timeout=90)
        _one_line_exit_2(res, expected[attack])
        assert ".metadata" in res.stderr
    assert _state(d) == before and not (tmp_path / "out").exists()


@pytest.mark.skipif(not can_drop_root_read(), reason="as root, needs setpriv (util-linux) to drop the "
                    "capabilities that skip permission checks")
def test_checkpoint_in_an_unreadable_folder(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    torch.save({"module.w": torch.ones(2)}, folder / "c.pt")
    (folder / "index").mkdir()
    folder.chmod(0)
    try:
        for target in (folder, folder / "c.pt"):
            for args in (["ckpt", "inspect", str(target)], ["ckpt", "strip", str(target), "-o", str(tmp_path / "o")],
                         ["ckpt", "diff", str(target), "--model", MODEL]):
                res = subprocess.run(without_root_read([sys.executable, "-m", "ddpdoctor", *args]), capture_output=True,
                                     text=True, timeout=120, cwd=REPO)
                assert res.returncode == 2, (args, res.stdout[-1000:], res.stderr[-2000:])
                assert res.stderr.startswith("ddpdoctor: error: ") and len(res.stderr.strip().splitlines()) == 1, \
                    res.stderr
                assert "ermission denied" in res.stderr or "not readable" in res.stderr, res.stderr
        assert not (tmp_path / "o").exists()
    finally:
        folder.chmod(0o755)


def test_output_onto_a_device_node_is_refused(tmp_path: Path, cli: Any) -> None:
    """Like a FIFO (test_safety): the atomic rename would replace /dev/null for everyone, as root."""
    src = h.write_torch_zip(tmp_path / "c.pt", h.pkl(h.state_dict()))
    res = cli(["ckpt", "strip", str(src), "-o", "/dev/null"])
    _one_line_exit_2(res, "not a regular file")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_memo_bomb_in_a_real_process_ends(tmp_path: Path) -> None:
    """A regression here is a timeout of this test, never a hung suite."""
    src = h.write_torch_zip(tmp_path / "bomb.pt", h.memo_bomb())
    res = subprocess.run(["python", "-c", "from ddpdoctor.ckpt import unpickler, zip_rewrite; import sys, pathlib;"
                          "unpickler.loads(zip_rewrite.open_zip(pathlib.Path(sys.argv[1])).read('data.pkl'))",
                          str(src)], capture_output=True, text=True, timeout=90, cwd=REPO)
    assert res.returncode == 1 and "PickleLimitError: the pickle expands to more than" in res.stderr


def test_load_checkpoint_into_refuses_the_memo_bomb(tmp_path: Path) -> None:
    """The Python API went straight to torch.load, which has no limits: it hashed 2^39 leaves in C forever."""
    src = h.write_torch_zip(tmp_path / "bomb.pt", h.memo_bomb())
    code = ("import torch, ddpdoctor\n"
            "from ddpdoctor.errors import DoctorError\n"
            "try:\n"
            f"    ddpdoctor.load_checkpoint_into(torch.nn.Linear(2, 2), {str(src)!r})\n"
            "except DoctorError as exc:\n"
            "    print('refused:', exc)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "refused:" in res.stdout and "expands to more than 50,000,000 objects" in res.stdout, res.stdout


def test_a_global_name_with_control_characters_is_one_escaped_line(tmp_path: Path, cli: Any) -> None:
    """Found by the fuzz suite: a global named ``torch._\\x1dtils`` split the one-line error in two
    (``\\x1d`` is a line boundary to ``str.splitlines``), and an ``ESC[2J`` in a name cleared the terminal."""
    body = (h.glob("torch._\x1dutils", "_rebuild\x1b[2J") + pickle.EMPTY_TUPLE + pickle.REDUCE)
    src = h.write_torch_zip(tmp_path / "ctl.pt", h.pkl(pickle.EMPTY_DICT + h.s("w") + body + pickle.SETITEM))
    res = cli(["ckpt", "inspect", str(src)])
    _one_line_exit_2(res, r"torch._\x1dutils._rebuild\x1b[2J")
    assert "\x1b" not in res.stderr and "\x1d" not in res.stderr


def test_strip_to_dash_is_refused_not_a_file_named_dash(tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the fuzz suite: ``-o -`` wrote the checkpoint to a file named ``-`` in the current folder."""
    src = h.write_torch_zip(tmp_path / "c.pt", h.pkl(h.state_dict()))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    res = cli(["ckpt", "strip", str(src), "-o", "-"])
    _one_line_exit_2(res, "-o takes a file or directory name")
    assert list(work.iterdir()) == []


# Found by the long fuzz run (hypothesis, tests/fuzz/test_fuzz_ckpt.py): an OrderedDict whose keys are lists
# sharing each other 4 ways, 12 levels deep (4^11 leaves, within the reader's limits). str() of such a key
# wrote a 1.9 GB `ckpt inspect` report from a 1.6 KiB file; it ran past the fuzz suite's 20 s bound.
_LIST_KEY_FANOUT = (
    b"\x80\x02ccollections\nOrderedDict\n)Rq\x00(\x8c\x0f0._fpw_module.\x00\x89\x8c\x01.]q\x01(NG?\xe0\x00\x00"
    b"\x00\x00\x00\x00\x8c\x020.eq\x02\x8c\x08module.wq\x03](h\x03h\x03h\x03h\x03eq\x04](h\x04h\x04h\x04h\x04eq"
    b"\x05](h\x05h\x05h\x05h\x05eq\x06](h\x06h\x06h\x06h\x06eq\x07](h\x07h\x07h\x07h\x07eq\x08](h\x08h\x08h\x08h"
    b"\x08eq\t](h\th\th\th\teq\n](h\nh\nh\nh\neq\x0b](h\x0bh\x0bh\x0bh\x0beq\x0c](h\x0ch\x0ch\x0ch\x0ceq\r](h\rh"
    b"\rh\rh\req\x0e](h\x0eh\x0eh\x0eh\x0eeq\x0fq\x10(\x88q\x11G\x91Z?\xfa\xb6\x80H\nNq\x12\x8c\x07module.tu."
)


@pytest.mark.parametrize("args", [[], ["--json", "-"]])
def test_a_key_of_shared_lists_is_shown_in_a_few_items(tmp_path: Path, cli: Any, args: list[str]) -> None:
    src = h.write_torch_zip(tmp_path / "keys.pt", _LIST_KEY_FANOUT)
    res = cli(["ckpt", "inspect", str(src), "--trust", *args])
    assert res.returncode in (0, 1), res.stderr[-2000:]
    assert len(res.stdout) < 20_000, f"{len(res.stdout):,} characters of report from a {src.stat().st_size} B file"
    assert "[[[" in res.stdout and "..." in res.stdout  # the key is still shown, cut by reprlib


# data_offsets of the tensors "a" and "module.b" (2 float32 each) and the length of the data block.
ST_LAYOUTS = {
    "same_range": ([0, 8], [0, 8], 8, "'module.b' (data_offsets [0, 8]) overlaps the tensor before it"),
    "overlap": ([0, 8], [4, 12], 12, "'module.b' (data_offsets [4, 12]) overlaps the tensor before it"),
    "gap": ([0, 8], [12, 20], 20, "'module.b' (data_offsets [12, 20]) leaves a gap of 4 bytes before it"),
    "not_from_0": ([4, 12], [12, 20], 20, "'a' (data_offsets [4, 12]) leaves a gap of 4 bytes before it"),
    "bytes_after": ([0, 8], [8, 16], 20, "the tensors cover 16 of the 20 bytes after the header"),
    "header_order_is_free": ([8, 16], [0, 8], 16, ""),
}


@pytest.mark.parametrize("case", sorted(ST_LAYOUTS))
def test_safetensors_offsets_must_tile_the_data_as_the_reference_reader_requires(case: str, tmp_path: Path,
                                                                                cli: Any) -> None:
    """Two tensors on the same 8 bytes passed inspect and strip (exit 0) while safetensors' load_file raised
    "invalid offset" (an explorer's find). Sorted by offset, the ranges must run from 0 to the end of the
    data with no overlap and no gap (safetensors/src/tensor.rs, Metadata::validate and read_metadata); each
    case is checked against the library itself."""
    import json as json_

    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    first, second, size, expected = ST_LAYOUTS[case]
    real = tmp_path / "real.safetensors"
    save_file({"a": torch.ones(2), "module.b": torch.zeros(2)}, str(real))
    header = json_.loads(real.read_bytes()[8:8 + int.from_bytes(real.read_bytes()[:8], "little")])
    header["a"]["data_offsets"], header["module.b"]["data_offsets"] = first, second
    raw = json_.dumps(header).encode()
    src = tmp_path / "c.safetensors"
    src.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(range(size)))
    before = _state(tmp_path)
    out = tmp_path / "o.safetensors"
    if not expected:
        assert set(load_file(str(src))) == {"a", "module.b"}
        assert cli(["ckpt", "inspect", str(src)]).returncode == 0
        assert cli(["ckpt", "strip", str(src), "-o", str(out)]).returncode == 0
        assert set(load_file(str(out))) == {"a", "b"}
        return
    with pytest.raises(SafetensorError, match=r"invalid offset|not fully covered"):
        load_file(str(src))
    for args in (["ckpt", "inspect", str(src)], ["ckpt", "strip", str(src), "-o", str(out)]):
        res = cli(args)
        _one_line_exit_2(res, f"{src} has a corrupt safetensors header: ")
        assert expected in res.stderr, res.stderr
    assert _state(tmp_path) == before
