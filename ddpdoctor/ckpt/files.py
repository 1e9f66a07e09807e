"""One checkpoint file opened without running it: its format, its object tree, its size.

Three file formats, told apart by their first bytes: torch zip (``torch.save`` since 1.6), legacy torch
pickles (before 1.6) and safetensors. Zip and legacy pickles are replayed into a shadow graph by the safe
unpickler (:mod:`ddpdoctor.ckpt.unpickler`), so nothing in the file is imported or called; safetensors
headers are parsed as JSON. Only two paths go through ``torch.load``: legacy files read without
``--trust`` (``weights_only=True``, which refuses to run code) and the ones the user said to trust
(``strip --trust`` of a legacy file, ``load_checkpoint_into(..., trust=True)``).

The layer under the folder layouts: a shard set (:mod:`ddpdoctor.ckpt.sharded`) is files opened here, and
:mod:`ddpdoctor.ckpt.formats` opens any checkpoint (file, DCP folder, shard set) on top of both.
"""

from __future__ import annotations

import io
import pickle
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.ckpt import filecopy, safetensors_file, unpickler, zip_rewrite
from ddpdoctor.ckpt.locate import storage_record
from ddpdoctor.ckpt.model import (
    FORMAT_LEGACY,
    FORMAT_SAFETENSORS,
    FORMAT_ZIP,
    TensorMeta,
    UnsafeCheckpointError,
)
from ddpdoctor.errors import DoctorError


@dataclass
class FileCheckpoint:
    """A checkpoint file opened without running it: its object tree (shadow or real) and where it came from."""

    path: Path
    format: str
    root: Any
    size_bytes: int
    unsafe_globals: list[str] = field(default_factory=list)
    zip: zip_rewrite.TorchZip | None = None
    safetensors: safetensors_file.SafeTensors | None = None


def detect_format(path: Path) -> str:
    """torch zip, legacy torch pickle or safetensors, from the first bytes; DoctorError otherwise."""
    with path.open("rb") as fh:
        head = fh.read(16)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return FORMAT_ZIP
    if safetensors_file.looks_like_safetensors(head, named=path.name.lower().endswith(".safetensors")):
        return FORMAT_SAFETENSORS
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return FORMAT_LEGACY
    raise DoctorError(f"{path} is not a checkpoint this tool reads (not a torch zip, legacy torch pickle "
                      f"or safetensors file; it starts with {head[:8]!r})")


def torch_load(path: Path, *, trust: bool, mmap: bool) -> Any:
    """``torch.load`` with weights-only semantics unless trusted; its failures become DoctorErrors."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=not trust, mmap=mmap)
    except pickle.UnpicklingError as exc:
        # torch/_weights_only_unpickler.py: "Unsupported global: GLOBAL x.Y was not an allowed global" or
        # "Trying to load unsupported GLOBAL posix.system whose module posix is blocked."
        found = re.search(r"GLOBAL (\S+) (?:was not an allowed global|whose module)", str(exc))
        if found:
            raise UnsafeCheckpointError(str(path), found.group(1)) from None
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        useful = [ln for ln in lines if not ln.startswith(("Weights only load failed", "Check the documentation"))]
        raise DoctorError(f"{path} could not be unpickled: {(useful or lines or ['?'])[0]}") from None
    except Exception as exc:
        # A damaged file makes torch.load raise almost anything (AssertionError, KeyError, struct.error...).
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DoctorError(f"{path} is damaged and cannot be loaded: {type(exc).__name__}: {first}") from None


# torch.serialization.MAGIC_NUMBER: the first pickle of a legacy (pre-1.6) checkpoint.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _shadow_legacy(p: Path, fh: io.BytesIO, *, trust: bool) -> tuple[Any, list[str]]:
    """A legacy file's main pickle as a shadow graph, every global recorded and none checked.

    Layout (torch.serialization._legacy_save): pickles of the magic number, the protocol version and
    sys_info, then the object (storages as persistent ids), then the storage keys, then raw storages.
    """
    first = unpickler.ShadowUnpickler(fh, None)
    magic = first.load()
    if magic != _LEGACY_MAGIC:
        # A plain pickle of a malicious object: say so, as torch.load(weights_only=True) would.
        unsafe = [g for g in first.globals_seen if not unpickler.is_allowed(g)]
        if unsafe and not trust:
            raise UnsafeCheckpointError(str(p), unsafe[0])
        raise DoctorError(f"{p} is a pickle but not a torch checkpoint (no torch magic number)")
    unpickler.ShadowUnpickler(fh, None).load()  # protocol version
    unpickler.ShadowUnpickler(fh, None).load()  # sys_info
    main = unpickler.ShadowUnpickler(fh, None)
    return main.load(), main.globals_seen


def open_file(path: str | Path, *, trust: bool, for_rewrite: bool) -> FileCheckpoint:
    """One checkpoint file (see :func:`ddpdoctor.ckpt.formats.open_checkpoint`).

    Zip checkpoints are replayed into a shadow graph (no imports, no tensor data read, even with
    ``trust``); safetensors headers are parsed; legacy (pre-1.6) pickles go through
    ``torch.load(weights_only=True)``, or with ``trust`` are replayed like zip ones, except when they are
    to be rewritten (``strip`` converts them with ``torch.save``, which needs real objects).
    """
    p = filecopy.check_input(path)
    fmt = detect_format(p)
    size = p.stat().st_size
    if fmt == FORMAT_SAFETENSORS:
        st = safetensors_file.open_safetensors(p)
        root = {name: _safetensors_meta(name, entry) for name, entry in st.tensors.items()}
        return FileCheckpoint(p, fmt, root, size, safetensors=st)
    zf = zip_rewrite.open_zip(p) if fmt == FORMAT_ZIP else None
    try:
        if zf is not None:
            root, seen = unpickler.loads(zf.read("data.pkl"), trust=trust)
        else:  # read whole, as torch.load does: legacy files predate torch 1.6 and hold their storages
            # Always replayed first, within the shadow reader's limits: torch.load has none (a memo bomb
            # would hash 2^39 leaves in C, where no deadline can stop it).
            root, seen = _shadow_legacy(p, io.BytesIO(read_input(p)), trust=trust)
    except unpickler.UnsafeGlobalError as exc:
        raise UnsafeCheckpointError(str(p), exc.name) from None
    except unpickler.PickleLimitError as exc:
        raise DoctorError(limit_message(p, exc)) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, struct.error, RecursionError, MemoryError, OverflowError) as exc:
        what = "its data.pkl is" if zf is not None else "its pickle is"
        raise DoctorError(f"{p}: {what} damaged ({type(exc).__name__}: {exc})") from None
    if zf is not None:
        check_storage_records(zf, root)
    if fmt == FORMAT_LEGACY and not (trust and not for_rewrite):
        return FileCheckpoint(p, fmt, torch_load(p, trust=trust, mmap=False), size)
    unsafe: list[str] = []
    if trust:
        unsafe = [g for g in seen if not unpickler.is_allowed(g)]
    return FileCheckpoint(p, fmt, root, size, unsafe_globals=unsafe, zip=zf)


def check_within_limits(p: Path, fmt: str) -> None:
    """Replay a zip or legacy checkpoint's pickle in the bounded shadow reader before ``torch.load`` reads it.

    ``torch.load`` has no limits: a 463-byte memo bomb makes it hash 2^39 leaves in C, where no deadline
    can stop it. The shadow reader refuses it at once (DoctorError, one line). Globals are not judged here
    (``torch.load``'s own weights-only rule does that), only the size and shape of what the pickle builds.
    """
    try:
        if fmt == FORMAT_ZIP:
            zf = zip_rewrite.open_zip(p)
            check_storage_records(zf, unpickler.loads(zf.read("data.pkl"), trust=True)[0])
        elif fmt == FORMAT_LEGACY:
            _shadow_legacy(p, io.BytesIO(read_input(p)), trust=True)
    except unpickler.PickleLimitError as exc:
        raise DoctorError(limit_message(p, exc)) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, struct.error, RecursionError, MemoryError, OverflowError) as exc:
        raise DoctorError(f"{p}: its pickle is damaged ({type(exc).__name__}: {exc})") from None


def check_storage_records(zf: zip_rewrite.TorchZip, root: Any) -> None:
    """DoctorError when the pickle names a storage whose record is absent from the zip or of the wrong size.

    ``torch.load`` reads a storage only when it rebuilds the tensor, so a lost ``data/0`` (a copy or an
    edit that dropped a zip member) surfaces as ``PytorchStreamReader failed locating file data/0``, and
    a short one as ``record size (4 bytes) does not match expected size`` -- or, with ``mmap=True``, not
    at all: the tensor is read from whatever bytes follow. Stripping copies records as they are, so such a
    file would be "stripped" into another file that does not load. Checked from the shadow graph against
    the zip's directory; no tensor byte is read.
    """
    sizes = {rec.name: rec.size for rec in zf.records}
    seen: set[str] = set()

    def visit(node: Any) -> bool:
        if not isinstance(node, unpickler.PidRef):
            return True
        ref = storage_record(node.pid)
        if ref is None or ref[0] in seen:
            return False
        name, expected = ref
        seen.add(name)
        size = sizes.get(f"{zf.prefix}/{name}")
        if size is None:
            raise DoctorError(f"{zf.path} is damaged: its data.pkl names the tensor storage {name}, which is not "
                              "in the zip (a record was lost when the file was copied or edited); use another copy "
                              "of the checkpoint")
        if expected is not None and size != expected:
            raise DoctorError(f"{zf.path} is damaged: its tensor storage {name} holds {size} bytes where "
                              f"data.pkl says {expected} (a record was cut or replaced); use another copy of "
                              "the checkpoint")
        return False

    unpickler.walk(root, visit)


def limit_message(p: Path, exc: unpickler.PickleLimitError) -> str:
    """``PATH: the checkpoint's pickle expands to more than N objects ...; refusing to read it``."""
    text = str(exc).replace("the pickle", "the checkpoint's pickle", 1)
    return f"{p}: {text}"


def read_input(p: Path) -> bytes:
    """The whole file; a file that became unreadable since it was checked is one line, not a crash."""
    try:
        return p.read_bytes()
    except OSError as exc:
        raise DoctorError(f"cannot read checkpoint {p}: {exc.strerror or exc}") from None


def _safetensors_meta(name: str, entry: Mapping[str, Any]) -> TensorMeta:
    begin, end = entry["data_offsets"]
    dtype = safetensors_file.TORCH_DTYPE.get(entry["dtype"], entry["dtype"].lower())
    return TensorMeta(tuple(int(d) for d in entry["shape"]), dtype, name, int(end) - int(begin))

