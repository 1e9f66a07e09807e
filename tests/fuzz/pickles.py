"""Pickles written opcode by opcode, and the torch checkpoint layouts they travel in.

The opcodes and their argument encodings are CPython's (Lib/pickle.py, Lib/pickletools.py); what a torch
checkpoint's pickle holds is torch's (torch/serialization.py: a tensor is
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks)`` whose
storage is the persistent id ``('storage', <torch.FloatStorage>, key, location, numel)``, and the bytes are
the zip record ``<archive>/data/<key>``; the legacy (pre-1.6) layout is magic number, protocol version,
sys_info, the object, the storage keys, then each storage as an 8-byte little-endian element count and
its bytes). Writing opcodes by hand reaches what ``pickle.dumps`` never writes: memo references to shared
(and unfinished) objects, deep nesting, huge LONG4 integers, globals that run code, truncated streams.
"""

from __future__ import annotations

import io
import pickle as P
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from tests.fuzz.harness import PAYLOAD_CMD, PAYLOAD_PY

# What a hostile pickle calls (each would create the marker file if anything ran it), what torch allows,
# and names that are odd as names.
PAYLOADS = [
    (b"os", b"system", PAYLOAD_CMD), (b"posix", b"system", PAYLOAD_CMD), (b"builtins", b"exec", PAYLOAD_PY),
    (b"builtins", b"eval", PAYLOAD_PY), (b"__builtin__", b"eval", PAYLOAD_PY),
    (b"subprocess", b"getoutput", PAYLOAD_CMD), (b"nt", b"system", PAYLOAD_CMD),
    (b"torch.serialization", b"os.system", PAYLOAD_CMD), (b"torch", b"_C._dynamo.eval", PAYLOAD_PY),
]
SAFE_GLOBALS = [
    (b"torch._utils", b"_rebuild_tensor_v2"), (b"collections", b"OrderedDict"), (b"torch", b"FloatStorage"),
    (b"torch", b"HalfStorage"), (b"torch", b"LongStorage"), (b"torch", b"Size"), (b"torch", b"float32"),
    (b"torch._utils", b"_rebuild_parameter"), (b"torch", b"device"), (b"__builtin__", b"set"),
    (b"builtins", b"slice"), (b"_codecs", b"encode"), (b"torch._tensor", b"_rebuild_from_type_v2"),
    (b"torch", b"Tensor"), (b"torch.nn.parameter", b"Parameter"), (b"torch._utils", b"_rebuild_tensor_v3"),
]
ODD_GLOBALS = [
    (b"", b""), (b"torch", b""), (b"..", b".."), (b"torch", b"FloatStorage\x00"), (b"\xff\xfe", b"x"),
    (b"a" * 300, b"b" * 300), (b"torch", b"__class__.__mro__"), (b"copyreg", b"_reconstructor"),
    (b"__main__", b"Net"), (b"numpy.core.multiarray", b"_reconstruct"), (b"numpy", b"dtype"),
]
KEY_WORDS = ["module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_fpw_module.",
             "model.", "0.", "weight", "bias", "layer", "", ".", "module", "\x00", "ü", "\udc80"]
STORAGES = [b"FloatStorage", b"HalfStorage", b"LongStorage", b"ByteStorage", b"BFloat16Storage",
            b"UntypedStorage", b"NoSuchStorage"]
LOCATIONS = ["cpu", "cuda:0", "meta", "", "cuda:99999999999999", "xla:0", "\x00"]


class Asm:
    """A protocol-2 pickle being written: raw opcodes, and the memo slots used so far."""

    def __init__(self) -> None:
        self.buf = bytearray(P.PROTO + b"\x02")
        self.memo = 0
        self.storage_keys: list[tuple[str, int]] = []  # (key, numel as declared)

    def op(self, data: bytes) -> None:
        self.buf += data

    def put(self) -> None:
        idx = self.memo
        self.memo += 1
        self.buf += P.BINPUT + bytes([idx]) if idx < 256 else P.LONG_BINPUT + struct.pack("<I", idx)

    def get(self, idx: int) -> None:
        self.buf += P.BINGET + bytes([idx]) if idx < 256 else P.LONG_BINGET + struct.pack("<I", idx)

    def text(self, s: str) -> None:
        raw = s.encode("utf-8", "surrogatepass")
        self.buf += (P.SHORT_BINUNICODE + bytes([len(raw)]) if len(raw) < 256
                     else P.BINUNICODE + struct.pack("<I", len(raw))) + raw

    def int_(self, value: int) -> None:
        if 0 <= value < 256:
            self.buf += P.BININT1 + bytes([value])
        elif -(2**31) <= value < 2**31:
            self.buf += P.BININT + struct.pack("<i", value)
        else:
            raw = P.encode_long(value)
            self.buf += (P.LONG1 + bytes([len(raw)]) if len(raw) < 256 else P.LONG4 + struct.pack("<I", len(raw))) + raw

    def glob(self, module: bytes, name: bytes) -> None:
        self.buf += P.GLOBAL + module + b"\n" + name + b"\n"

    def stop(self) -> bytes:
        return bytes(self.buf + P.STOP)


def huge_int(draw: st.DrawFn) -> int:
    kind = draw(st.sampled_from(["small", "edge", "long1", "long4"]))
    if kind == "small":
        return draw(st.integers(-(2**40), 2**40))
    if kind == "edge":
        return draw(st.sampled_from([2**31, -(2**31) - 1, 2**63, 2**64, -(2**63) - 1, 2**2040, 2**2047 - 1,
                                     -(2**2040), 10**400]))
    if kind == "long1":
        return int.from_bytes(draw(st.binary(min_size=1, max_size=255)), "little", signed=True)
    return 1 << draw(st.integers(2041, 40_000))


@st.composite
def _leaf(draw: st.DrawFn, asm: Asm) -> None:
    kind = draw(st.sampled_from(["none", "bool", "int", "float", "str", "bytes", "get", "global", "payload"]))
    if kind == "none":
        asm.op(P.NONE)
    elif kind == "bool":
        asm.op(P.NEWTRUE if draw(st.booleans()) else P.NEWFALSE)
    elif kind == "int":
        asm.int_(huge_int(draw))
    elif kind == "float":
        value = draw(st.floats(allow_nan=True, allow_infinity=True))
        asm.op(P.BINFLOAT + struct.pack(">d", value))
    elif kind == "str":
        asm.text(key_text(draw))
    elif kind == "bytes":
        raw = draw(st.binary(max_size=40))
        asm.op(P.SHORT_BINBYTES + bytes([len(raw)]) + raw)
    elif kind == "get" and asm.memo:
        asm.get(draw(st.integers(0, asm.memo - 1)))
    elif kind == "global":
        asm.glob(*draw(st.sampled_from(SAFE_GLOBALS * 2 + ODD_GLOBALS)))
    elif kind == "payload" and draw(st.booleans()):
        payload(draw, asm)
    else:
        asm.op(P.NONE)


def key_text(draw: st.DrawFn) -> str:
    """A state_dict-like key: wrapper prefixes and parameter names, sometimes odd text."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=30))
    return "".join(draw(st.lists(st.sampled_from(KEY_WORDS), max_size=5)))


def payload(draw: st.DrawFn, asm: Asm) -> None:
    """``func("touch MARKER")`` through REDUCE, or through NEWOBJ/BUILD of a hostile class."""
    module, name, arg = draw(st.sampled_from(PAYLOADS))
    how = draw(st.sampled_from(["reduce", "build", "newobj"]))
    asm.glob(module, name)
    if how == "reduce":
        asm.text(arg)
        asm.op(P.TUPLE1 + P.REDUCE)
    elif how == "newobj":
        asm.text(arg)
        asm.op(P.TUPLE1 + P.NEWOBJ)
    else:
        asm.op(P.EMPTY_TUPLE + P.REDUCE + P.EMPTY_DICT)
        asm.text("__setstate__")
        asm.glob(module, name)
        asm.op(P.SETITEM + P.BUILD)


def tensor(draw: st.DrawFn, asm: Asm) -> None:
    """``_rebuild_tensor_v2(('storage', Storage, key, loc, numel), offset, size, stride, grad, hooks)``,
    each argument sometimes wrong (huge, negative, of the wrong type)."""
    asm.glob(b"torch._utils", draw(st.sampled_from([b"_rebuild_tensor_v2", b"_rebuild_tensor_v2",
                                                      b"_rebuild_tensor", b"_rebuild_parameter"])))
    asm.op(P.MARK)
    # the persistent id tuple
    asm.op(P.MARK)
    asm.text(draw(st.sampled_from(["storage", "storage", "storage", "tensor", ""])))
    asm.glob(b"torch", draw(st.sampled_from(STORAGES[:1] * 8 + STORAGES)))
    key = draw(st.sampled_from([str(len(asm.storage_keys)), "0", "../../etc/passwd", "", "x" * 300]))
    asm.text(key)
    asm.text(draw(st.sampled_from(LOCATIONS)))
    numel = draw(st.one_of(st.integers(0, 64), st.just(-1), st.just(2**62),
                           st.just(2**64 + 1), st.just(10**30)))
    asm.int_(numel)
    asm.op(P.TUPLE + P.BINPERSID)
    asm.storage_keys.append((key, numel if isinstance(numel, int) else 0))
    asm.int_(draw(st.one_of(st.integers(0, 8), st.just(-1), st.just(2**63))))  # storage offset
    for _ in range(2):  # size, stride
        dims = draw(st.lists(st.one_of(st.integers(0, 8), st.just(-5), st.just(2**63), st.just(10**50)),
                             max_size=draw(st.sampled_from([0, 4, 4, 70]))))
        asm.op(P.MARK)
        for d in dims:
            asm.int_(d)
        asm.op(P.TUPLE)
    asm.op(draw(st.sampled_from([P.NEWFALSE, P.NEWTRUE, P.NONE])))
    asm.glob(b"collections", b"OrderedDict")
    asm.op(P.EMPTY_TUPLE + P.REDUCE)
    if draw(st.booleans()):
        asm.op(P.TUPLE)
    else:  # the wrong number of arguments
        asm.op(P.POP + P.TUPLE)
    asm.op(P.REDUCE)


@st.composite
def value(draw: st.DrawFn, asm: Asm, depth: int) -> None:
    """Push one value; composites recurse until ``depth`` runs out. Sometimes memoised (BINPUT)."""
    kinds = ["leaf"] if depth <= 0 else ["leaf", "leaf", "tuple", "list", "dict", "odict", "tensor", "reduce",
                                          "deep", "bomb", "build"]
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
        draw(_leaf(asm))
    elif kind == "tuple":
        n = draw(st.integers(0, 4))
        if n == 0:
            asm.op(P.EMPTY_TUPLE)
        else:
            asm.op(P.MARK)
            for _ in range(n):
                draw(value(asm, depth - 1))
            asm.op(P.TUPLE)
    elif kind == "list":
        asm.op(P.EMPTY_LIST)
        asm.put()
        asm.op(P.MARK)
        for _ in range(draw(st.integers(0, 4))):
            draw(value(asm, depth - 1))
        asm.op(P.APPENDS)
    elif kind in ("dict", "odict"):
        if kind == "odict":
            asm.glob(b"collections", b"OrderedDict")
            asm.op(P.EMPTY_TUPLE + P.REDUCE)
        else:
            asm.op(P.EMPTY_DICT)
        asm.put()
        asm.op(P.MARK)
        for _ in range(draw(st.integers(0, 4))):
            if draw(st.integers(0, 5)):
                asm.text(key_text(draw))
            else:  # a non-string key: a tuple, a list (unhashable), a number, a memo reference
                draw(value(asm, depth - 1))
            draw(value(asm, depth - 1))
        asm.op(P.SETITEMS)
    elif kind == "tensor":
        tensor(draw, asm)
    elif kind == "reduce":
        asm.glob(*draw(st.sampled_from(SAFE_GLOBALS + ODD_GLOBALS)))
        asm.op(P.MARK)
        for _ in range(draw(st.integers(0, 3))):
            draw(value(asm, depth - 1))
        asm.op(P.TUPLE + draw(st.sampled_from([P.REDUCE, P.NEWOBJ])))
    elif kind == "build":
        draw(value(asm, depth - 1))
        draw(value(asm, depth - 1))
        asm.op(P.BUILD)
    elif kind == "deep":
        deep(draw, asm)
    else:
        bomb(draw, asm)
    if draw(st.integers(0, 3)) == 0:
        asm.put()


def deep(draw: st.DrawFn, asm: Asm) -> None:
    """Nesting far deeper than any checkpoint: tuples, lists or dicts ``n`` levels down."""
    n = draw(st.sampled_from([50, 500, 999, 1001, 2000, 5000, 20_000]))
    how = draw(st.sampled_from(["tuple", "list", "dict"]))
    if how == "tuple":
        asm.op(P.MARK * n + P.NONE + P.TUPLE * n)
    elif how == "list":
        asm.op((P.EMPTY_LIST + P.MARK) * n + P.NONE + P.APPENDS * n)
    else:
        asm.op((P.EMPTY_DICT + P.MARK + P.SHORT_BINUNICODE + b"\x01k") * n + P.NONE + P.SETITEMS * n)


def bomb(draw: st.DrawFn, asm: Asm) -> None:
    """Shared structure through the memo: level i+1 holds ``width`` references to level i.

    ``width ** levels`` leaves from a few hundred bytes (issue 20: 2^39 leaves in 463 bytes hung every
    ckpt command); as a tuple (hashable: a dict key), a list, or a dict whose values share one dict.
    """
    width = draw(st.integers(2, 8))
    levels = draw(st.integers(2, 40))
    how = draw(st.sampled_from(["tuple", "list", "dict"]))
    asm.text("module.w")
    asm.put()
    prev = asm.memo - 1
    for _ in range(levels):
        if how == "tuple":
            asm.op(P.MARK)
            for _ in range(width):
                asm.get(prev)
            asm.op(P.TUPLE)
        elif how == "list":
            asm.op(P.EMPTY_LIST + P.MARK)
            for _ in range(width):
                asm.get(prev)
            asm.op(P.APPENDS)
        else:
            asm.op(P.EMPTY_DICT + P.MARK)
            for i in range(width):
                asm.text(f"module.k{i}")
                asm.get(prev)
            asm.op(P.SETITEMS)
        asm.put()
        prev = asm.memo - 1


@st.composite
def checkpoint_pickle(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, int]]]:
    """A torch checkpoint's pickle: mostly the shape training scripts save (model / optimizer with
    param_groups / epoch / lr), each part drawn from the opcode generator; sometimes any value at all.
    Returns the bytes (sometimes truncated or with a flipped byte) and the storages it declares."""
    asm = Asm()
    depth = draw(st.integers(0, 4))
    if draw(st.integers(0, 3)) == 0:
        draw(value(asm, depth))
    else:
        asm.op(P.EMPTY_DICT)
        asm.put()
        asm.op(P.MARK)
        asm.text(draw(st.sampled_from(["model", "state_dict", "module", "model_state_dict", ""])))
        asm.op(P.EMPTY_DICT)
        asm.put()
        asm.op(P.MARK)
        for _ in range(draw(st.integers(0, 5))):
            asm.text(key_text(draw))
            if draw(st.booleans()):
                tensor(draw, asm)
            else:
                draw(value(asm, depth))
        asm.op(P.SETITEMS)
        if draw(st.booleans()):
            asm.text("optimizer")
            asm.op(P.EMPTY_DICT + P.MARK)
            asm.text("state")
            draw(value(asm, depth))
            asm.text("param_groups")
            asm.op(P.EMPTY_LIST + P.MARK + P.EMPTY_DICT + P.MARK)
            for name in ("lr", "params"):
                asm.text(name)
                draw(value(asm, depth))
            if draw(st.booleans()):  # a key that is not a string (issue 20: a list key)
                draw(value(asm, 1))
                asm.op(P.NONE)
            asm.op(P.SETITEMS + P.APPENDS + P.SETITEMS)
        for name in ("epoch", "lr"):
            if draw(st.booleans()):
                asm.text(name)
                draw(value(asm, 1))
        asm.op(P.SETITEMS)
    data = asm.stop()
    data = mutate(draw, data)
    return data, asm.storage_keys


def mutate(draw: st.DrawFn, data: bytes) -> bytes:
    how = draw(st.sampled_from(["none", "none", "none", "truncate", "flip", "insert"]))
    if how == "none" or len(data) < 3:
        return data
    at = draw(st.integers(1, len(data) - 1))
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]


@dataclass
class ZipPlan:
    prefix: str = "archive"
    drop: list[str] = field(default_factory=list)
    version: bytes | None = None


def torch_zip(template: Path, pkl: bytes, storages: list[tuple[str, int]], draw: st.DrawFn) -> bytes:
    """The real ``torch.save`` archive ``template`` with ``data.pkl`` replaced and one ``data/<key>``
    record per declared storage (its length right, short, empty or missing); the other records (version,
    byteorder, .format_version, serialization_id) kept, dropped or altered."""
    with zipfile.ZipFile(template) as zf:
        records = [(info.filename, zf.read(info)) for info in zf.infolist()]
    old_prefix = records[0][0].split("/", 1)[0]
    prefix = draw(st.sampled_from([old_prefix] * 6 + ["archive", "archive", "", "a/b", "../x"]))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for name, raw in records:
            rest = name.split("/", 1)[1]
            if rest.startswith("data/"):
                continue
            if rest == "data.pkl":
                raw = pkl
            elif draw(st.integers(0, 7)) == 0:
                continue  # a record dropped
            elif rest == "version" and draw(st.integers(0, 4)) == 0:
                raw = draw(st.sampled_from([b"99999999999999999999999\n", b"-1\n", b"x", b"", b"3\n"]))
            elif rest == "byteorder" and draw(st.integers(0, 4)) == 0:
                raw = draw(st.sampled_from([b"big", b"", b"middle"]))
            zf.writestr(f"{prefix}/{rest}" if prefix else rest, raw)
        for key, numel in dict(storages[:16]).items():
            size = draw(st.sampled_from(["right", "right", "short", "empty", "missing"]))
            if size == "missing":
                continue
            n = max(0, min(numel, 4096)) * 4 if size == "right" else (max(0, min(numel, 4096)) * 2 if size == "short"
                                                                       else 0)
            zf.writestr(f"{prefix}/data/{key}" if prefix else f"data/{key}", b"\x00" * n)
    return out.getvalue()


def legacy_file(pkl: bytes, storages: list[tuple[str, int]], draw: st.DrawFn) -> bytes:
    """The pre-1.6 layout (torch/serialization.py ``_legacy_save``) around a generated main pickle."""
    parts = [P.dumps(0x1950A86A20F9469CFC6C, protocol=2), P.dumps(1001, protocol=2),
             P.dumps({"protocol_version": 1001, "little_endian": True,
                      "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2), pkl]
    keys = [k for k, _ in storages]
    parts.append(P.dumps(keys, protocol=2))
    for _key, numel in storages[:16]:
        n = max(0, min(numel, 4096))
        parts.append(struct.pack("<q", draw(st.sampled_from([n, n, -1, 2**62]))) + b"\x00" * (4 * n))
    return mutate(draw, b"".join(parts))
