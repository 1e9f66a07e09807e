"""Hostile checkpoints built for real: opcode-level pickles inside the containers torch writes.

The pickles are written opcode by opcode (names as in the standard library's ``pickletools``), so the attack
is exactly the bytes a malicious or broken file would hold; nothing here relies on ddpdoctor's own writer.
They are placed in:

- a torch zip written by torch's own archive writer (``torch._C.PyTorchFileWriter``, the writer
  ``torch.serialization._save`` uses), with the records ``torch.save`` writes: ``data.pkl``,
  ``.format_version``, ``.storage_alignment``, ``byteorder``, ``data/N`` (storages), and the ``version``
  and ``.data/serialization_id`` records the writer adds itself (torch/serialization.py ``_save``);
- a legacy (pre-1.6) file: pickles of torch's magic number, protocol version and sys_info, then the object,
  then the storage keys (torch/serialization.py ``_legacy_save``);
- a DCP ``.metadata`` file (``pickle.dump`` of ``Metadata`` in torch/distributed/checkpoint/filesystem.py).

The memo bomb is the classic "billion laughs" of pickle: each tuple holds two references (``BINGET``) to the
one before it, so 39 steps of 5 bytes describe 2^39 leaves; Python's hash of a tuple walks all of them in C.
"""

from __future__ import annotations

import pickle
import struct
import sys
from pathlib import Path

PROTO2 = pickle.PROTO + b"\x02"
# torch.serialization.MAGIC_NUMBER and PROTOCOL_VERSION, written first in legacy files.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


def s(text: str) -> bytes:
    """BINUNICODE: a string."""
    raw = text.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw


def glob(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def put(i: int) -> bytes:
    return pickle.BINPUT + bytes([i]) if i < 256 else pickle.LONG_BINPUT + struct.pack("<I", i)


def get(i: int) -> bytes:
    return pickle.BINGET + bytes([i]) if i < 256 else pickle.LONG_BINGET + struct.pack("<I", i)


def long4(value: int) -> bytes:
    raw = pickle.encode_long(value)
    return pickle.LONG4 + struct.pack("<i", len(raw)) + raw


def tensor(key: str = "0", shape: bytes = b"K\x02\x85", stride: bytes = b"K\x01\x85",
           numel: bytes = b"K\x02") -> bytes:
    """``torch._utils._rebuild_tensor_v2(storage, 0, shape, stride, False, OrderedDict())`` as torch pickles it,
    the storage a persistent id ``('storage', torch.FloatStorage, key, 'cpu', numel)``."""
    pid = pickle.MARK + s("storage") + glob("torch", "FloatStorage") + s(key) + s("cpu") + numel + pickle.TUPLE
    return (glob("torch._utils", "_rebuild_tensor_v2") + pickle.MARK + pid + pickle.BINPERSID + b"K\x00"
            + shape + stride + pickle.NEWFALSE + glob("collections", "OrderedDict") + pickle.EMPTY_TUPLE
            + pickle.REDUCE + pickle.TUPLE + pickle.REDUCE)


def state_dict(*extra: bytes, key: str = "module.w") -> bytes:
    """``{key: tensor, **extra}`` (extra: already encoded key/value pairs)."""
    return pickle.EMPTY_DICT + pickle.MARK + s(key) + tensor() + b"".join(extra) + pickle.SETITEMS


def pkl(body: bytes) -> bytes:
    return PROTO2 + body + pickle.STOP


def bomb_tuple(levels: int = 39) -> bytes:
    """``t39`` where ``t0 = 1`` and ``t(k+1) = (tk, tk)`` through the memo: 2^39 leaves in ~200 bytes."""
    body = b"K\x01" + put(0)
    for k in range(levels):
        body += get(k) + pickle.TUPLE2 + put(k + 1)
    return body


def memo_bomb(levels: int = 39) -> bytes:
    """``{t39: 1}``: hashing the key walks 2^39 leaves."""
    return pkl(pickle.EMPTY_DICT + bomb_tuple(levels) + b"K\x01" + pickle.SETITEM)


def shared_dicts(n: int = 60, levels: int = 3) -> bytes:
    """``root = {k: d1 for n keys}``, ``d1 = {k: d2 ...}``, ...: each level one dict shared n times (memo).

    Visited path by path, the state_dict search looks at n^levels mappings of n entries each.
    """
    body = state_dict(key="w") + put(0) + pickle.POP  # the innermost is a real state_dict: every level is searched
    for level in range(levels):
        items = b"".join(s(f"k{i}") + get(level) for i in range(n))
        body += pickle.EMPTY_DICT + pickle.MARK + items + pickle.SETITEMS + put(level + 1)
        if level < levels - 1:
            body += pickle.POP
    return pkl(body)


def deep_list(depth: int) -> bytes:
    """``{'module.w': tensor, 'x': [[[...]]]}`` nested ``depth`` lists deep."""
    return pkl(state_dict(s("x"), pickle.EMPTY_LIST * depth + pickle.APPEND * (depth - 1)))


def deep_tuple_key(depth: int) -> bytes:
    """``{((((1,),),),): 1}``: a key nested ``depth`` tuples deep."""
    return pkl(pickle.EMPTY_DICT + b"K\x01" + pickle.TUPLE1 * depth + b"K\x01" + pickle.SETITEM)


def write_torch_zip(path: Path, data_pkl: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """A torch zip checkpoint holding ``data_pkl``, written by torch's own archive writer."""
    import torch

    writer = torch._C.PyTorchFileWriter(str(path))
    writer.write_record("data.pkl", data_pkl, len(data_pkl))
    writer.write_record(".format_version", "1", 1)
    writer.write_record(".storage_alignment", "64", 2)
    writer.write_record("byteorder", sys.byteorder, len(sys.byteorder))
    for key, data in (storages if storages is not None else {"0": b"\0" * 8}).items():
        writer.write_record(f"data/{key}", data, len(data))
    writer.write_end_of_file()
    return path


def write_legacy(path: Path, main_pkl: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """A legacy (pre-1.6) torch file whose main pickle is ``main_pkl``; storages as ``_legacy_save`` writes
    them after the list of their keys: an 8-byte element count, then the raw bytes (float32 here)."""
    sys_info = {"protocol_version": LEGACY_PROTOCOL, "little_endian": sys.byteorder == "little",
                "type_sizes": {"short": 2, "int": 4, "long": 4}}
    storages = storages if storages is not None else {"0": b"\0" * 8}
    with path.open("wb") as fh:
        for obj in (LEGACY_MAGIC, LEGACY_PROTOCOL, sys_info):
            pickle.dump(obj, fh, protocol=2)
        fh.write(main_pkl)
        pickle.dump(list(storages), fh, protocol=2)
        for data in storages.values():
            fh.write(struct.pack("<q", len(data) // 4) + data)
    return path
