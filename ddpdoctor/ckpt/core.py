"""Checkpoint doctor: find state_dicts in a checkpoint, their wrapper prefixes, and fix them.

The commonest DDP checkpoint failure: ``torch.save(ddp_model.state_dict())`` stores every key as
``module.<name>`` (DistributedDataParallel keeps the model as ``self.module``), and
``model.load_state_dict`` on the unwrapped model fails with ``Missing key(s) in state_dict: "fc.weight"
... Unexpected key(s) in state_dict: "module.fc.weight"``. ``torch.compile`` adds ``_orig_mod.`` the same
way (``OptimizedModule._orig_mod``), in either order with DDP. PyTorch's own fix,
``torch.nn.modules.utils.consume_prefix_in_state_dict_if_present``, needs the whole checkpoint in memory;
here the pickle is edited without running it (:mod:`ddpdoctor.ckpt.unpickler`) and tensor bytes are copied
by the kernel (:mod:`ddpdoctor.ckpt.zip_rewrite`, :mod:`ddpdoctor.ckpt.safetensors_file`).

Python API: :func:`strip_prefix` and :func:`load_checkpoint_into`.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import struct
import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor import fileio
from ddpdoctor.ckpt import filecopy, safetensors_file, unpickler, zip_rewrite
from ddpdoctor.ckpt.unpickler import Global, PidRef, Reduced
from ddpdoctor.errors import DoctorError

if TYPE_CHECKING:
    from torch import nn

FORMAT_ZIP = "torch_zip"
FORMAT_LEGACY = "torch_legacy"
FORMAT_SAFETENSORS = "safetensors"

# DistributedDataParallel.module and torch.compile's OptimizedModule._orig_mod.
KNOWN_PREFIXES = ("module.", "_orig_mod.")
_PREFIX_ORIGIN = {"module.": "DistributedDataParallel/DataParallel", "_orig_mod.": "torch.compile"}

_TENSOR_REBUILDERS = {
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_qtensor", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch._tensor._rebuild_from_type_v2",
    "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_device_tensor_from_cpu_tensor",
    "torch._utils._rebuild_device_tensor_from_numpy", "torch._utils._rebuild_wrapper_subclass",
    "torch._utils._rebuild_sparse_tensor", "torch._utils._rebuild_nested_tensor",
    "torch.nn.parameter.Parameter",
}
_MAX_DEPTH = 3
# torch nests tensor rebuilders at most three deep (Parameter -> _rebuild_from_type_v2 -> _rebuild_tensor_v2).
_MAX_TENSOR_NESTING = 8


class DuplicateKeyError(DoctorError, ValueError):
    """Stripping would map two keys to one name (the checkpoint mixes wrapped and unwrapped keys)."""


@dataclass(frozen=True)
class TensorMeta:
    """What a tensor is without its data: shape, dtype, and which storage holds it."""

    shape: tuple[int, ...] | None
    dtype: str | None
    storage: str | None
    storage_bytes: int


@dataclass
class Checkpoint:
    """A checkpoint opened without running it: its object tree (shadow or real) and where it came from."""

    path: Path
    format: str
    root: Any
    size_bytes: int
    unsafe_globals: list[str] = field(default_factory=list)
    zip: zip_rewrite.TorchZip | None = None
    safetensors: safetensors_file.SafeTensors | None = None


@dataclass
class StateDictLoc:
    """A state_dict found in the checkpoint: the key path to it and the node itself."""

    path: tuple[str, ...]
    node: Any

    @property
    def name(self) -> str:
        return "/".join(self.path) if self.path else "(top level)"


# ---------------------------------------------------------------------------------------------- opening


def detect_format(path: Path) -> str:
    """torch zip, legacy torch pickle or safetensors, from the first bytes; DoctorError otherwise."""
    with path.open("rb") as fh:
        head = fh.read(16)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return FORMAT_ZIP
    if safetensors_file.looks_like_safetensors(head):
        return FORMAT_SAFETENSORS
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return FORMAT_LEGACY
    raise DoctorError(f"{path} is not a checkpoint this tool reads (not a torch zip, legacy torch pickle "
                      f"or safetensors file; it starts with {head[:8]!r})")


def _unsafe_message(path: Path, name: str) -> str:
    return (f"{path} needs {name} to load, which torch.load(weights_only=True) refuses: unpickling it can run "
            "arbitrary code. If you trust where the file came from, pass --trust")


def _torch_load(path: Path, *, trust: bool, mmap: bool) -> Any:
    """``torch.load`` with weights-only semantics unless trusted; its failures become DoctorErrors."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=not trust, mmap=mmap)
    except pickle.UnpicklingError as exc:
        # torch/_weights_only_unpickler.py: "Unsupported global: GLOBAL x.Y was not an allowed global" or
        # "Trying to load unsupported GLOBAL posix.system whose module posix is blocked."
        found = re.search(r"GLOBAL (\S+) (?:was not an allowed global|whose module)", str(exc))
        if found:
            raise DoctorError(_unsafe_message(path, found.group(1))) from None
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        useful = [ln for ln in lines if not ln.startswith(("Weights only load failed", "Check the documentation"))]
        raise DoctorError(f"{path} could not be unpickled: {(useful or lines or ['?'])[0]}") from None
    except Exception as exc:
        # A damaged file makes torch.load raise almost anything (AssertionError, KeyError, struct.error...).
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DoctorError(f"{path} is damaged and cannot be loaded: {type(exc).__name__}: {first}") from None


# torch.serialization.MAGIC_NUMBER: the first pickle of a legacy (pre-1.6) checkpoint.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _shadow_legacy(p: Path, fh: io.BytesIO) -> tuple[Any, list[str]]:
    """A legacy file's main pickle as a shadow graph, every global recorded and none checked.

    Layout (torch.serialization._legacy_save): pickles of the magic number, the protocol version and
    sys_info, then the object (storages as persistent ids), then the storage keys, then raw storages.
    """
    magic = unpickler.ShadowUnpickler(fh, None).load()
    if magic != _LEGACY_MAGIC:
        raise DoctorError(f"{p} is a pickle but not a torch checkpoint (no torch magic number)")
    unpickler.ShadowUnpickler(fh, None).load()  # protocol version
    unpickler.ShadowUnpickler(fh, None).load()  # sys_info
    main = unpickler.ShadowUnpickler(fh, None)
    return main.load(), main.globals_seen


def open_checkpoint(path: str | Path, *, trust: bool = False, for_rewrite: bool = False) -> Checkpoint:
    """Open a checkpoint for inspection or rewriting; never runs code from it unless ``trust`` and ``for_rewrite``.

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
        return Checkpoint(p, fmt, root, size, safetensors=st)
    if fmt == FORMAT_LEGACY and not (trust and not for_rewrite):
        return Checkpoint(p, fmt, _torch_load(p, trust=trust, mmap=False), size)
    zf = zip_rewrite.open_zip(p) if fmt == FORMAT_ZIP else None
    try:
        if zf is not None:
            root, seen = unpickler.loads(zf.read("data.pkl"), trust=trust)
        else:  # read whole, as torch.load does: legacy files predate torch 1.6 and hold their storages
            root, seen = _shadow_legacy(p, io.BytesIO(p.read_bytes()))
    except unpickler.UnsafeGlobalError as exc:
        raise DoctorError(_unsafe_message(p, exc.name)) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, struct.error, RecursionError, MemoryError, OverflowError) as exc:
        what = "its data.pkl is" if zf is not None else "its pickle is"
        raise DoctorError(f"{p}: {what} damaged ({type(exc).__name__}: {exc})") from None
    unsafe: list[str] = []
    if trust:
        unsafe = [g for g in seen if not unpickler.is_allowed(g)]
    return Checkpoint(p, fmt, root, size, unsafe_globals=unsafe, zip=zf)


def _safetensors_meta(name: str, entry: Mapping[str, Any]) -> TensorMeta:
    begin, end = entry["data_offsets"]
    dtype = safetensors_file.TORCH_DTYPE.get(entry["dtype"], entry["dtype"].lower())
    return TensorMeta(tuple(int(d) for d in entry["shape"]), dtype, name, int(end) - int(begin))


# ------------------------------------------------------------------------------------- reading the tree


def _text(value: Any) -> Any:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else value


def _dtype_name(obj: Any) -> str | None:
    if isinstance(obj, Global) and obj.module == "torch":
        return obj.name
    text = str(obj)
    return text[6:] if text.startswith("torch.") else None


# Legacy storage class -> (dtype, bytes per element), as torch.serialization.StorageType maps them; kept
# static so `strip` need not import torch (a test checks it against torch).
STORAGE_DTYPES = {
    "FloatStorage": ("float32", 4), "DoubleStorage": ("float64", 8), "HalfStorage": ("float16", 2),
    "BFloat16Storage": ("bfloat16", 2), "LongStorage": ("int64", 8), "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2), "CharStorage": ("int8", 1), "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1), "ComplexFloatStorage": ("complex64", 8), "ComplexDoubleStorage": ("complex128", 16),
    "QInt8Storage": ("qint8", 1), "QUInt8Storage": ("quint8", 1), "QInt32Storage": ("qint32", 4),
    "QUInt4x2Storage": ("quint4x2", 1), "QUInt2x4Storage": ("quint2x4", 1), "UntypedStorage": ("uint8", 1),
}


def _storage_dtype(name: str) -> tuple[str, int]:
    if name in STORAGE_DTYPES:
        return STORAGE_DTYPES[name]
    try:
        import torch
        from torch.serialization import StorageType

        dtype = StorageType(name).dtype
        return str(dtype)[6:], int(torch.empty((), dtype=dtype).element_size())
    except (KeyError, AttributeError, TypeError, RuntimeError):
        return name, 1


def _storage_meta(pid: Any) -> tuple[str | None, str | None, int]:
    """(dtype, storage key, bytes) from a torch persistent id ('storage', type, key, location, numel[, view])."""
    # Legacy (pre-1.6) files add a sixth item, view metadata (torch.serialization._legacy_save).
    if not (isinstance(pid, tuple) and len(pid) in (5, 6) and _text(pid[0]) == "storage"):
        return None, None, 0
    storage_type, key, _location, numel = pid[1:5]
    dtype, size = _storage_dtype(storage_type.name if isinstance(storage_type, Global) else "UntypedStorage")
    return dtype, str(_text(key)), numel * size if type(numel) is int else 0


def _shape(value: Any) -> tuple[int, ...] | None:
    """A shape from a pickled size tuple; None if it is not plain integers."""
    if isinstance(value, (tuple, list)) and all(type(d) is int for d in value):
        return tuple(value)
    return None


def tensor_meta(obj: Any, _depth: int = 0) -> TensorMeta | None:
    """Shape/dtype/storage of a tensor node (shadow, real tensor or safetensors entry); None otherwise."""
    if isinstance(obj, TensorMeta):
        return obj
    if isinstance(obj, Reduced):
        name = obj.func_name
        if name not in _TENSOR_REBUILDERS:
            return None
        if _depth > _MAX_TENSOR_NESTING:  # a crafted chain of Parameter(Parameter(...)): a tensor, unknown
            return TensorMeta(None, None, None, 0)
        args = obj.args if isinstance(obj.args, tuple) else ()
        if name in ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
                    "torch._utils._rebuild_qtensor", "torch._utils._rebuild_tensor") and len(args) >= 3:
            dtype, key, nbytes = _storage_meta(args[0].pid) if isinstance(args[0], PidRef) else (None, None, 0)
            if name == "torch._utils._rebuild_tensor_v3" and len(args) >= 7:
                dtype = _dtype_name(args[6]) or dtype
            return TensorMeta(_shape(args[2]), dtype, key, nbytes)
        if name in ("torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
                    "torch.nn.parameter.Parameter", "torch._utils._rebuild_device_tensor_from_cpu_tensor") \
                and args:
            return tensor_meta(args[0], _depth + 1) or TensorMeta(None, None, None, 0)
        if name == "torch._tensor._rebuild_from_type_v2" and len(args) >= 3:
            inner = Reduced(args[0], args[2])
            return tensor_meta(inner, _depth + 1) or TensorMeta(None, None, None, 0)
        if name == "torch._utils._rebuild_meta_tensor_no_storage" and len(args) >= 2:
            return TensorMeta(_shape(args[1]), _dtype_name(args[0]), None, 0)
        return TensorMeta(None, None, None, 0)
    # Real tensors exist only if torch was imported (legacy format, torch.load); never import it here.
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        return TensorMeta(tuple(obj.shape), str(obj.dtype)[6:], f"{storage.data_ptr()}:{id(storage)}"
                          if storage.data_ptr() == 0 else str(storage.data_ptr()), int(storage.nbytes()))
    return None


def mapping_pairs(obj: Any) -> list[tuple[Any, Any]] | None:
    """Key/value pairs of a dict or OrderedDict node (shadow or real); None if the node is not a mapping."""
    if isinstance(obj, Mapping):
        return list(obj.items())
    if isinstance(obj, Reduced) and obj.func_name in ("collections.OrderedDict", "builtins.dict") \
            and obj.args in ((), []) and not obj.listitems:
        return list(obj.dictitems)
    return None


def _state_dict_pairs(obj: Any) -> list[tuple[Any, Any]] | None:
    """Pairs if ``obj`` looks like a module state_dict: names to tensors (plus ``*_extra_state``)."""
    pairs = mapping_pairs(obj)
    if not pairs or not all(isinstance(k, str) for k, _ in pairs):
        return None
    tensors = 0
    for key, value in pairs:
        if tensor_meta(value) is not None:
            tensors += 1
        elif not key.endswith("_extra_state"):
            return None
    return pairs if tensors else None


def find_state_dicts(root: Any, key: str | None = None) -> list[StateDictLoc]:
    """Every state_dict in the checkpoint (at most 3 mappings deep), or the one at ``key`` (``a/b``)."""
    if key is not None:
        return [_resolve_key(root, key)]
    found: list[StateDictLoc] = []

    def visit(node: Any, path: tuple[str, ...]) -> None:
        if _state_dict_pairs(node) is not None:
            found.append(StateDictLoc(path, node))
            return
        pairs = mapping_pairs(node)
        # Mappings with non-string keys (optimizer "state": {0: {...}}) hold no model weights.
        if pairs is None or len(path) >= _MAX_DEPTH or not all(isinstance(k, str) for k, _ in pairs):
            return
        # An optimizer state_dict keyed by parameter name (FSDP.optim_state_dict, DCP's get_state_dict)
        # holds {"exp_avg": tensor, "step": tensor} per parameter: optimizer state, not model weights.
        if _is_optimizer_state(pairs):
            return
        for k, v in pairs:
            visit(v, (*path, k))

    visit(root, ())
    return found


def _is_optimizer_state(pairs: list[tuple[Any, Any]]) -> bool:
    """``torch.optim.Optimizer.state_dict()``'s shape: ``state`` and ``param_groups`` (a list)."""
    # Keys of a shadow OrderedDict may be anything, unhashable ones included: compare, never hash.
    keys = [k for k, _ in pairs if isinstance(k, str)]
    groups = [v for k, v in pairs if isinstance(k, str) and k == "param_groups"]
    return "state" in keys and len(groups) == 1 and isinstance(groups[0], list)


def _resolve_key(root: Any, key: str) -> StateDictLoc:
    node = root
    path: tuple[str, ...] = ()
    parts = [key] if _has_key(root, key) else key.split("/")
    for part in parts:
        pairs = mapping_pairs(node)
        if pairs is None:
            raise DoctorError(f"--key {key}: {'/'.join(path) or 'the checkpoint'} is not a mapping")
        match = [v for k, v in pairs if k == part]
        if not match:
            keys = ", ".join(str(k) for k, _ in pairs[:12])
            raise DoctorError(f"--key {key}: no entry {part!r} in {'/'.join(path) or 'the checkpoint'} "
                              f"(its keys: {keys})")
        node = match[-1]
        path = (*path, part)
    pairs = mapping_pairs(node)
    if pairs is None or not all(isinstance(k, str) for k, _ in pairs) \
            or not any(tensor_meta(v) is not None for _, v in pairs):
        raise DoctorError(f"--key {key}: that entry is not a state_dict (a mapping of names to tensors)")
    return StateDictLoc(path, node)


def _has_key(node: Any, key: str) -> bool:
    pairs = mapping_pairs(node)
    return pairs is not None and any(k == key for k, _ in pairs)


# --------------------------------------------------------------------------------------------- renaming


def _normalize_prefixes(prefixes: Iterable[str] | None) -> tuple[str, ...]:
    if prefixes is None:
        return KNOWN_PREFIXES
    out = []
    for p in prefixes:
        if not p or p == ".":
            raise DoctorError("--prefix must not be empty (e.g. --prefix module.)")
        out.append(p if p.endswith(".") else p + ".")
    return tuple(out)


def _strip_one(key: str, prefixes: tuple[str, ...]) -> tuple[str, list[str]]:
    """Remove the prefixes from the start of ``key`` as often as they appear, in any order."""
    removed: list[str] = []
    changed = True
    while changed:
        changed = False
        for p in prefixes:
            if key.startswith(p) and len(key) > len(p):
                key = key[len(p):]
                removed.append(p)
                changed = True
    return key, removed


def plan_renames(keys: Iterable[str], prefixes: Iterable[str] | None = None, *, where: str = "the state_dict",
                 add: str = "") -> tuple[dict[str, str], dict[str, int]]:
    """old -> new name for every key that changes, and how many keys carried each prefix.

    Raises :class:`DuplicateKeyError` if two keys would end up with the same name.
    """
    plist = _normalize_prefixes(prefixes)
    renames: dict[str, str] = {}
    counts: dict[str, int] = {}
    owner: dict[str, str] = {}
    for key in keys:
        new, removed = _strip_one(key, plist)
        new = add + new
        for p in dict.fromkeys(removed):  # in the order found, so output does not depend on the hash seed
            counts[p] = counts.get(p, 0) + 1
        if new in owner:
            raise DuplicateKeyError(
                f"renaming would create duplicate key {new!r} in {where}: both {owner[new]!r} and {key!r} map to "
                "it (the checkpoint mixes wrapped and unwrapped weights); keep one copy of each key in Python "
                "and save again")
        owner[new] = key
        if new != key:
            renames[key] = new
    return renames, counts


def _rename_metadata_key(key: str, prefixes: tuple[str, ...], add: str) -> str:
    """Module paths in ``_metadata`` have no trailing dot: ``module`` -> '', ``module.fc`` -> ``fc``.

    Same rule as ``consume_prefix_in_state_dict_if_present`` (torch/nn/modules/utils.py).
    """
    changed = True
    while changed and key:
        changed = False
        for p in prefixes:
            if key == p[:-1]:
                key, changed = "", True
            elif key.startswith(p):
                key, changed = key[len(p):], True
    if add:
        key = add[:-1] if not key else add + key
    return key


def _renamed_pairs(pairs: list[tuple[Any, Any]], rename: Any) -> list[tuple[Any, Any]]:
    """Pairs with keys renamed; on a collision the later entry wins, at the earlier one's position."""
    out: dict[Any, Any] = {}
    try:
        for k, v in pairs:
            out[rename(k) if isinstance(k, str) else k] = v
    except TypeError:  # an unhashable key in a shadow OrderedDict: not module paths, leave it alone
        return pairs
    return list(out.items())


def _set_pairs(node: Any, pairs: list[tuple[Any, Any]]) -> None:
    if isinstance(node, dict):
        node.clear()
        node.update(pairs)
    elif isinstance(node, Reduced):
        node.dictitems = pairs


def _rename_node(node: Any, renames: dict[str, str], prefixes: tuple[str, ...], add: str) -> None:
    """Rename a state_dict node in place (shadow or real), ``_metadata`` included."""
    pairs = mapping_pairs(node) or []
    _set_pairs(node, [(renames.get(k, k), v) for k, v in pairs])

    def fix_meta(meta: Any) -> None:
        meta_pairs = mapping_pairs(meta)
        if meta_pairs is not None:
            _set_pairs(meta, _renamed_pairs(meta_pairs, lambda k: _rename_metadata_key(k, prefixes, add)))

    if isinstance(node, Reduced):
        for state in node.states:
            for k, v in mapping_pairs(state) or []:
                if k == "_metadata":
                    fix_meta(v)
    elif hasattr(node, "_metadata"):
        fix_meta(node._metadata)


def strip_prefix(state_dict: Mapping[str, Any], prefixes: Iterable[str] | None = None) -> OrderedDict[str, Any]:
    """A copy of ``state_dict`` with wrapper prefixes removed from the keys (and from ``_metadata``).

    ``prefixes`` defaults to ``module.`` (DDP/DataParallel) and ``_orig_mod.`` (torch.compile), removed
    wherever they start a key, in any order and combination. Tensors are not copied. Raises
    :class:`DuplicateKeyError` (a ``ValueError``) if two keys would collide.
    """
    plist = _normalize_prefixes(prefixes)
    renames, _ = plan_renames(state_dict.keys(), plist)
    out: OrderedDict[str, Any] = OrderedDict((renames.get(k, k), v) for k, v in state_dict.items())
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        new_meta = OrderedDict(_renamed_pairs(list(meta.items()), lambda k: _rename_metadata_key(k, plist, "")))
        out._metadata = new_meta  # type: ignore[attr-defined]
    return out


# ---------------------------------------------------------------------------------------------- inspect


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _summarize(value: Any) -> str:
    """One short line for a non-state_dict entry (epoch, optimizer, config...)."""
    meta = tensor_meta(value)
    if meta is not None:
        return f"tensor {meta.dtype} {list(meta.shape) if meta.shape is not None else '?'}"
    if value is None or isinstance(value, (bool, int, float)):
        return f"{type(value).__name__}: {value!r}"
    if isinstance(value, str):
        return f"str: {value[:60]!r}"
    pairs = mapping_pairs(value)
    if pairs is not None:
        if _is_optimizer_state(pairs):
            entries = {k: v for k, v in pairs if isinstance(k, str)}
            state = mapping_pairs(entries["state"]) or []
            groups = entries["param_groups"]
            n_groups = len(groups) if isinstance(groups, list) else 0
            lr = ""
            if isinstance(groups, list) and groups:
                first = dict(mapping_pairs(groups[0]) or [])
                if isinstance(first.get("lr"), (int, float)):
                    lr = f", lr={first['lr']:g}"
            return f"optimizer state: {len(state)} parameter states, {n_groups} param group(s){lr}"
        names = ", ".join(str(k) for k, _ in pairs[:6]) + (", ..." if len(pairs) > 6 else "")
        return f"mapping with {len(pairs)} keys: {names}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)} items"
    if isinstance(value, Reduced):
        return f"object {value.func_name or '?'}"
    return type(value).__name__


def _tensor_stats(root: Any) -> tuple[int, int, dict[str, int]]:
    """(tensor count, bytes of distinct storages, tensors per dtype) over the whole tree."""
    count, storages, dtypes = 0, {}, {}  # type: ignore[var-annotated]

    def visit(node: Any) -> bool:
        nonlocal count
        meta = tensor_meta(node)
        if meta is None:
            return True
        count += 1
        dtypes[meta.dtype or "?"] = dtypes.get(meta.dtype or "?", 0) + 1
        if meta.storage is not None:
            storages[meta.storage] = max(storages.get(meta.storage, 0), meta.storage_bytes)
        return False

    _walk_real_or_shadow(root, visit)
    return count, sum(storages.values()), dict(sorted(dtypes.items()))


def _walk_real_or_shadow(root: Any, visit: Any) -> None:
    def wrapped(node: Any) -> bool:
        if not visit(node):
            return False
        pairs = mapping_pairs(node)
        if pairs is not None and not isinstance(node, (dict, Reduced)):
            for _key, v in pairs:
                _walk_real_or_shadow(v, visit)
            return False
        return True

    unpickler.walk(root, wrapped)


def _state_dict_report(loc: StateDictLoc) -> dict[str, Any]:
    pairs = mapping_pairs(loc.node) or []
    keys = [k for k, _ in pairs]
    metas = [tensor_meta(v) for _, v in pairs]
    storages: dict[str, int] = {}
    for m in metas:
        if m is not None and m.storage is not None:
            storages[m.storage] = max(storages.get(m.storage, 0), m.storage_bytes)
    counts: dict[str, int] = {}
    examples: dict[str, list[str]] = {}
    for key in keys:
        _, removed = _strip_one(key, KNOWN_PREFIXES)
        if removed:
            combo = "".join(removed)
            counts[combo] = counts.get(combo, 0) + 1
            examples.setdefault(combo, []).append(key)
    return {
        "location": loc.name,
        "path": list(loc.path),
        "keys": len(keys),
        "tensors": sum(1 for m in metas if m is not None),
        "tensor_bytes": sum(storages.values()),
        "prefixes": [{"prefix": p, "keys": n, "examples": examples[p][:3]} for p, n in counts.items()],
        "unprefixed_keys": len(keys) - sum(counts.values()),
        "example_keys": keys[:3],
    }


def _finding(status: str, summary: str, remedy: str = "") -> dict[str, str]:
    return {"status": status, "summary": summary, "remedy": remedy}


def _stripped_name(path: Path) -> str:
    return str(path.with_name(f"{path.stem}.stripped{path.suffix}"))


def inspect_checkpoint(ckpt: Checkpoint) -> dict[str, Any]:
    """The ``ckpt inspect`` report (JSON-able): format, tensors, state_dicts, prefixes, findings."""
    count, nbytes, dtypes = _tensor_stats(ckpt.root)
    if ckpt.safetensors is not None:
        nbytes = ckpt.safetensors.data_size
    locs = find_state_dicts(ckpt.root)
    sds = [_state_dict_report(loc) for loc in locs]
    sd_tops = {loc.path[0] for loc in locs if loc.path}
    others = []
    top = mapping_pairs(ckpt.root)
    if top is not None and () not in [loc.path for loc in locs]:
        others = [{"key": str(k), "summary": _summarize(v)} for k, v in top
                  if not (isinstance(k, str) and k in sd_tops)]
    findings = []
    fix = f"ddpdoctor ckpt strip {ckpt.path} -o {_stripped_name(ckpt.path)}"
    for loc, rep in zip(locs, sds, strict=True):
        try:
            plan_renames((k for k, _ in mapping_pairs(loc.node) or []), where=repr(loc.name))
        except DuplicateKeyError as exc:
            findings.append(_finding("fail", str(exc).split(";")[0],
                                     "the checkpoint mixes wrapped and unwrapped weights: load it in Python, "
                                     "keep one copy of each key, and save it again"))
            continue
        for pre in rep["prefixes"]:
            origin = " and ".join(_PREFIX_ORIGIN[p + "."] for p in pre["prefix"].split(".")[:-1]
                                  if p + "." in _PREFIX_ORIGIN)
            scope = "all" if pre["keys"] == rep["keys"] else f"{pre['keys']} of"
            findings.append(_finding(
                "warn",
                f"{scope} {rep['keys']} keys of {rep['location']} start with {pre['prefix']!r} (saved from a "
                f"{origin}-wrapped model); load_state_dict on the plain model fails with Missing/Unexpected "
                "key(s)",
                f"{fix}   (or in Python: ddpdoctor.load_checkpoint_into(model, {str(ckpt.path)!r}))"))
        if not rep["prefixes"]:
            findings.append(_finding("pass", f"{rep['location']}: {rep['keys']} keys, no wrapper prefixes"))
    if not locs and isinstance(ckpt.root, Reduced) and top is None:
        findings.append(_finding(
            "warn", f"the file pickles a whole object ({ckpt.root.func_name or '?'}), not a state_dict",
            "save model.state_dict() instead: whole pickled models break when the code moves or changes"))
    elif not locs:
        findings.append(_finding("warn", "no state_dict found (no mapping of names to tensors within 3 levels)",
                                 "name it with --key, e.g. --key model/state_dict"))
    if ckpt.unsafe_globals:
        findings.append(_finding(
            "warn", f"needs non-weights-only globals: {', '.join(ckpt.unsafe_globals[:5])}; "
                    "torch.load(weights_only=False) runs code from this file",
            "re-save only tensors and plain containers (e.g. torch.save({'model': model.state_dict()}))"))
    status = "fail" if any(f["status"] == "fail" for f in findings) else (
        "warn" if any(f["status"] == "warn" for f in findings) else "pass")
    return {
        "path": str(ckpt.path), "format": ckpt.format, "size_bytes": ckpt.size_bytes,
        "tensor_count": count, "tensor_bytes": nbytes, "dtypes": dtypes,
        "state_dicts": sds, "other_entries": others, "unsafe_globals": ckpt.unsafe_globals,
        "findings": findings, "status": status,
    }


def render_inspect(rep: dict[str, Any]) -> str:
    """The human-readable ``ckpt inspect`` output."""
    fmt = {FORMAT_ZIP: "torch zip", FORMAT_LEGACY: "legacy torch pickle", FORMAT_SAFETENSORS: "safetensors"}
    dtypes = ", ".join(f"{d} x{n}" for d, n in rep["dtypes"].items()) or "none"
    lines = [f"checkpoint  {rep['path']}  ({fmt[rep['format']]}, {_human(rep['size_bytes'])})",
             f"tensors     {rep['tensor_count']} ({_human(rep['tensor_bytes'])}); dtypes: {dtypes}"]
    for sd in rep["state_dicts"]:
        pre = "; ".join(f"{p['prefix']!r} on {p['keys']}/{sd['keys']} keys (e.g. {p['examples'][0]})"
                        for p in sd["prefixes"]) or "no wrapper prefix"
        lines.append(f"state_dict  {sd['location']}: {sd['keys']} keys, {_human(sd['tensor_bytes'])}; {pre}")
    if rep["other_entries"]:
        lines.append("other entries:")
        width = max(len(e["key"]) for e in rep["other_entries"])
        lines += [f"  {e['key']:<{width}}  {e['summary']}" for e in rep["other_entries"]]
    lines.append("findings:")
    for f in rep["findings"]:
        lines.append(f"  {f['status'].upper():<5} {f['summary']}")
        if f["remedy"]:
            lines.append(f"        fix: {f['remedy']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ strip


@dataclass
class StripReport:
    """What ``strip`` did: where, which prefixes, how many keys; JSON-able."""

    path: str
    output: str
    format: str
    state_dicts: list[dict[str, Any]]
    renamed_keys: int
    converted_from_legacy: bool = False
    written: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def strip_file(path: str | Path, output: str | Path | None, *, prefixes: Iterable[str] | None = None,
               key: str | None = None, in_place: bool = False, trust: bool = False) -> StripReport:
    """Write a copy of the checkpoint with wrapper prefixes removed; atomic, never touches the input.

    The input is opened first, so every bad-input error comes before any output file exists.
    """
    ckpt = open_checkpoint(path, trust=trust, for_rewrite=True)
    if output is None:
        if not in_place:
            raise DoctorError("give the output file with -o OUT (or --in-place to replace the input)")
        output = ckpt.path
    out = Path(output)
    filecopy.check_output(ckpt.path, out, in_place)
    plist = _normalize_prefixes(prefixes)
    locs = find_state_dicts(ckpt.root, key)
    if not locs:
        raise DoctorError(f"{ckpt.path}: no state_dict found (no mapping of names to tensors); "
                          "name it with --key")
    summary = []
    all_renames: dict[str, str] = {}  # safetensors: one flat location, renamed in its header
    total = 0
    for loc in locs:
        renames, counts = plan_renames((k for k, _ in mapping_pairs(loc.node) or []), plist,
                                       where=repr(loc.name))
        _rename_node(loc.node, renames, plist, "")
        summary.append({"location": loc.name, "renamed_keys": len(renames),
                        "prefixes": [{"prefix": p, "keys": n} for p, n in counts.items()]})
        all_renames.update(renames)
        total += len(renames)
    if total == 0 and out.exists() and os.path.samefile(out, ckpt.path):
        # --in-place with nothing to strip: leave the file (and its mtime) alone.
        return StripReport(str(ckpt.path), str(out), ckpt.format, summary, 0, written=False)
    # An output that will be fsynced is pushed to disk as it is copied, so the fsync waits for little.
    replacing = fileio.replaces_existing(out)
    try:
        with fileio.atomic_output(out, mode_from=ckpt.path) as fh:
            if ckpt.zip is not None:
                try:
                    new_pickle = unpickler.dumps(ckpt.root)
                except RecursionError:
                    raise DoctorError(f"{ckpt.path}: its pickle nests objects too deeply to rewrite") from None
                unpickler.loads(new_pickle, trust=True)  # cheap self-check before anything is renamed
                zip_rewrite.rewrite(ckpt.zip, fh, new_pickle, start_writeback=replacing)
            elif ckpt.safetensors is not None:
                safetensors_file.rewrite(ckpt.safetensors, fh, all_renames, start_writeback=replacing)
            else:
                import torch

                torch.save(ckpt.root, fh)
    except OSError as exc:
        raise filecopy.write_error(out, exc) from None
    return StripReport(str(ckpt.path), str(out), ckpt.format, summary, total,
                       converted_from_legacy=ckpt.format == FORMAT_LEGACY)


# ------------------------------------------------------------------------------------------------- diff


@dataclass
class Fix:
    """A key rename: strip these prefixes from each key, then add ``add``."""

    strip: tuple[str, ...]
    add: str

    def describe(self) -> str:
        parts = [f"remove {' and '.join(repr(p) for p in self.strip)}"] if self.strip else []
        if self.add:
            parts.append(f"add {self.add!r}")
        return " then ".join(parts) or "no change"


def _common_components(keys: Iterable[str]) -> list[str]:
    """The leading dotted components every key shares (excluding the last component)."""
    common: list[str] | None = None
    for key in keys:
        parts = key.split(".")[:-1]
        if common is None:
            common = parts
        else:
            n = 0
            while n < min(len(common), len(parts)) and common[n] == parts[n]:
                n += 1
            common = common[:n]
        if not common:
            return []
    return common or []


def _apply(keys: list[str], fix: Fix) -> dict[str, str] | None:
    try:
        renames, _ = plan_renames(keys, fix.strip, add=fix.add)
    except DuplicateKeyError:
        return None
    return {k: renames.get(k, k) for k in keys}


def _compare(ckpt_shapes: dict[str, Any], model_shapes: dict[str, Any]) -> dict[str, Any]:
    missing = [k for k in model_shapes if k not in ckpt_shapes]
    unexpected = [k for k in ckpt_shapes if k not in model_shapes]
    mismatched = [{"key": k, "checkpoint_shape": list(ckpt_shapes[k]) if ckpt_shapes[k] is not None else None,
                   "model_shape": list(model_shapes[k])}
                  for k in model_shapes if k in ckpt_shapes and ckpt_shapes[k] is not None
                  and tuple(ckpt_shapes[k]) != tuple(model_shapes[k])]
    return {"missing": missing, "unexpected": unexpected, "shape_mismatches": mismatched,
            "loads_strict": not missing and not unexpected and not mismatched}


def best_fix(ckpt_shapes: dict[str, Any], model_shapes: dict[str, Any]) -> tuple[Fix, dict[str, Any]]:
    """The key rename under which the checkpoint matches the model best, and the comparison after it."""
    keys = list(ckpt_shapes)
    ck_common = _common_components(keys)
    md_common = _common_components(model_shapes)
    candidates = [Fix((), ""), Fix(KNOWN_PREFIXES, "")]
    for i in range(0, min(len(ck_common), 3) + 1):
        for j in range(0, min(len(md_common), 3) + 1):
            strip = (".".join(ck_common[:i]) + ".",) if i else ()
            add = ".".join(md_common[:j]) + "." if j else ""
            candidates.append(Fix(strip, add))
        if md_common:
            candidates.append(Fix(KNOWN_PREFIXES, ".".join(md_common[:1]) + "."))
    best: tuple[tuple[int, int, int], Fix, dict[str, Any]] | None = None
    for fix in candidates:
        mapping = _apply(keys, fix)
        if mapping is None:
            continue
        renamed = {mapping[k]: v for k, v in ckpt_shapes.items()}
        cmp = _compare(renamed, model_shapes)
        matched = len(model_shapes) - len(cmp["missing"]) - len(cmp["shape_mismatches"])
        # The known wrapper prefixes count as one rename: report them by name rather than as one string.
        cost = (1 if fix.strip == KNOWN_PREFIXES else len(fix.strip)) + (1 if fix.add else 0)
        score = (matched, -len(cmp["unexpected"]), -cost)
        if best is None or score > best[0]:
            best = (score, fix, cmp)
    assert best is not None  # the identity candidate never collides
    fix = best[1]
    if fix.strip == KNOWN_PREFIXES:
        # Name only the wrapper prefixes these keys carry, in the order they appear.
        fix = Fix(tuple(_used_prefixes(ckpt_shapes)), fix.add)
    return fix, best[2]


def _shapes(node: Any) -> dict[str, Any]:
    out = {}
    for k, v in mapping_pairs(node) or []:
        meta = tensor_meta(v)
        if isinstance(k, str) and meta is not None:
            out[k] = meta.shape
    return out


def build_model_for_shapes(spec: str) -> nn.Module:
    """The model from ``MODULE:FACTORY``, built on the meta device when the factory allows it.

    Comparing keys and shapes needs no weights; under ``torch.device("meta")`` (a context manager since
    torch 2.0) a 70B-parameter factory costs no memory. A factory that cannot build on meta (it moves
    tensors to a device, uses numpy...) is called again normally.
    """
    from ddpdoctor import modelspec

    return modelspec.build_model(spec, try_meta=True)


def model_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Key -> shape of everything ``model.load_state_dict(strict=True)`` expects."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if hasattr(v, "shape")}


def diff_against(ckpt: Checkpoint, model: nn.Module, key: str | None = None,
                 model_spec: str = "") -> dict[str, Any]:
    """The ``ckpt diff`` report: raw mismatch, and the prefix change that makes ``strict=True`` work."""
    mshapes = model_shapes(model)
    locs = find_state_dicts(ckpt.root, key)
    if not locs:
        raise DoctorError(f"{ckpt.path}: no state_dict found (no mapping of names to tensors); name it with --key")
    scored = []
    for loc in locs:
        shapes = _shapes(loc.node)
        fix, after = best_fix(shapes, mshapes)
        matched = len(mshapes) - len(after["missing"]) - len(after["shape_mismatches"])
        scored.append((matched, loc, shapes, fix, after))
    scored.sort(key=lambda s: -s[0])
    _, loc, shapes, fix, after = scored[0]
    raw = _compare(shapes, mshapes)
    rep: dict[str, Any] = {
        "path": str(ckpt.path), "format": ckpt.format, "model": model_spec, "location": loc.name,
        "checkpoint_keys": len(shapes), "model_keys": len(mshapes), "loads_as_is": raw["loads_strict"],
        "missing": raw["missing"], "unexpected": raw["unexpected"], "shape_mismatches": raw["shape_mismatches"],
        "fix": None,
    }
    if raw["loads_strict"]:
        rep.update(status="pass", summary=f"{loc.name} loads into the model with strict=True "
                                          f"({len(shapes)} keys)", remedy="")
    elif (fix.strip or fix.add) and after["loads_strict"]:
        rep["fix"] = {"strip_prefixes": list(fix.strip), "add_prefix": fix.add, "description": fix.describe(), "loads_strict_after": True}
        rep.update(status="fail", summary=f"{loc.name} does not load as is ({len(raw['missing'])} missing, "
                   f"{len(raw['unexpected'])} unexpected keys); it loads with strict=True after: {fix.describe()}",
                   remedy=_fix_remedy(ckpt.path, fix, rep["fix"]["strip_prefixes"]))
    else:
        if fix.strip or fix.add:
            rep["fix"] = {"strip_prefixes": list(fix.strip), "add_prefix": fix.add,
                          "description": fix.describe(), "loads_strict_after": False,
                          "remaining_missing": after["missing"], "remaining_unexpected": after["unexpected"],
                          "remaining_shape_mismatches": after["shape_mismatches"]}
        left = after if rep["fix"] else raw
        rep.update(status="fail", summary=(
            f"{loc.name} does not match the model: {len(left['missing'])} missing, {len(left['unexpected'])} "
            f"unexpected, {len(left['shape_mismatches'])} shape mismatches"
            + (f" (even after: {fix.describe()})" if rep["fix"] else "")),
            remedy="the checkpoint is for a different architecture or config; check the model factory's "
                   "arguments (sizes, num_classes) match the run that saved it")
    return rep


def _used_prefixes(shapes: dict[str, Any]) -> list[str]:
    used: list[str] = []
    for k in shapes:
        for p in _strip_one(k, KNOWN_PREFIXES)[1]:
            if p not in used:
                used.append(p)
    return used


def _fix_remedy(path: Path, fix: Fix, strip: list[str]) -> str:
    if strip and not fix.add:
        flags = " ".join(f"--prefix {p}" for p in strip)
        return (f"ddpdoctor ckpt strip {path} -o {_stripped_name(path)} {flags}   (or in Python: "
                f"ddpdoctor.load_checkpoint_into(model, {str(path)!r}))")
    if fix.add and not strip:
        return (f"the model is wrapped ({fix.add!r} prefix) but the checkpoint is not: load into the inner "
                f"model (model.module.load_state_dict(...)) or use ddpdoctor.load_checkpoint_into(model, "
                f"{str(path)!r})")
    return f"ddpdoctor.load_checkpoint_into(model, {str(path)!r}) applies: {fix.describe()}"


def render_diff(rep: dict[str, Any]) -> str:
    """The human-readable ``ckpt diff`` output."""
    lines = [f"checkpoint  {rep['path']}  state_dict {rep['location']}: {rep['checkpoint_keys']} keys",
             f"model       {rep['model']}: {rep['model_keys']} keys"]

    def some(items: list[Any]) -> str:
        shown = ", ".join(str(i) for i in items[:5])
        return shown + (f", ... ({len(items)} in all)" if len(items) > 5 else "")

    if rep["missing"]:
        lines.append(f"missing     {some(rep['missing'])}")
    if rep["unexpected"]:
        lines.append(f"unexpected  {some(rep['unexpected'])}")
    for m in rep["shape_mismatches"][:10]:
        lines.append(f"shape       {m['key']}: checkpoint {m['checkpoint_shape']} vs model {m['model_shape']}")
    if rep["fix"] and not rep["fix"]["loads_strict_after"]:
        for m in rep["fix"]["remaining_shape_mismatches"][:10]:
            lines.append(f"shape       {m['key']}: checkpoint {m['checkpoint_shape']} vs model {m['model_shape']} "
                         f"(after: {rep['fix']['description']})")
        lines.append(f"best rename {rep['fix']['description']} still leaves "
                     f"{len(rep['fix']['remaining_missing'])} missing, "
                     f"{len(rep['fix']['remaining_unexpected'])} unexpected, "
                     f"{len(rep['fix']['remaining_shape_mismatches'])} shape mismatches")
    lines.append(f"{rep['status'].upper():<5} {rep['summary']}")
    if rep["remedy"]:
        lines.append(f"      fix: {rep['remedy']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ load_into


@dataclass
class LoadReport:
    """What :func:`load_checkpoint_into` did."""

    path: str
    format: str
    location: str
    stripped_prefixes: list[str]
    added_prefix: str
    renamed_keys: int
    loaded_keys: int
    missing: list[str]
    unexpected: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def load_checkpoint_into(model: nn.Module, path: str | Path, *, key: str | None = None, strict: bool = True,
                         trust: bool = False) -> LoadReport:
    """Load a checkpoint's state_dict into ``model``, fixing ``module.``/``_orig_mod.`` prefixes either way.

    Finds the state_dict (or uses ``key``, e.g. ``"model"``), picks the rename that fits ``model`` best
    (strip wrapper prefixes, or add the model's own wrapper prefix), and calls
    ``model.load_state_dict(..., strict=strict)``. Loads with ``weights_only=True`` unless ``trust``; zip
    checkpoints are memory-mapped. Raises :class:`DoctorError` when the keys or shapes cannot be made to
    fit with ``strict=True``.
    """
    p = filecopy.check_input(path)
    fmt = detect_format(p)
    if fmt == FORMAT_SAFETENSORS:
        safetensors_file.open_safetensors(p)  # validate the header first: a clear error, not a Rust panic
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise DoctorError("loading .safetensors needs the safetensors package: "
                              "pip install 'ddpdoctor[safetensors]' (inspect and strip do not)") from None

        root: Any = load_file(str(p), device="cpu")
    else:
        root = _torch_load(p, trust=trust, mmap=fmt == FORMAT_ZIP)
    ckpt = Checkpoint(p, fmt, root, p.stat().st_size)
    rep = diff_against(ckpt, model, key)
    loc = next(loc for loc in find_state_dicts(root, key) if loc.name == rep["location"])
    fix = rep["fix"]
    strip = tuple(fix["strip_prefixes"]) if fix else ()
    add = fix["add_prefix"] if fix else ""
    if strict and not rep["loads_as_is"] and not (fix and fix["loads_strict_after"]):
        raise DoctorError(f"cannot load {p} into the model with strict=True: {rep['summary']}")
    fixed = loc.node  # loaded for this call only: renamed in place, _metadata included, as strip does
    renames, _ = plan_renames((str(k) for k, _ in mapping_pairs(fixed) or []), strip, add=add)
    _rename_node(fixed, renames, strip, add)
    result = model.load_state_dict(fixed, strict=strict)
    return LoadReport(str(p), fmt, loc.name, list(strip), add, len(renames),
                      len(fixed) - len(result.unexpected_keys), list(result.missing_keys),
                      list(result.unexpected_keys))
