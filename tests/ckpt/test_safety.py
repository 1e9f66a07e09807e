"""`ddpdoctor ckpt` never runs code from a checkpoint, and every bad input is one line, exit 2, no output."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ddpdoctor.outputs import PARTIAL_SUFFIX
from examples.ckpt_models import make_mlp
from tests.support import REPO, clean_env, run_cli


class _Evil:
    """Unpickling this runs ``touch MARKER`` (os.system): the classic malicious checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _triple(res: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    return res.returncode, res.stdout, res.stderr


def _evil_checkpoints(tmp: Path) -> tuple[Path, list[Path]]:
    marker = tmp / "PWNED"
    sd = {f"module.{k}": v for k, v in make_mlp().state_dict().items()}
    zip_ckpt, legacy, raw = tmp / "evil.pt", tmp / "evil_legacy.pt", tmp / "evil.pkl"
    torch.save({"net": sd, "payload": _Evil(marker)}, zip_ckpt)
    torch.save({"net": sd, "payload": _Evil(marker)}, legacy, _use_new_zipfile_serialization=False)
    with raw.open("wb") as fh:
        pickle.dump({"payload": _Evil(marker)}, fh, protocol=2)
    assert not marker.exists()
    return marker, [zip_ckpt, legacy, raw]


def test_malicious_checkpoint_is_refused_and_never_runs(tmp_path: Path, cli: Any) -> None:
    marker, paths = _evil_checkpoints(tmp_path)
    for path in paths:
        for args in (["ckpt", "inspect", str(path)],
                     ["ckpt", "strip", str(path), "-o", str(tmp_path / "out.pt")],
                     ["ckpt", "diff", str(path), "--model", "examples.ckpt_models:make_mlp"]):
            code, _out, err = _triple(cli(args))
            assert code == 2, (args, err)
            assert "system" in err and "--trust" in err, err
            assert len(err.strip().splitlines()) == 1
            assert not marker.exists(), f"{args} ran the payload"
    assert not (tmp_path / "out.pt").exists()
    import ddpdoctor
    from ddpdoctor.errors import DoctorError

    with pytest.raises(DoctorError, match="system"):
        ddpdoctor.load_checkpoint_into(make_mlp(), paths[0])
    assert not marker.exists()


def test_trust_still_never_runs_code_for_inspect_strip_and_diff(tmp_path: Path, cli: Any) -> None:
    """--trust lifts the refusal; inspect/strip/diff replay the pickle without importing or calling anything."""
    marker, paths = _evil_checkpoints(tmp_path)
    code, out, _ = _triple(cli(["ckpt", "inspect", str(paths[0]), "--trust"]))
    assert code == 0
    assert "needs non-weights-only globals: posix.system" in out
    out_path = tmp_path / "stripped.pt"
    code, _, err = _triple(cli(["ckpt", "strip", str(paths[0]), "-o", str(out_path), "--trust"]))
    assert code == 0, err
    assert not marker.exists()
    # The payload is carried over untouched (strip keeps every other entry), so it is still refused.
    with pytest.raises(pickle.UnpicklingError, match=r"posix\.system"):
        torch.load(out_path, weights_only=True)
    assert not marker.exists()
    # Legacy (pre-1.6) files too: inspect and diff replay their pickle instead of torch.load-ing it.
    code, out, err = _triple(cli(["ckpt", "inspect", str(paths[1]), "--trust"]))
    assert code == 0 and "needs non-weights-only globals: posix.system" in out, err
    assert "net: 9 keys" in out
    code, out, err = _triple(cli(["ckpt", "diff", str(paths[1]), "--trust", "--model", "examples.ckpt_models:make_mlp"]))
    assert code == 1 and "after: remove 'module.'" in out, err
    code, _, err = _triple(cli(["ckpt", "inspect", str(paths[2]), "--trust"]))
    assert code == 2 and "not a torch checkpoint" in err
    assert not marker.exists()


def test_untrusted_class_named_in_message_real_process(tmp_path: Path) -> None:
    path = tmp_path / "with_args.pt"
    torch.save({"model": make_mlp().state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    res = run_cli(["ckpt", "inspect", str(path)], cwd=REPO)
    assert res.returncode == 2
    assert res.stderr.startswith("ddpdoctor: error: ") and "argparse.Namespace" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def _zip_of(files: dict[str, bytes]) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in files.items():
                zf.writestr(name, data)
    return make


def _truncated(path: Path) -> None:
    torch.save({"module.w": torch.ones(1000)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _safetensors_bad_json(path: Path) -> None:
    header = b'{"module.w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'  # no closing brace
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)


def _safetensors_huge_length(path: Path) -> None:
    path.write_bytes((10**12).to_bytes(8, "little") + b'{"a": 1}')


def _safetensors_out_of_range(path: Path) -> None:
    header = b'{"module.w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)  # 8 of 16 bytes


def _dcp_dir(path: Path) -> None:
    path.mkdir()
    (path / ".metadata").write_bytes(b"x")


BAD_INPUTS: dict[str, tuple[Callable[[Path], object] | None, str]] = {
    "missing": (None, "not found"),
    "directory": (lambda p: p.mkdir(), "is a directory"),
    "dcp_directory": (_dcp_dir, "torch.distributed.checkpoint"),
    "empty": (lambda p: p.write_bytes(b""), "is empty"),
    "truncated_zip": (_truncated, "damaged zip"),
    # Random bytes, the first fixed so that they cannot start a legacy pickle (\x80 then a protocol byte).
    "random_bytes": (lambda p: p.write_bytes(b"\x01" + os.urandom(4095).replace(b"PK", b"pk")), "not a checkpoint"),
    # ... with a '{' ninth (one file in 256 of the case above): an absurd header length, not a safetensors file.
    "random_bytes_brace": (lambda p: p.write_bytes(b"\x01" + os.urandom(7) + b"{" + os.urandom(4087).replace(b"PK", b"pk")),
                           "not a checkpoint"),
    "not_a_checkpoint_zip": (_zip_of({"docs/readme.txt": b"hello"}), "not a PyTorch checkpoint"),
    "corrupt_pickle": (_zip_of({"a/data.pkl": b"\x80\x02}q\x00(X\x01", "a/version": b"3"}), "data.pkl is damaged"),
    # BYTEARRAY8 announcing 1 TiB: pickle's own handler allocates it before reading.
    "bytearray8_bomb": (_zip_of({"a/data.pkl": b"\x80\x02\x96" + (1 << 40).to_bytes(8, "little") + b"abc.",
                                 "a/version": b"3"}), "runs past the end of the pickle"),
    "safetensors_bad_json": (_safetensors_bad_json, "corrupt safetensors header"),
    "safetensors_huge_length": (_safetensors_huge_length, "corrupt safetensors header"),
    "safetensors_out_of_range": (_safetensors_out_of_range, "corrupt safetensors header"),
}


def _snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in directory.iterdir()}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(case: str, tmp_path: Path, cli: Any) -> None:
    make, expected = BAD_INPUTS[case]
    src_dir, out_dir = tmp_path / "in", tmp_path / "out"
    src_dir.mkdir()
    out_dir.mkdir()
    src = src_dir / ("ckpt.safetensors" if case.startswith("safetensors") else "ckpt.pt")
    if make is not None:
        make(src)
    before = _snapshot(src_dir)
    for args in (["ckpt", "inspect", str(src)], ["ckpt", "inspect", str(src), "--json", "-"],
                 ["ckpt", "inspect", str(src), "--json", str(out_dir / "r.json")],
                 ["ckpt", "strip", str(src), "-o", str(out_dir / "o.pt")],
                 ["ckpt", "diff", str(src), "--model", "examples.ckpt_models:make_mlp"]):
        code, out, err = _triple(cli(args))
        assert code == 2, (args, out, err)
        assert err.startswith("ddpdoctor: error: ") and expected in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert out == ""
    assert _snapshot(src_dir) == before
    # No checkpoint, no temp file; the requested --json holds the error (never a stale result).
    assert [p.name for p in out_dir.iterdir()] == ["r.json"]
    doc = json.loads((out_dir / "r.json").read_text())
    assert (doc["tool"], doc["command"], doc["status"], doc["exit_code"]) == ("ddpdoctor", "ckpt inspect", "error", 2)
    assert expected in doc["error"]


def _unwritable_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    # root ignores directory permissions; sysfs refuses new files even to root.
    probe = Path("/sys")
    try:
        (probe / "ddpdoctor-probe").write_bytes(b"")
    except OSError:
        return probe
    pytest.skip("no directory here refuses writes to root")


def test_unwritable_or_missing_output_dir(tmp_path: Path, cli: Any) -> None:
    src = tmp_path / "ddp.pt"
    torch.save({f"module.{k}": v for k, v in make_mlp().state_dict().items()}, src)
    before = _snapshot(tmp_path)
    ro = _unwritable_dir(tmp_path)
    # As root, the unwritable folder is /sys: refused as the kernel's filesystem (root passes access(2) there).
    unwritable = "where no file can be created" if str(ro).startswith("/sys") else "cannot write to"
    for out, expected in ((ro / "o.pt", unwritable),
                          (tmp_path / "nope" / "o.pt", "does not exist")):
        code, _, err = _triple(cli(["ckpt", "strip", str(src), "-o", str(out)]))
        assert code == 2 and expected in err, err
        assert len(err.strip().splitlines()) == 1
        assert not out.exists()
    if ro.parent == tmp_path:
        ro.chmod(0o755)
        assert list(ro.iterdir()) == []
    assert {k: v for k, v in _snapshot(tmp_path).items() if k != "ro"} == before


def test_bad_input_real_process_has_no_traceback(tmp_path: Path) -> None:
    src = tmp_path / "junk.pt"
    src.write_bytes(b"\x00garbage" * 100)
    res = run_cli(["ckpt", "strip", str(src), "-o", str(tmp_path / "o.pt")], cwd=REPO)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("ddpdoctor: error: ") and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.pt"]


def test_output_is_a_directory_or_not_a_regular_file_is_refused(tmp_path: Path, cli: Any) -> None:
    src = tmp_path / "ddp.pt"
    torch.save({"module.w": torch.ones(2)}, src)
    code, _, err = _triple(cli(["ckpt", "strip", str(src), "-o", str(tmp_path)]))
    assert code == 2 and "is a directory" in err
    # Like -o /dev/null: the output is renamed over OUT, which would replace the node (as root, /dev/null).
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, _, err = _triple(cli(["ckpt", "strip", str(src), "-o", str(fifo)]))
    assert code == 2 and "not a regular file" in err
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["ddp.pt", "fifo"]


@pytest.mark.parametrize(("name", "count"), [("zip", 250), ("legacy", 60), ("safetensors", 150)])
def test_random_corruption_never_crashes(tmp_path: Path, cli: Any, name: str, count: int) -> None:
    """Flipped bytes, truncations and deletions anywhere: exit 0/1/2, never 3 (a ddpdoctor bug)."""
    import random

    sd = {f"module.{k}": v for k, v in make_mlp().state_dict().items()}
    good = tmp_path / "good"
    if name == "safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(good))
    else:
        torch.save({"net": sd, "epoch": 1}, good, _use_new_zipfile_serialization=name == "zip")
    src = good.read_bytes()
    rng = random.Random(name)
    bad = tmp_path / "bad.pt"
    for _ in range(count):
        data = bytearray(src)
        mode = rng.random()
        if mode < 0.6:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif mode < 0.8:
            del data[rng.randrange(len(data)):]
        else:
            start = rng.randrange(len(data))
            del data[start:start + rng.randint(1, 64)]
        bad.write_bytes(bytes(data))
        for args in (["ckpt", "inspect", str(bad)], ["ckpt", "inspect", str(bad), "--trust"],
                     ["ckpt", "strip", str(bad), "-o", str(tmp_path / "o.pt")]):
            code, _, err = _triple(cli(args))
            assert code in (0, 1, 2), err
            if code == 2:
                assert len(err.strip().splitlines()) == 1, err
                assert not (tmp_path / "o.pt").exists()
        (tmp_path / "o.pt").unlink(missing_ok=True)


def _with_pickle(src: Path, dst: Path, new_pickle: bytes) -> None:
    from ddpdoctor.ckpt import zip_rewrite

    with dst.open("wb") as fh:
        zip_rewrite.rewrite(zip_rewrite.open_zip(src), fh, new_pickle)


def test_unhashable_keys_in_shadow_mappings_are_not_internal_errors(tmp_path: Path, cli: Any) -> None:
    """An OrderedDict is replayed as a list of pairs, so a crafted file can give it a list as a key.

    Real pickle (and torch.load) would fail on such a file; ddpdoctor must not crash on it (exit 3).
    """
    from ddpdoctor.ckpt import unpickler

    base = tmp_path / "base.pt"
    torch.save({"module.w": torch.ones(2)}, base)
    top = tmp_path / "top.pt"
    # OrderedDict() with items [1] -> 2 and 'v' -> 3.
    _with_pickle(base, top, b"\x80\x02ccollections\nOrderedDict\nq\x00)R(]K\x01aK\x02X\x01\x00\x00\x00vK\x03u.")
    meta = tmp_path / "meta.pt"
    torch.save(make_mlp().state_dict(), meta)
    from ddpdoctor.ckpt import zip_rewrite

    root, _ = unpickler.loads(zip_rewrite.open_zip(meta).read("data.pkl"))
    [state] = root.states
    state["_metadata"].dictitems.append(([1], 2))
    bad_meta = tmp_path / "bad_meta.pt"
    _with_pickle(meta, bad_meta, unpickler.dumps(root))
    for path in (top, bad_meta):
        for args in (["ckpt", "inspect", str(path)], ["ckpt", "strip", str(path), "-o", str(tmp_path / "o.pt")],
                     ["ckpt", "diff", str(path), "--model", "examples.ckpt_models:make_mlp"]):
            code, out, err = _triple(cli(args))
            assert code in (0, 1, 2), (args, err)
    code, out, _ = _triple(cli(["ckpt", "inspect", str(top)]))
    assert code == 0 and "no state_dict found" in out


_KILL_MID_WRITE = """
import os, signal, sys
from ddpdoctor.cli import main

real_copy = os.copy_file_range

def copy_then_die(src, dst, count, offset_src=None, offset_dst=None):
    real_copy(src, dst, min(count, 1 << 20), offset_src, offset_dst)  # some tensor data is written...
    os.kill(os.getpid(), signal.SIGKILL)  # ...the rest never will be

os.copy_file_range = copy_then_die
sys.exit(main(["ckpt", "strip", sys.argv[1], "-o", sys.argv[2]]))
"""


def test_sigkill_mid_write_leaves_input_intact_and_no_output(tmp_path: Path) -> None:
    """A strip killed by SIGKILL half way: input unchanged, nothing under OUT's name, the leftover named."""
    src = tmp_path / "ddp.pt"
    torch.save({"model": {f"module.layer{i}.weight": torch.rand(1 << 18) for i in range(8)}}, src)
    before = _snapshot(tmp_path)
    out = tmp_path / "o.pt"
    res = subprocess.run([sys.executable, "-c", _KILL_MID_WRITE, str(src), str(out)], cwd=REPO, env=clean_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert not out.exists()
    leftovers = sorted(set(_snapshot(tmp_path)) - set(before))
    assert len(leftovers) == 1 and leftovers[0].startswith(".o.pt.") and leftovers[0].endswith(PARTIAL_SUFFIX)
    assert 0 < (tmp_path / leftovers[0]).stat().st_size < src.stat().st_size
    assert {k: v for k, v in _snapshot(tmp_path).items() if k in before} == before
    # The next run is not disturbed by the leftover.
    assert run_cli(["ckpt", "strip", str(src), "-o", str(out)], cwd=REPO).returncode == 0
    assert len(torch.load(out, weights_only=True, mmap=True)["model"]) == 8


def test_deeply_nested_tensor_rebuilders_are_refused_in_one_line(tmp_path: Path, cli: Any) -> None:
    """{'a': Parameter(Parameter(... 20000 deep ...))}: past the reader's depth limit, refused by every command."""
    base = tmp_path / "base.pt"
    torch.save({"module.w": torch.ones(2)}, base)
    depth = 20000
    pkl = (b"\x80\x02}q\x00X\x01\x00\x00\x00actorch._utils\n_rebuild_parameter\nq\x01" + b"h\x01" * (depth - 1)
           + b"K\x01" + b"\x85R" * depth + b"s.")
    deep = tmp_path / "deep.pt"
    _with_pickle(base, deep, pkl)
    for args in (["ckpt", "inspect", str(deep)], ["ckpt", "strip", str(deep), "-o", str(tmp_path / "o.pt")],
                 ["ckpt", "diff", str(deep), "--model", "examples.ckpt_models:make_mlp"]):
        code, _, err = _triple(cli(args))
        assert code == 2 and "nests objects more than 200 levels deep" in err, err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.pt").exists()


def test_input_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Opening a FIFO blocks until a writer comes: a real process, so a regression is a timeout, not a hang."""
    fifo = tmp_path / "ckpt.pt"
    os.mkfifo(fifo)
    res = run_cli(["ckpt", "inspect", str(fifo)], cwd=REPO, timeout=60)
    assert res.returncode == 2 and "not a regular file" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
