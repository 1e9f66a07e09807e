"""Each concrete break listed in issue 20, as a plain regression test run through the fuzz harness (every
promise checked: exit 0/1/2, one line on 2, no traceback, bounded time, input unchanged, no partial
output, no payload effect).

A hang here is caught by harness.time_bound: the soft bound fails the test where Python code is stuck; C
code that never yields (hashing a 2^39-leaf tuple) trips the hard watchdog, which prints every stack and
ends the run — loudly, on purpose.
"""

from __future__ import annotations

import json
import os
import pickle as P
import struct
from pathlib import Path

import pytest

from tests.fuzz import pickles
from tests.fuzz.harness import Outcome, check_command, run_cli, workdir
from tests.fuzz.test_fuzz_ckpt import MODEL, all_ckpt_commands
from tests.fuzz.test_fuzz_cli import _never_launch  # noqa: F401 - the guard fixture, used by name below


def _zip(seeds: Path, asm: pickles.Asm) -> bytes:
    """``asm`` as data.pkl of the real torch.save archive (its tensor records dropped)."""
    import zipfile
    from io import BytesIO

    out = BytesIO()
    with zipfile.ZipFile(seeds / "model.pt") as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            rest = info.filename.split("/", 1)[1]
            if rest.startswith("data/"):
                continue
            dst.writestr(info.filename, asm.stop() if rest == "data.pkl" else src.read(info))
    return out.getvalue()


def _dict_of(asm: pickles.Asm, items: list[tuple[str, bytes]]) -> None:
    asm.op(P.EMPTY_DICT + P.MARK)
    for key, raw in items:
        asm.text(key)
        asm.op(raw)
    asm.op(P.SETITEMS)


def _ckpt_case(seeds: Path, tmp_path: Path, asm: pickles.Asm, name: str = "ckpt.pt") -> dict[str, Outcome]:
    with workdir(tmp_path) as folder:
        path = folder / name
        path.write_bytes(_zip(seeds, asm))
        return all_ckpt_commands(path, folder)


def test_memo_bomb_tuple_key_2_pow_39(seeds: Path, tmp_path: Path) -> None:
    """463 bytes, 2^39 leaves: the top-level key is a tuple of two references to the tuple before it."""
    asm = pickles.Asm()
    asm.op(P.EMPTY_DICT)
    asm.put()
    asm.text("w")
    asm.put()
    for level in range(39):
        asm.op(P.BINGET + bytes([level + 1]) + P.DUP + P.TUPLE2)
        asm.put()
    asm.op(P.NONE + P.SETITEM)
    outs = _ckpt_case(seeds, tmp_path, asm)
    # Every command refuses it at once, in one line saying why (the harness checked the rest).
    assert all(o.code == 2 and 'expands to more than 50,000,000 objects' in o.err for o in outs.values()), outs


def test_dicts_sharing_one_dict_n_pow_4(seeds: Path, tmp_path: Path) -> None:
    """A small pickle of dicts whose values are all the same dict, four levels: ~N^4 steps to search."""
    n = 60
    asm = pickles.Asm()
    asm.op(P.EMPTY_DICT + P.MARK)
    for i in range(n):
        asm.text(f"module.layer{i}.weight")
        asm.op(P.NONE)
    asm.op(P.SETITEMS)
    asm.put()
    for _level in range(4):
        prev = asm.memo - 1
        asm.op(P.EMPTY_DICT + P.MARK)
        for i in range(n):
            asm.text(f"module.m{i}")
            asm.get(prev)
        asm.op(P.SETITEMS)
        asm.put()
    outs = _ckpt_case(seeds, tmp_path, asm)
    # Every command refuses it at once, in one line saying why (the harness checked the rest).
    assert all(o.code == 2 and 'expands to more than 50,000,000 objects' in o.err for o in outs.values()), outs


@pytest.mark.parametrize("where", ["epoch", "lr", "shape", "storage_size"])
def test_huge_integers_in_a_checkpoint(where: str, seeds: Path, tmp_path: Path) -> None:
    """Huge integers as epoch, lr, a tensor's shape, a storage's size (exit 3 in issue 20)."""
    huge = 1 << 4096
    asm = pickles.Asm()
    asm.op(P.EMPTY_DICT + P.MARK)
    asm.text("model")
    asm.op(P.EMPTY_DICT + P.MARK)
    asm.text("module.w")
    asm.glob(b"torch._utils", b"_rebuild_tensor_v2")
    asm.op(P.MARK + P.MARK)
    asm.text("storage")
    asm.glob(b"torch", b"FloatStorage")
    asm.text("0")
    asm.text("cpu")
    asm.int_(huge if where == "storage_size" else 4)
    asm.op(P.TUPLE + P.BINPERSID)
    asm.int_(0)
    asm.op(P.MARK)
    asm.int_(huge if where == "shape" else 4)
    asm.op(P.TUPLE + P.MARK)
    asm.int_(1)
    asm.op(P.TUPLE + P.NEWFALSE)
    asm.glob(b"collections", b"OrderedDict")
    asm.op(P.EMPTY_TUPLE + P.REDUCE + P.TUPLE + P.REDUCE + P.SETITEMS)
    for name in ("epoch", "lr"):
        asm.text(name)
        asm.int_(huge if where == name else 1)
    asm.op(P.SETITEMS)
    outs = _ckpt_case(seeds, tmp_path, asm)
    # Every command refuses it at once, in one line saying why (the harness checked the rest).
    assert all(o.code == 2 and 'holds an integer of' in o.err for o in outs.values()), outs


def test_integers_over_2_pow_2040_through_strip(seeds: Path, tmp_path: Path) -> None:
    """The pickle writer on integers >= 2^2040 (LONG4 territory), in a state_dict strip must rewrite."""
    asm = pickles.Asm()
    _dict_of(asm, [])
    asm.buf = asm.buf[:-1]  # reopen: SETITEMS comes after the items
    asm.op(P.MARK)
    asm.text("module.step")
    asm.int_(1 << 2040)
    asm.text("module.big")
    asm.int_(-(1 << 9000))
    asm.op(P.SETITEMS)
    outs = _ckpt_case(seeds, tmp_path, asm)
    # Every command refuses it at once, in one line saying why (the harness checked the rest).
    assert all(o.code == 2 and 'holds an integer of' in o.err for o in outs.values()), outs


@pytest.mark.parametrize("depth", [2000, 20_000])
def test_deeply_nested_tuple_key(depth: int, seeds: Path, tmp_path: Path) -> None:
    asm = pickles.Asm()
    asm.op(P.EMPTY_DICT + P.MARK)
    asm.op(P.MARK * depth + P.NONE + P.TUPLE * depth)
    asm.op(P.NONE + P.SETITEMS)
    outs = _ckpt_case(seeds, tmp_path, asm)
    # Every command refuses it at once, in one line saying why (the harness checked the rest).
    assert all(o.code == 2 and 'more than 200 levels deep' in o.err for o in outs.values()), outs


def test_strip_of_a_2000_deep_list(seeds: Path, tmp_path: Path) -> None:
    """RecursionError inside torch.save in issue 20: strip must say no, in one line, or write it."""
    asm = pickles.Asm()
    asm.op(P.EMPTY_DICT + P.MARK)
    asm.text("module.deep")
    asm.op((P.EMPTY_LIST + P.MARK) * 2000 + P.NONE + P.APPENDS * 2000)
    asm.op(P.SETITEMS)
    outs = _ckpt_case(seeds, tmp_path, asm)
    # Every command refuses it at once, in one line saying why (the harness checked the rest).
    assert all(o.code == 2 and 'more than 200 levels deep' in o.err for o in outs.values()), outs


def test_list_key_in_param_groups(seeds: Path, tmp_path: Path) -> None:
    asm = pickles.Asm()
    asm.op(P.EMPTY_DICT + P.MARK)
    asm.text("model")
    _dict_of(asm, [("module.w", P.NONE)])
    asm.text("optimizer")
    asm.op(P.EMPTY_DICT + P.MARK)
    asm.text("param_groups")
    asm.op(P.EMPTY_LIST + P.MARK + P.EMPTY_DICT + P.MARK + P.EMPTY_LIST + P.NONE + P.SETITEMS + P.APPENDS)
    asm.op(P.SETITEMS + P.SETITEMS)
    outs = _ckpt_case(seeds, tmp_path, asm)
    # Every command refuses it at once, in one line saying why (the harness checked the rest).
    assert all(o.code == 2 and 'a list used as a dict key' in o.err for o in outs.values()), outs


@pytest.mark.parametrize("raw", ["Infinity", "9" * 5000, "[" * 100_000 + "]" * 100_000, "1e400", "NaN"])
def test_safetensors_header_values(raw: str, seeds: Path, tmp_path: Path) -> None:
    seed = (seeds / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", seed[:8])
    header = json.loads(seed[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = "@RAW@"
    text = json.dumps(header).replace('"@RAW@"', raw).encode()
    with workdir(tmp_path) as folder:
        path = folder / "model.safetensors"
        path.write_bytes(struct.pack("<Q", len(text)) + text + seed[8 + n:])
        outs = all_ckpt_commands(path, folder)
    assert all(o.code == 2 and "model.safetensors" in o.err for o in outs.values()), outs


def test_explain_rank_and_5000_digits(tmp_path: Path) -> None:
    with workdir(tmp_path) as folder:
        log = folder / "train.log"
        log.write_bytes(b"[rank" + b"7" * 5000 + b"]: RuntimeError: NCCL error in: x, unhandled system error\n")
        check_command(["explain", str(log)], inputs=[log], folder=folder)


@pytest.mark.parametrize("size", [512 * 1024, 1024 * 1024])
def test_explain_one_long_line_of_nccl_error(size: int, tmp_path: Path) -> None:
    """Quadratic regex time in issue 20 (512 KB: 22 s; 1 MB did not end in 100 s)."""
    piece = b"NCCL error "
    with workdir(tmp_path) as folder:
        log = folder / "train.log"
        log.write_bytes(piece * (size // len(piece)) + b"\n")
        check_command(["explain", str(log)], inputs=[log], folder=folder)


@pytest.mark.parametrize("raw", ["10000000", "1e7", "Infinity", "1e400", "9" * 5000, "-1"])
def test_stacks_merge_absurd_world_size(raw: str, stacks_seed: Path, tmp_path: Path) -> None:
    doc = json.loads(stacks_seed.read_text(encoding="utf-8"))
    for proc in doc["processes"]:
        proc["world_size"] = "@RAW@"
    with workdir(tmp_path) as folder:
        path = folder / "node.json"
        path.write_text(json.dumps(doc).replace('"@RAW@"', raw), encoding="utf-8")
        check_command(["stacks", "merge", str(path)], inputs=[path], folder=folder)


def test_stacks_merge_on_a_fifo(tmp_path: Path) -> None:
    """A FIFO nobody writes to: reading it would wait forever."""
    with workdir(tmp_path) as folder:
        fifo = folder / "node.json"
        os.mkfifo(fifo)
        check_command(["stacks", "merge", str(fifo)], inputs=[fifo], folder=folder)


@pytest.mark.usefixtures("_never_launch")
@pytest.mark.parametrize("argv", [
    ["check", "--nproc", "99999999999999999999999"],
    ["check", "--nproc", "100000"],
    ["bench", "-b", "9" * 400],
    ["bench", "-b", "1", "-e", "1"],
    ["bench", "-b", "1T", "-e", "1T"],
    ["watch", "--nproc", "100000", "train.py"],
])
def test_absurd_launch_values_are_refused_before_anything_starts(argv: list[str], tmp_path: Path) -> None:
    """Exit 2 with one line, before a rank starts (the guard fails the test if one would)."""
    with workdir(tmp_path) as folder:
        script = folder / "train.py"
        script.write_text("print('hi')\n")
        argv = [str(script) if a == "train.py" else a for a in argv]
        res = check_command(argv, inputs=[script], folder=folder)
        assert res.code == 2, f"{argv}: exit {res.code}, expected 2 (refused)\n{res.err}"


@pytest.mark.parametrize("command", [["explain"], ["stacks", "merge"], ["fr"]])
def test_json_onto_a_fifo_is_refused_and_the_fifo_stays(command: list[str], stacks_seed: Path,
                                                        tmp_path: Path) -> None:
    with workdir(tmp_path) as folder:
        fifo = folder / "out.json"
        os.mkfifo(fifo)
        inp = folder / "in.json"
        inp.write_bytes(stacks_seed.read_bytes() if command != ["explain"] else b"hello\n")
        res = check_command([*command, str(inp), "--json", str(fifo)], inputs=[inp, fifo], folder=folder)
        assert res.code == 2 and fifo.is_fifo(), (res.code, res.err)


def test_check_checkpoint_memo_bomb_is_bounded(seeds: Path, tmp_path: Path) -> None:
    """`check --checkpoint BOMB --timeout 5`: the deadline must hold even though hashing happens in C.

    Runs the real command (it starts ranks: the guard is not used here); the harness bounds it."""
    asm = pickles.Asm()
    asm.op(P.EMPTY_DICT)
    asm.put()
    asm.text("w")
    asm.put()
    for level in range(39):
        asm.op(P.BINGET + bytes([level + 1]) + P.DUP + P.TUPLE2)
        asm.put()
    asm.op(P.NONE + P.SETITEM)
    with workdir(tmp_path) as folder:
        path = folder / "bomb.pt"
        path.write_bytes(_zip(seeds, asm))
        import subprocess
        import sys

        from tests.support import clean_env, kill_session

        proc = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "check", "--nproc", "1", "--checkpoint",
                                 str(path), "--model", MODEL, "--only", "state_dict", "--timeout", "5"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                                start_new_session=True)
        try:
            _out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("check --checkpoint <memo bomb> --timeout 5 still running after 90 s")
        finally:
            kill_session(proc)  # the whole session: no rank left behind either way
        assert proc.returncode in (0, 1, 2) and "Traceback" not in err, (proc.returncode, err[-2000:])


def test_run_cli_counts(tmp_path: Path) -> None:
    """The harness itself: a run is counted, and a one-line exit 2 passes the promise checks."""
    res = run_cli(["explain", str(tmp_path / "missing.log")])
    assert res.code == 2 and res.err.startswith("ddpdoctor: error:")


def test_key_with_a_lone_surrogate(seeds: Path, tmp_path: Path) -> None:
    """Found by the fuzz suite: pickle's BINUNICODE decodes with surrogatepass, so a key may hold a lone
    surrogate; printing it to a pipe (strict UTF-8) must not be exit 3."""
    asm = pickles.Asm()
    asm.op(P.EMPTY_DICT + P.MARK)
    asm.text("module.\udc80w")
    asm.op(P.NONE + P.SETITEMS)
    outs = _ckpt_case(seeds, tmp_path, asm)
    # inspect lists the key, escaped, instead of crashing on it.
    assert outs["inspect"].code == 0 and "\\udc80" in outs["inspect"].out, outs["inspect"].out[-500:]
