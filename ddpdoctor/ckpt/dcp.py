"""``torch.distributed.checkpoint`` (DCP) directories: read ``.metadata`` without running it, strip, convert.

``dcp.save`` writes a directory: ``.metadata`` (a pickled ``torch.distributed.checkpoint.metadata.Metadata``,
``pickle.dump`` in torch/distributed/checkpoint/filesystem.py ``_FileSystemWriter.finish``) and one or more
``__<rank>_<n>.distcp`` files per rank. The metadata maps every logical key (``fqn``, the nested state
flattened with dots: ``model.module.fc1.weight``) to its shape, dtype and chunks
(``TensorStorageMetadata``) or to a pickled object (``BytesStorageMetadata``: ints, floats, optimizer
param groups), and each chunk to a byte range of a ``.distcp`` file (``_StorageInfo``); ``planner_data``
keeps the path each fqn had in the nested state (``('model', 'module.fc1.weight')``). Each range holds one
``torch.save`` archive (``_write_item``: ``torch.save(tensor, stream)``; objects are ``torch.save``'d by
the planner too).

``.metadata`` is a pickle of classes, so ``pickle.load`` (what torch does) imports and calls them. Here it is
replayed by the shadow unpickler (:mod:`ddpdoctor.ckpt.unpickler`) with an allowlist of only the metadata
classes, ``torch.Size``/dtypes/layout and builtins, by name: none is imported or called, and a pickle that
names anything else (``posix.system``) is refused before any of it is used. Each stored item is a torch zip
read the same way, with ``torch.load(weights_only=True)``'s allowlist.

Stripping renames keys in the metadata only: a stripped DCP directory is a new ``.metadata`` plus the
``.distcp`` files copied by the kernel; a single ``.pt`` file is a new pickle referencing the tensor
records of the embedded archives, copied by the kernel with the CRCs they already carry. Neither reads a
tensor into memory.
"""

from __future__ import annotations

import os
import pickle
import re
import secrets
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor import outputs
from ddpdoctor.ckpt import filecopy, unpickler, zip_rewrite
from ddpdoctor.ckpt.filecopy import copy_range
from ddpdoctor.ckpt.model import StoredObject, TensorMeta
from ddpdoctor.ckpt.unpickler import PidRef, Reduced
from ddpdoctor.errors import DoctorError

METADATA = ".metadata"
_MD = "torch.distributed.checkpoint.metadata."

# Bytes per element of the dtypes DCP records (TensorProperties.dtype); kept static so nothing imports torch.
DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
               "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "uint16": 2, "uint32": 4, "uint64": 8}

# Everything a Metadata pickle names (torch/distributed/checkpoint/metadata.py and filesystem.py; StorageMeta's
# checkpoint_id is the path it was saved to, a pathlib object). All become shadow records: never imported.
DCP_GLOBALS = frozenset({
    *(_MD + n for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")),
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.Size", "torch.serialization._get_layout", "torch.strided", "torch.sparse_coo",
    *(f"torch.{d}" for d in DTYPE_BYTES),
    "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.PurePosixPath", "pathlib.PureWindowsPath",
    "pathlib._local.PosixPath", "pathlib._local.WindowsPath",
    "collections.OrderedDict", "builtins.set", "builtins.frozenset", "builtins.bytearray", "_codecs.encode",
})

_DATA_FILE = re.compile(r"__(\d+)_(\d+)\.distcp$")


def is_dcp_dir(path: Path) -> bool:
    """A directory holding a ``.metadata`` file: what ``dcp.save`` writes."""
    return path.is_dir() and (path / METADATA).exists()


@dataclass(frozen=True)
class Chunk:
    """One stored piece of a logical entry: where in the tensor (offsets, sizes), where in which file."""

    offsets: tuple[int, ...] | None
    sizes: tuple[int, ...] | None
    file: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


@dataclass
class Entry:
    """A logical key of the checkpoint: a tensor (shape, dtype, chunks) or a pickled object."""

    fqn: str
    path: tuple[Any, ...]
    tensor: bool
    shape: tuple[int, ...] | None
    dtype: str | None
    chunks: list[Chunk]

    @property
    def nbytes(self) -> int:
        if not self.tensor or self.shape is None:
            return sum(c.length for c in self.chunks)
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BYTES.get(self.dtype or "", 1)


@dataclass
class DcpDir:
    """A DCP directory read without running anything: its shadow metadata and what it describes."""

    path: Path
    metadata: Reduced
    entries: dict[str, Entry]
    files: dict[str, int]
    missing_files: list[str] = field(default_factory=list)
    short_files: list[str] = field(default_factory=list)
    version: str | None = None

    def ranks(self) -> list[int]:
        return sorted({int(m.group(1)) for f in self.files if (m := _DATA_FILE.search(f))})

    def unavailable(self) -> list[tuple[Any, ...]]:
        """The key paths (as in :func:`tree`) with a chunk in a missing data file: ``dcp.load`` fails on them."""
        gone = set(self.missing_files)
        return [e.path for e in self.entries.values() if any(c.file in gone for c in e.chunks)]

    def layout(self) -> dict[str, Any]:
        """What ``inspect`` reports about the directory itself: files, ranks, problems."""
        per_file: dict[str, int] = {}
        for e in self.entries.values():
            for c in e.chunks:
                per_file[c.file] = per_file.get(c.file, 0) + 1
        files = []
        for name in sorted(set(self.files) | set(per_file)):
            m = _DATA_FILE.search(name)
            files.append({"file": name, "rank": int(m.group(1)) if m else None, "entries": per_file.get(name, 0),
                          "size_bytes": self.files.get(name)})
        return {"kind": "dcp", "version": self.version, "ranks": self.ranks(), "files": files,
                "missing_files": self.missing_files, "short_files": self.short_files,
                "keys": len(self.entries),
                "tensors": sum(1 for e in self.entries.values() if e.tensor),
                "objects": sum(1 for e in self.entries.values() if not e.tensor),
                "sharded_tensors": sum(1 for e in self.entries.values() if e.tensor and len(e.chunks) > 1),
                "entries": [{"key": e.fqn, "kind": "tensor" if e.tensor else "object",
                             "shape": list(e.shape) if e.shape is not None else None, "dtype": e.dtype,
                             "size_bytes": e.nbytes, "chunks": len(e.chunks),
                             "files": sorted({c.file for c in e.chunks})} for e in self.entries.values()]}


def _allowed(name: str) -> bool:
    return name in DCP_GLOBALS


def _bad(d: Path, what: str) -> DoctorError:
    return DoctorError(f"{d / METADATA} is not a valid torch.distributed.checkpoint metadata file: {what}")


def _state(d: Path, node: Any, what: str) -> dict[Any, Any]:
    if isinstance(node, Reduced) and node.states and isinstance(node.states[-1], dict):
        return node.states[-1]
    raise _bad(d, f"{what} is not a {what} record")


def _ints(d: Path, node: Any, what: str) -> tuple[int, ...]:
    """A torch.Size (``torch.Size((8, 8))`` in the pickle) as a tuple of ints."""
    value = node.args[0] if isinstance(node, Reduced) and node.func_name == "torch.Size" and node.args else node
    # Sizes are int64 in torch; a larger one is damage, and its products would overflow later.
    if isinstance(value, (tuple, list)) and all(type(v) is int and 0 <= v < 1 << 63 for v in value):
        return tuple(value)
    raise _bad(d, f"{what} is not a size")


def read_metadata(d: Path) -> Reduced:
    """The shadow ``Metadata`` of a DCP directory; DoctorError for a damaged or hostile file."""
    md_path = d / METADATA
    if not md_path.is_file():
        raise DoctorError(f"{md_path} is not a regular file; a torch.distributed.checkpoint directory needs one")
    try:
        size = md_path.stat().st_size
        data = md_path.read_bytes() if size else b""
    except OSError as exc:
        raise DoctorError(f"cannot read {md_path}: {exc.strerror or exc}") from None
    if size == 0:
        raise DoctorError(f"{md_path} is empty (0 bytes): the save was interrupted before it finished; "
                          "use an earlier checkpoint")
    try:
        root = unpickler.ShadowUnpickler(data, _allowed).load()
    except unpickler.UnsafeGlobalError as exc:
        raise DoctorError(f"{md_path} names {exc.name}, which is not part of a torch.distributed.checkpoint "
                          "metadata: refusing to read it (unpickling it could run code)") from None
    except unpickler.PickleLimitError as exc:
        raise DoctorError(f"{md_path}: {str(exc).replace('the pickle', 'the metadata pickle', 1)}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            struct.error, RecursionError, MemoryError, OverflowError) as exc:
        raise DoctorError(f"{md_path}: the torch.distributed.checkpoint metadata is damaged or truncated "
                          f"({type(exc).__name__}: {exc}); "
                          "the save may have been interrupted: use an earlier checkpoint") from None
    if not (isinstance(root, Reduced) and root.func_name == _MD + "Metadata"):
        raise _bad(d, "it does not hold a Metadata object")
    return root


def open_dcp(path: Path) -> DcpDir:
    """Read a DCP directory's metadata and check which data files exist; no tensor byte is read."""
    md = read_metadata(path)
    st = _state(path, md, "Metadata")
    sdm = st.get("state_dict_metadata")
    storage = st.get("storage_data")
    planner = st.get("planner_data")
    if not isinstance(sdm, dict):
        raise _bad(path, "state_dict_metadata is missing")
    if not isinstance(storage, dict):
        raise _bad(path, "storage_data is missing (not written by the file system writer)")
    locations: dict[tuple[str, tuple[int, ...] | None], Chunk] = {}
    for index, info in storage.items():
        ist = _state(path, index, "MetadataIndex")
        sst = _state(path, info, "_StorageInfo")
        fqn, off = ist.get("fqn"), ist.get("offset")
        rel, start, length = sst.get("relative_path"), sst.get("offset"), sst.get("length")
        if not isinstance(fqn, str) or not isinstance(rel, str) or type(start) is not int \
                or type(length) is not int or start < 0 or length < 0:
            raise _bad(path, "a storage entry lacks its key, file, offset or length")
        if "/" in rel or "\\" in rel or rel in ("", ".", "..") or rel == METADATA:
            raise _bad(path, f"storage file name {rel!r} points outside the directory")
        transforms = tuple(str(t) for t in sst.get("transform_descriptors") or ())
        offsets = _ints(path, off, "a storage offset") if off is not None else None
        locations[(fqn, offsets)] = Chunk(offsets, None, rel, start, length, transforms)
    entries: dict[str, Entry] = {}
    for fqn, value in sdm.items():
        if not isinstance(fqn, str) or not isinstance(value, Reduced):
            raise _bad(path, "a key of state_dict_metadata is not a string")
        obj_path = planner.get(fqn) if isinstance(planner, dict) else None
        if not (isinstance(obj_path, tuple) and obj_path and all(isinstance(p, (str, int)) for p in obj_path)):
            obj_path = (fqn,)
        if value.func_name == _MD + "BytesStorageMetadata":
            chunk = locations.get((fqn, None))
            entries[fqn] = Entry(fqn, obj_path, False, None, None, [chunk] if chunk else [])
            continue
        if value.func_name != _MD + "TensorStorageMetadata":
            raise _bad(path, f"{fqn!r} has an unknown storage kind {value.func_name}")
        vst = _state(path, value, "TensorStorageMetadata")
        shape = _ints(path, vst.get("size"), f"the size of {fqn!r}")
        props = vst.get("properties")
        dtype = None
        if isinstance(props, Reduced) and props.states and isinstance(props.states[-1], tuple) \
                and props.states[-1] and isinstance(props.states[-1][0], unpickler.Global):
            dtype = props.states[-1][0].name
        chunks = []
        for ch in vst.get("chunks") or []:
            cst = _state(path, ch, "ChunkStorageMetadata")
            offsets = _ints(path, cst.get("offsets"), f"a chunk offset of {fqn!r}")
            sizes = _ints(path, cst.get("sizes"), f"a chunk size of {fqn!r}")
            loc = locations.get((fqn, offsets))
            if loc is not None:
                chunks.append(Chunk(offsets, sizes, loc.file, loc.offset, loc.length, loc.transforms))
        entries[fqn] = Entry(fqn, obj_path, True, shape, dtype, chunks)
    files: dict[str, int] = {}
    for child in path.iterdir():
        if child.name != METADATA and child.is_file() and not child.name.startswith("."):
            if outputs.json_command(child) is not None:
                continue  # our own report kept in the folder (`inspect DIR --json DIR/r.json`): not the checkpoint's
            files[child.name] = child.stat().st_size
    needed: dict[str, int] = {}
    for e in entries.values():
        for c in e.chunks:
            needed[c.file] = max(needed.get(c.file, 0), c.offset + c.length)
    missing = sorted(f for f in needed if f not in files)
    for name in missing:  # there, but not a file: a folder, a FIFO or a broken link is no lost rank's file
        if os.path.lexists(path / name):
            raise DoctorError(f"{path / name} is not a regular file ({_kind(path / name)}); the data files .metadata "
                              "names must be files")
    short = sorted(f for f, end in needed.items() if f in files and files[f] < end)
    _check_readable(path, sorted(f for f in needed if f in files))
    version = st.get("version") if isinstance(st.get("version"), str) else None
    return DcpDir(path, md, entries, files, missing, short, version)


def _kind(path: Path) -> str:
    """What a path that is not a regular file is, in words: "a folder", "a FIFO", "a broken link", ..."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken link"
    for test, word in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return word
    return "not a regular file"


def _listify(node: Any) -> Any:
    """Dicts whose keys are 0..n-1 (flattened lists: ``param_groups.0.lr``) back into lists."""
    if not isinstance(node, dict):
        return node
    for k, v in node.items():
        node[k] = _listify(v)
    if node and all(type(k) is int for k in node) and sorted(node) == list(range(len(node))):
        return [node[i] for i in range(len(node))]
    return node


def _nest(items: Iterable[tuple[tuple[Any, ...], Any]], where: Path) -> Any:
    root: dict[Any, Any] = {}
    for path, leaf in items:
        node = root
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise _bad(where, f"key path {'/'.join(map(str, path))} runs through a stored value")
            node = nxt
        node[path[-1]] = leaf
    return _listify(root)


def tree(d: DcpDir) -> Any:
    """The nested state as ``dcp.load`` would rebuild it, with :class:`TensorMeta` and :class:`StoredObject`
    leaves, so inspect/diff/the state_dict check see a DCP directory like any checkpoint."""
    def leaf(e: Entry) -> Any:
        if e.tensor:
            return TensorMeta(e.shape, e.dtype, e.fqn, e.nbytes)
        return StoredObject(e.fqn, sum(c.length for c in e.chunks))

    return _nest(((e.path, leaf(e)) for e in d.entries.values()), d.path)


def _new_fqn(e: Entry, new_path: tuple[Any, ...]) -> str:
    """The flattened key of a renamed entry, built the way DCP flattens (``'.'.join`` of the path)."""
    if e.fqn == ".".join(str(p) for p in e.path):
        return ".".join(str(p) for p in new_path)
    return str(new_path[-1]) if len(e.path) == 1 else e.fqn


def _check_readable(directory: Path, names: Iterable[str]) -> None:
    """DoctorError naming the first of these files of ``directory`` this user cannot open: a rank's file copied
    as root with mode 0600 looks present to a listing (``inspect`` passed it, ``strip -o out.pt`` called it a
    damaged zip and ``strip -o DIR`` blamed the output); see :func:`filecopy.check_readable`."""
    filecopy.check_readable(directory / name for name in names)


def check_complete(d: DcpDir) -> None:
    """DoctorError when a data file the metadata names is missing or shorter than its entries need."""
    if d.missing_files:
        raise DoctorError(f"{d.path} is incomplete: {', '.join(d.missing_files)} named by .metadata "
                          f"{'is' if len(d.missing_files) == 1 else 'are'} missing (a rank's files were not copied?)")
    if d.short_files:
        raise DoctorError(f"{d.path} is incomplete: {', '.join(d.short_files)} ends before the data .metadata "
                          "places in it (truncated copy?)")


def write_dcp_dir(d: DcpDir, target: outputs.Target, path_map: dict[tuple[Any, ...], tuple[Any, ...]]) -> None:
    """A new DCP directory: ``.metadata`` with renamed keys, data files copied by the kernel."""
    check_complete(d)
    _check_readable(d.path, sorted(d.files))  # every file is copied: one we cannot read is not the output's fault
    fqn_map = {e.fqn: _new_fqn(e, path_map[e.path]) for e in d.entries.values() if e.path in path_map}
    st = d.metadata.states[-1]
    st["state_dict_metadata"] = {fqn_map.get(k, k): v for k, v in st["state_dict_metadata"].items()}
    for index in st["storage_data"]:
        ist = index.states[-1]
        ist["fqn"] = fqn_map.get(ist["fqn"], ist["fqn"])
    if isinstance(st.get("planner_data"), dict):
        st["planner_data"] = {fqn_map.get(k, k): path_map.get(v, v) if isinstance(v, tuple) else v
                              for k, v in st["planner_data"].items()}
    new_md = unpickler.dumps_or_refuse(d.metadata, d.path / METADATA)
    unpickler.ShadowUnpickler(new_md, _allowed).load()  # cheap self-check before anything is written
    try:
        with outputs.atomic_folder(target) as tmp:
            for name in d.files:
                with (d.path / name).open("rb") as fin, outputs.create_in(tmp, name, like=d.path / name) as fout:
                    copy_range(fin, fout, 0, os.fstat(fin.fileno()).st_size)
            with outputs.create_in(tmp, METADATA, like=d.path / METADATA) as fh:
                fh.write(new_md)
    except OSError as exc:
        raise outputs.write_error(target.given, exc) from None


Storages = list[tuple[str, "zip_rewrite.Piece | list[zip_rewrite.Piece]"]]


def _open_item(d: DcpDir, chunk: Chunk, what: str, allowed: Callable[[str], bool] | None,
               first: list[zip_rewrite.TorchZip]) -> tuple[zip_rewrite.TorchZip, Any]:
    """The ``torch.save`` archive in one stored range, and its shadow object."""
    if chunk.transforms:
        raise DoctorError(f"{what} is stored through {', '.join(chunk.transforms)} (a DCP storage extension); "
                          "writing one file from it needs torch: use dcp_to_torch_save, or strip to a directory")
    zf = zip_rewrite.open_zip(d.path / chunk.file, chunk.offset, chunk.length)
    if not first:
        first.append(zf)
    try:
        node = unpickler.ShadowUnpickler(zf.read("data.pkl"), allowed).load()
    except unpickler.UnsafeGlobalError as exc:
        raise DoctorError(f"{what} needs {exc.name} to load, which torch.load(weights_only=True) refuses: "
                          "unpickling it can run arbitrary code. If you trust where the file came from, "
                          "pass --trust") from None
    except unpickler.PickleLimitError as exc:
        raise DoctorError(f"{what}: {str(exc).replace('the pickle', 'its pickle', 1)}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            struct.error, RecursionError, MemoryError, OverflowError) as exc:
        raise DoctorError(f"{what} is damaged ({type(exc).__name__}: {exc})") from None
    return zf, node


def _item_graph(d: DcpDir, chunk: Chunk, what: str, allowed: Callable[[str], bool] | None,
                storages: Storages, first: list[zip_rewrite.TorchZip]) -> Any:
    """The shadow object stored in one ``torch.save`` range, its storages re-keyed into ``storages``."""
    zf, node = _open_item(d, chunk, what, allowed, first)
    refs: list[PidRef] = []

    def visit(n: Any) -> bool:
        if isinstance(n, PidRef):
            refs.append(n)
        return True

    unpickler.walk(node, visit)
    renamed: dict[str, str] = {}
    for ref in refs:
        pid = ref.pid
        if not (isinstance(pid, tuple) and len(pid) >= 5):
            raise DoctorError(f"{what} holds a storage reference torch does not write ({pid!r})")
        key = pid[2].decode("ascii", "replace") if isinstance(pid[2], bytes) else str(pid[2])
        if key not in renamed:
            rec = zf.record(f"data/{key}")
            if rec is None:
                raise DoctorError(f"{what} is damaged: its storage data/{key} is missing")
            renamed[key] = str(len(storages))
            storages.append((f"data/{renamed[key]}", zip_rewrite.Piece(
                path=zf.path, offset=rec.data_offset, size=rec.size, crc=rec.crc or None)))
        ref.pid = (*pid[:2], renamed[key], *pid[3:])
    return node


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for dim in reversed(shape):
        stride.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(stride))


def _assemble_rows(d: DcpDir, e: Entry, what: str, allowed: Callable[[str], bool] | None,
                   storages: Storages, first: list[zip_rewrite.TorchZip]) -> Any:
    """A tensor saved as row blocks (FSDP2's ``Shard(0)``, a dim-0 tensor-parallel split) as one storage.

    Row blocks of a contiguous tensor are contiguous ranges of it, in row order: the output storage is
    their bytes one after the other, copied by the kernel; nothing is held in memory. Any other split
    (columns, several dims) would need a real gather and is refused with the way to do it.
    """
    refuse = DoctorError(f"{what} is split over {len(e.chunks)} chunks in a way that needs assembling in memory "
                         "(not row blocks); use torch.distributed.checkpoint.format_utils.dcp_to_torch_save, "
                         "or strip to a directory (-o DIR)")
    shape = e.shape
    if not shape or e.dtype not in DTYPE_BYTES:
        raise refuse
    chunks = sorted((c for c in e.chunks if c.sizes and c.sizes[0] > 0), key=lambda c: c.offsets or ())
    row = 0
    pieces: list[zip_rewrite.Piece] = []
    node: Any = None
    for c in chunks:
        if c.offsets is None or c.sizes is None or c.offsets[0] != row or any(c.offsets[1:]) \
                or c.sizes[1:] != shape[1:]:
            raise refuse
        zf, item = _open_item(d, c, what, allowed, first)
        args = item.args if isinstance(item, Reduced) and item.func_name == "torch._utils._rebuild_tensor_v2" \
            else None
        if not (isinstance(args, tuple) and len(args) >= 6 and isinstance(args[0], PidRef)
                and args[1] == 0 and isinstance(args[2], (tuple, list)) and isinstance(args[3], (tuple, list))
                and tuple(args[2]) == c.sizes and tuple(args[3]) == _contiguous(c.sizes)
                and isinstance(args[0].pid, tuple) and len(args[0].pid) >= 5):
            raise refuse
        pid = args[0].pid
        key = pid[2].decode("ascii", "replace") if isinstance(pid[2], bytes) else str(pid[2])
        rec = zf.record(f"data/{key}")
        nbytes = DTYPE_BYTES[e.dtype]
        for dim in c.sizes:
            nbytes *= dim
        if rec is None or rec.size < nbytes:
            raise DoctorError(f"{what} is damaged: a chunk's storage is missing or too short")
        pieces.append(zip_rewrite.Piece(path=zf.path, offset=rec.data_offset, size=nbytes))
        node = node or item
        row += c.sizes[0]
    if node is None or row != shape[0]:
        raise refuse
    numel = 1
    for dim in shape:
        numel *= dim
    pid = node.args[0].pid
    new_key = str(len(storages))
    storages.append((f"data/{new_key}", pieces))
    ref = PidRef((*pid[:2], new_key, pid[3], numel, *pid[5:]))
    return Reduced(node.func, (ref, 0, tuple(shape), _contiguous(shape), *node.args[4:]))


def write_torch_file(d: DcpDir, target: outputs.Target, path_map: dict[tuple[Any, ...], tuple[Any, ...]], *,
                     trust: bool = False) -> None:
    """One ``torch.save``-format file of the nested state, keys renamed; loads with ``weights_only=True``.

    Tensors are copied by the kernel from the ``.distcp`` files: whole when stored in one chunk (DDP
    saves), row block after row block when sharded by rows (FSDP2, dim-0 tensor parallel); other splits
    would have to be assembled in memory, so they are refused with the way to do it.
    """
    check_complete(d)
    storages: Storages = []
    first: list[zip_rewrite.TorchZip] = []
    allowed = None if trust else unpickler.is_allowed
    leaves = []
    for e in d.entries.values():
        what = f"{d.path}: {e.fqn!r}"
        if not e.chunks:
            raise DoctorError(f"{what} has no stored data in .metadata (damaged metadata)")
        if e.tensor and (len(e.chunks) > 1 or e.chunks[0].sizes != e.shape):
            leaf = _assemble_rows(d, e, what, allowed, storages, first)
        else:
            leaf = _item_graph(d, e.chunks[0], what, allowed, storages, first)
        leaves.append((path_map.get(e.path, e.path), leaf))
    root = _nest(leaves, d.path)
    pickled = unpickler.dumps_or_refuse(root, d.path)
    meta = first[0] if first else None

    def small(name: str, default: bytes) -> bytes:
        return meta.read(name) if meta is not None and meta.record(name) is not None else default

    align = meta.alignment if meta is not None else 64
    records = [("data.pkl", zip_rewrite.Piece(data=pickled)),
               (".format_version", zip_rewrite.Piece(data=small(".format_version", b"1"))),
               (".storage_alignment", zip_rewrite.Piece(data=str(align).encode())),
               ("byteorder", zip_rewrite.Piece(data=small("byteorder", b"little"))),
               *storages,
               ("version", zip_rewrite.Piece(data=small("version", b"3\n"))),
               # torch.serialization writes a random 40-digit id per file (for its own load-time caching).
               (".data/serialization_id", zip_rewrite.Piece(data=f"{secrets.randbelow(10**40):040d}".encode()))]
    prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(target.given).stem) or "archive"
    try:
        with outputs.atomic_output(target) as fh:
            zip_rewrite.write_archive(fh, prefix, records, align)
    except OSError as exc:
        raise outputs.write_error(target.given, exc) from None
