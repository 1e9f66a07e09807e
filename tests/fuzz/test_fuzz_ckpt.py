"""`ckpt inspect`, `ckpt strip -o` and `ckpt diff` on generated torch zip checkpoints, legacy pickles,
safetensors files and DCP folders: every promise on every input (tests/fuzz/harness.py)."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import pickles
from tests.fuzz.conftest import fuzz_settings
from tests.fuzz.harness import Outcome, check_command, run_cli, workdir

MODEL = str(Path(__file__).with_name("fuzz_model.py")) + ":build"


def _bad_crc(path: Path) -> str | None:
    """The first record whose bytes fail their CRC; None when all pass (or when it is no readable zip)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None


def output_is_a_checkpoint(out: Path, src: Path | None = None) -> None:
    """A written ``-o`` is complete: a zip's records all read back with their CRC, and ddpdoctor itself
    reads the result (exit 0 or 1, never 2 or 3).

    ``strip`` copies tensor bytes without reading them (docs/internals/ckpt-rewrite.md), CRC included: a
    record the input already damaged stays damaged, and its CRC still says so. Only a record that was
    intact in the input and fails in the output would be strip's doing.
    """
    if out.is_file() and out.read_bytes()[:2] == b"PK":
        bad = _bad_crc(out)
        if bad is not None and src is not None and src.is_file():
            bad_short = bad.split("/", 1)[-1]
            source_bad = _bad_crc(src)
            assert source_bad is not None and source_bad.split("/", 1)[-1] == bad_short, \
                f"{out}: record {bad} fails its CRC, but it was intact in the input"
        else:
            assert bad is None, f"{out}: a record fails its CRC"
    res = run_cli(["ckpt", "inspect", str(out)])
    assert res.code in (0, 1), f"the written output {out} does not read back: exit {res.code}\n{res.err[-2000:]}"


def all_ckpt_commands(path: Path, folder: Path, *, trust: bool = False) -> dict[str, Outcome]:
    """inspect (text and --json FILE), strip -o (JSON on stdout), diff against the seed's model; their outcomes."""
    extra = ["--trust"] if trust else []
    js = folder / "inspect.json"
    inspected = check_command(["ckpt", "inspect", str(path), "--json", str(js), *extra], inputs=[path], folder=folder,
                  json_out=js)
    out = folder / ("out" + (path.suffix if path.is_file() else ""))
    res = check_command(["ckpt", "strip", str(path), "-o", str(out), "--json", "-"], inputs=[path],
                        folder=folder, output=out, output_valid=lambda o: output_is_a_checkpoint(o, path))
    if res.code in (0, 1):
        from tests.fuzz.harness import strict_json

        strict_json(res.out)
    diffed = check_command(["ckpt", "diff", str(path), "--model", MODEL, *extra], inputs=[path], folder=folder)
    return {"inspect": inspected, "strip": res, "diff": diffed}


@given(data=st.data())
@fuzz_settings(weight=1.0)
def test_torch_zip_checkpoints(data: st.DataObject, seeds: Path, tmp_path: Path) -> None:
    """A real torch.save archive with its data.pkl replaced by an opcode-level generated pickle."""
    pkl, storages = data.draw(pickles.checkpoint_pickle(), label="data.pkl")
    raw = pickles.torch_zip(seeds / "model.pt", pkl, storages, data.draw)
    with workdir(tmp_path) as folder:
        path = folder / "ckpt.pt"
        path.write_bytes(raw)
        all_ckpt_commands(path, folder, trust=data.draw(st.booleans(), label="trust"))


@given(data=st.data())
@fuzz_settings(weight=0.6)
def test_legacy_pickles(data: st.DataObject, tmp_path: Path) -> None:
    """Pre-1.6 legacy checkpoints: the magic number, protocol, sys_info, then the generated pickle."""
    pkl, storages = data.draw(pickles.checkpoint_pickle(), label="main pickle")
    raw = pickles.legacy_file(pkl, storages, data.draw)
    with workdir(tmp_path) as folder:
        path = folder / "legacy.pt"
        path.write_bytes(raw)
        all_ckpt_commands(path, folder)


@given(data=st.data())
@fuzz_settings(weight=0.6)
def test_mutated_real_checkpoints(data: st.DataObject, seeds: Path, tmp_path: Path) -> None:
    """Byte-level damage to the real torch.save and legacy files: flips, cuts, splices."""
    name = data.draw(st.sampled_from(["model.pt", "legacy.pt", "model.safetensors"]), label="seed")
    raw = bytearray((seeds / name).read_bytes())
    for _ in range(data.draw(st.integers(1, 6), label="edits")):
        at = data.draw(st.integers(0, len(raw) - 1))
        how = data.draw(st.sampled_from(["flip", "cut", "splice", "zero"]))
        if how == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del raw[at:]
            if not raw:
                raw += b"P"
        elif how == "splice":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=32))
        else:
            raw[at:at + 8] = b"\x00" * 8
    with workdir(tmp_path) as folder:
        path = folder / name
        path.write_bytes(bytes(raw))
        all_ckpt_commands(path, folder)


# --- safetensors: 8-byte little-endian header length, a JSON header, the data (safetensors' format spec,
# https://github.com/huggingface/safetensors#format).

JSON_ATOMS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                       st.text(max_size=12))
NASTY_NUMBERS = ["Infinity", "-Infinity", "NaN", "1e400", "-1e400", "9" * 5000, "1" + "0" * 40,
                 "18446744073709551616", "-1", "1.5", "0.0"]


def nasty_json(draw: st.DrawFn) -> str:
    """Raw JSON text that json.dumps would never write: bare Infinity/NaN, 5,000-digit numbers, deep
    nesting, duplicate keys."""
    kind = draw(st.sampled_from(["number", "deep", "dup", "big"]))
    if kind == "number":
        return draw(st.sampled_from(NASTY_NUMBERS))
    if kind == "deep":
        n = draw(st.sampled_from([100, 201, 1000, 100_000]))
        return "[" * n + "]" * n if draw(st.booleans()) else '{"a":' * n + "1" + "}" * n
    if kind == "dup":
        return '{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}'
    return json.dumps(draw(st.lists(JSON_ATOMS, max_size=3)))


@st.composite
def safetensors_bytes(draw: st.DrawFn, seed: bytes) -> bytes:
    """The real file's header, re-encoded with values swapped for wrong ones; or raw nasty JSON; the
    length prefix right, too large, or far beyond the file."""
    (n,) = struct.unpack("<Q", seed[:8])
    header = json.loads(seed[8:8 + n])
    body = seed[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    for _ in range(draw(st.integers(0, 4))):
        name = draw(st.sampled_from(names))
        field_ = draw(st.sampled_from(["dtype", "shape", "data_offsets", "whole"]))
        header[name] = dict(header[name]) if isinstance(header[name], dict) else {}
        header[name][field_] = draw(st.one_of(JSON_ATOMS, st.lists(JSON_ATOMS, max_size=4),
                                              st.just("@NASTY@"), st.just([0, 2**64]), st.just([10, 2])))
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.one_of(st.just("@NASTY@"), st.dictionaries(st.text(max_size=5), JSON_ATOMS,
                                                                                    max_size=3)))
    text = json.dumps(header)
    while "@NASTY@" in text:
        text = text.replace('"@NASTY@"', nasty_json(draw), 1)
    if draw(st.integers(0, 5)) == 0:
        text = nasty_json(draw)
    raw = text.encode() + b" " * draw(st.integers(0, 7))
    length = draw(st.sampled_from(["right", "right", "huge", "past", "short"]))
    declared = {"right": len(raw), "huge": 2**63, "past": len(raw) + len(body) + 1,
                "short": max(0, len(raw) - 3)}[length]
    return struct.pack("<Q", declared) + raw + body


@given(data=st.data())
@fuzz_settings(weight=1.0)
def test_safetensors_headers(data: st.DataObject, seeds: Path, tmp_path: Path) -> None:
    raw = data.draw(safetensors_bytes((seeds / "model.safetensors").read_bytes()), label="file")
    with workdir(tmp_path) as folder:
        path = folder / "model.safetensors"
        path.write_bytes(raw)
        outcomes = all_ckpt_commands(path, folder)
    # A header inspect refuses is one strip must not rewrite: no file comes out of a header that is not read.
    assert outcomes["inspect"].code != 2 or outcomes["strip"].code == 2, outcomes["strip"].out[-500:]


# --- DCP: a real torch.distributed.checkpoint.save folder whose .metadata (a pickle of
# torch.distributed.checkpoint.metadata.Metadata) is damaged or replaced by a generated pickle.


@given(data=st.data())
@fuzz_settings(weight=0.5)
def test_dcp_metadata(data: st.DataObject, seeds: Path, tmp_path: Path) -> None:
    real = (seeds / "dcp" / ".metadata").read_bytes()
    how = data.draw(st.sampled_from(["generated", "mutated", "mutated", "payload"]), label="how")
    if how == "generated":
        meta, _ = data.draw(pickles.checkpoint_pickle(), label=".metadata")
    elif how == "payload":
        asm = pickles.Asm()
        pickles.payload(data.draw, asm)
        meta = asm.stop()
    else:
        meta = pickles.mutate(data.draw, real)
        if meta == real:
            at = data.draw(st.integers(2, len(real) - 2))
            meta = real[:at] + bytes([real[at] ^ 0x55]) + real[at + 1:]
    with workdir(tmp_path) as folder:
        path = folder / "dcp"
        shutil.copytree(seeds / "dcp", path)
        (path / ".metadata").write_bytes(meta)
        all_ckpt_commands(path, folder)
