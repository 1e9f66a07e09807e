"""Finding the state_dicts in a checkpoint's object tree, and what each tensor is, without its data.

A checkpoint is rarely just a state_dict: ``{"model": ..., "optimizer": ..., "epoch": 3}``, Lightning's
``{"state_dict": ...}``, an EMA copy beside the model. This module walks the tree (shadow nodes from the
safe unpickler, real objects from ``torch.load``, or safetensors entries alike), tells tensors from other
values by the rebuild functions torch pickles them with, and returns every mapping of names to tensors
within three levels, or the one the user named with ``--key a/b``. Optimizer state keyed by parameter
name is recognised as such and never taken for model weights.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ddpdoctor.ckpt.model import StateDictLoc, TensorMeta, key_text
from ddpdoctor.ckpt.unpickler import Global, PidRef, Reduced
from ddpdoctor.errors import DoctorError

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
    return dtype, str(_text(key)), numel * size if _is_count(numel) else 0


def storage_record(pid: Any) -> tuple[str, int | None] | None:
    """The zip record a torch persistent id names (``"data/<key>"``) and the bytes torch expects there.

    None when ``pid`` is not a storage reference. The size is None when the storage class is not one of
    :data:`STORAGE_DTYPES` (nothing is imported to find out) or its element count is not an int64.
    """
    if not (isinstance(pid, tuple) and len(pid) in (5, 6) and _text(pid[0]) == "storage"):
        return None
    storage_type, key, numel = pid[1], pid[2], pid[4]
    name = storage_type.name if isinstance(storage_type, Global) else ""
    size = numel * STORAGE_DTYPES[name][1] if name in STORAGE_DTYPES and _is_count(numel) else None
    return f"data/{_text(key)}", size


def _shape(value: Any) -> tuple[int, ...] | None:
    """A shape from a pickled size tuple; None if it is not plain integers."""
    if isinstance(value, (tuple, list)) and all(_is_count(d) for d in value):
        return tuple(value)
    return None


# torch sizes, strides and element counts are int64: anything else in a pickle is damage (or an attack
# whose products would overflow float conversions further on).
_INT64_MAX = (1 << 63) - 1


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _INT64_MAX


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
    # A crafted pickle can share one mapping under many keys at every level (memo references): walked path
    # by path that is n^3 mappings of n entries. Each node is judged once, and a mapping is searched again
    # only when reached at a smaller depth than before (at most _MAX_DEPTH + 1 times).
    judged: dict[int, bool] = {}
    searched_at: dict[int, int] = {}
    reported: set[int] = set()
    keep: list[Any] = []  # nodes judged stay alive, so their ids stay theirs

    def is_state_dict(node: Any) -> bool:
        i = id(node)
        if i not in judged:
            keep.append(node)
            judged[i] = _state_dict_pairs(node) is not None
        return judged[i]

    def visit(node: Any, path: tuple[str, ...]) -> None:
        if is_state_dict(node):
            if id(node) not in reported:  # one object saved under two names is one state_dict
                reported.add(id(node))
                found.append(StateDictLoc(path, node))
            return
        if searched_at.get(id(node), _MAX_DEPTH + 1) <= len(path):
            return
        pairs = mapping_pairs(node)
        # Mappings with non-string keys (optimizer "state": {0: {...}}) hold no model weights.
        if pairs is None or len(path) >= _MAX_DEPTH or not all(isinstance(k, str) for k, _ in pairs):
            return
        searched_at[id(node)] = len(path)
        # An optimizer state_dict keyed by parameter name (FSDP.optim_state_dict, DCP's get_state_dict)
        # holds {"exp_avg": tensor, "step": tensor} per parameter: optimizer state, not model weights.
        if is_optimizer_state(pairs):
            return
        for k, v in pairs:
            visit(v, (*path, k))

    visit(root, ())
    return found


def is_optimizer_state(pairs: list[tuple[Any, Any]]) -> bool:
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
            keys = ", ".join(key_text(k) for k, _ in pairs[:12])
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




def state_dict_shapes(node: Any) -> dict[str, Any]:
    """Key -> shape (None when unknown) of every tensor in a state_dict node."""
    out = {}
    for k, v in mapping_pairs(node) or []:
        meta = tensor_meta(v)
        if isinstance(k, str) and meta is not None:
            out[k] = meta.shape
    return out
