"""Read a checkpoint's pickle without running it, and write it back after renaming keys.

``torch.load`` runs the pickle: every ``GLOBAL`` it names is imported and every ``REDUCE`` calls it, which is
how a malicious checkpoint runs code (https://pytorch.org/docs/stable/generated/torch.load.html, "Never load
data that could have come from an untrusted source"). Here the pickle is replayed into a *shadow* graph
instead: a ``GLOBAL`` becomes a :class:`Global` name (nothing imported), a ``REDUCE`` becomes a
:class:`Reduced` record (nothing called), a persistent id (a tensor's storage, ``data/N`` in the zip)
becomes a :class:`PidRef`. No tensor data is read. Globals outside ``torch.load(weights_only=True)``'s
allowlist are refused unless the caller trusts the file — the same rule PyTorch applies, with the same
allowlist (``torch._weights_only_unpickler._get_allowed_globals``).

:func:`dumps` writes the (edited) shadow graph back as a protocol-2 pickle using only the opcodes the
weights-only unpickler accepts, so the result loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import pickle
import struct

# Python-2 era names torch maps when it reads protocol-2 pickles (torch/_utils.py IMPORT_MAPPING).
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from collections.abc import Callable, Iterable
from typing import Any, ClassVar


class UnsafeGlobalError(Exception):
    """The pickle names a class or function that weights-only loading refuses."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class Global:
    """A ``GLOBAL module name`` reference, never imported."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    @property
    def full_name(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        return f"<{self.full_name}>"


class Reduced:
    """``func(*args)`` as the pickle asked for it, plus the items and state applied afterwards."""

    def __init__(self, func: Any, args: Any, newobj: bool = False, kwargs: Any = None) -> None:
        self.func = func
        self.args = args
        self.newobj = newobj
        self.kwargs = kwargs
        self.listitems: list[Any] = []
        self.dictitems: list[tuple[Any, Any]] = []
        self.states: list[Any] = []

    # The pure-Python unpickler applies APPEND(S)/SETITEM(S)/BUILD through these methods.
    def append(self, item: Any) -> None:
        self.listitems.append(item)

    def extend(self, items: Iterable[Any]) -> None:
        self.listitems.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.dictitems.append((key, value))

    def __setstate__(self, state: Any) -> None:
        self.states.append(state)

    @property
    def func_name(self) -> str:
        return self.func.full_name if isinstance(self.func, Global) else ""

    def __repr__(self) -> str:
        return f"<{self.func_name or 'call'}(...)>"


class PidRef:
    """A persistent id: for torch, ``('storage', StorageType, key, location, numel)``."""

    __slots__ = ("pid",)

    def __init__(self, pid: Any) -> None:
        self.pid = pid


# The globals a state_dict checkpoint uses, all on torch's weights-only allowlist
# (torch/_weights_only_unpickler.py _get_allowed_globals; a test keeps this a subset of it). Checking
# these without importing torch keeps `ckpt strip` at a few tens of MB and saves torch's import time.
STATIC_ALLOWED = frozenset({
    "collections.OrderedDict", "collections.Counter", "_codecs.encode", "builtins.bytearray", "builtins.set",
    "builtins.complex", "torch.Size", "torch.Tensor", "torch.device", "torch.nn.parameter.Parameter",
    "torch.serialization._get_layout", "torch._tensor._rebuild_from_type_v2",
    "torch.storage.UntypedStorage", "torch.storage.TypedStorage",
    *(f"torch._utils._rebuild_{n}" for n in (
        "tensor", "tensor_v2", "tensor_v3", "parameter", "parameter_with_state", "qtensor", "sparse_tensor",
        "meta_tensor_no_storage", "nested_tensor", "wrapper_subclass", "device_tensor_from_cpu_tensor")),
    *(f"torch.{n}Storage" for n in (
        "Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool", "ComplexFloat",
        "ComplexDouble", "QInt8", "QUInt8", "QInt32", "QUInt4x2", "QUInt2x4")),
    *(f"torch.{n}" for n in (
        "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
        "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")),
})


def is_allowed(name: str) -> bool:
    """Whether ``torch.load(weights_only=True)`` accepts this global (user ``add_safe_globals`` included)."""
    if name in STATIC_ALLOWED:
        return True
    from torch import _weights_only_unpickler as wo

    return name in wo._get_allowed_globals() or name in wo._get_user_allowed_globals()


class ShadowUnpickler(pickle._Unpickler):
    """The pure-Python unpickler with every code-running opcode replaced by a record of it."""

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)
    # Set by pickle._Unpickler.load(); declared for the type checker.
    stack: list[Any]
    append: Callable[[Any], None]
    read: Callable[[int], bytes]

    def __init__(self, data: bytes | io.BytesIO, allowed: Callable[[str], bool] | None) -> None:
        # A BytesIO is read up to this pickle's STOP only (protocol 2 has no framing), so several pickles
        # written one after another (the legacy torch format) are read by one unpickler each. Never a
        # file: a crafted length would make BufferedReader.read allocate that much up front.
        self._source = io.BytesIO(data) if isinstance(data, bytes) else data
        super().__init__(self._source, encoding="bytes")
        # None = trust the file: record every global without checking it.
        self.allowed = allowed
        self.globals_seen: list[str] = []
        self._globals: dict[tuple[str, str], Global] = {}

    def find_class(self, module: str, name: str) -> Global:
        mapped_module, mapped_name = NAME_MAPPING.get((module, name), (IMPORT_MAPPING.get(module, module), name))
        full = f"{mapped_module}.{mapped_name}"
        if full not in self.globals_seen:
            self.globals_seen.append(full)
        if self.allowed is not None and not self.allowed(full):
            raise UnsafeGlobalError(full)
        key = (module, name)
        if key not in self._globals:
            self._globals[key] = Global(module, name)
        return self._globals[key]

    def persistent_load(self, pid: Any) -> PidRef:
        return PidRef(pid)

    def _load_reduce(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = Reduced(self.stack[-1], args)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(Reduced(cls, args, newobj=True))

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(Reduced(cls, args, newobj=True, kwargs=kwargs))

    def _load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if not isinstance(inst, Reduced):
            raise pickle.UnpicklingError(f"BUILD on a {type(inst).__name__}")
        inst.states.append(state)

    def _load_bytearray8(self) -> None:
        # pickle's own handler allocates (and zero-fills) the announced length before reading: a crafted
        # 8-byte length would make this process allocate up to sys.maxsize bytes.
        (size,) = struct.unpack("<Q", self.read(8))
        data = self.read(size) if size <= self._remaining() else b""
        if len(data) != size:
            raise pickle.UnpicklingError(f"BYTEARRAY8 of {size} bytes runs past the end of the pickle")
        self.append(bytearray(data))

    def _remaining(self) -> int:
        buf = self._source
        return len(buf.getbuffer()) - buf.tell()

    def _load_unsupported(self) -> None:
        raise pickle.UnpicklingError("protocol-0 object instantiation (INST/OBJ) is not supported")

    dispatch[pickle.REDUCE[0]] = _load_reduce
    dispatch[pickle.NEWOBJ[0]] = _load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = _load_newobj_ex
    dispatch[pickle.BUILD[0]] = _load_build
    dispatch[pickle.BYTEARRAY8[0]] = _load_bytearray8
    dispatch[pickle.INST[0]] = _load_unsupported
    dispatch[pickle.OBJ[0]] = _load_unsupported


def loads(data: bytes, *, trust: bool = False) -> tuple[Any, list[str]]:
    """The shadow graph of ``data`` and every global it names (in order of first use).

    Raises :class:`UnsafeGlobalError` for a global outside the weights-only allowlist unless ``trust``;
    ``pickle.UnpicklingError`` (or EOFError, ValueError...) for a damaged pickle.
    """
    unpickler = ShadowUnpickler(data, None if trust else is_allowed)
    obj = unpickler.load()
    return obj, unpickler.globals_seen


class _Writer:
    """A protocol-2 pickle writer for shadow graphs, limited to what the weights-only unpickler reads."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.memo: dict[int, int] = {}
        # Keep memoised objects alive so their id() stays unique while writing.
        self.keep: list[Any] = []
        self.globals: dict[tuple[str, str], int] = {}
        # Strings are memoised by value, as pickle does: 'storage' and 'cpu' repeat once per tensor.
        self.strings: dict[str, int] = {}

    def w(self, data: bytes) -> None:
        self.out.write(data)

    def _next(self) -> int:
        return len(self.memo) + len(self.globals) + len(self.strings)

    def put(self, obj: Any) -> None:
        idx = self._next()
        self.memo[id(obj)] = idx
        self.keep.append(obj)
        self._put_index(idx)

    def _put_index(self, idx: int) -> None:
        if idx < 256:
            self.w(pickle.BINPUT + bytes([idx]))
        else:
            self.w(pickle.LONG_BINPUT + struct.pack("<I", idx))

    def get(self, idx: int) -> None:
        if idx < 256:
            self.w(pickle.BINGET + bytes([idx]))
        else:
            self.w(pickle.LONG_BINGET + struct.pack("<I", idx))

    def save(self, obj: Any) -> None:
        if obj is None:
            self.w(pickle.NONE)
        elif obj is True:
            self.w(pickle.NEWTRUE)
        elif obj is False:
            self.w(pickle.NEWFALSE)
        elif type(obj) is int:
            self.save_int(obj)
        elif type(obj) is float:
            self.w(pickle.BINFLOAT + struct.pack(">d", obj))
        elif type(obj) is str:
            self.save_str(obj)
        elif isinstance(obj, Global):
            self.save_global(obj)
        elif id(obj) in self.memo:
            self.get(self.memo[id(obj)])
        elif type(obj) is tuple:
            self.save_tuple(obj)
        elif type(obj) is list:
            self.w(pickle.EMPTY_LIST)
            self.put(obj)
            self.save_items(obj, pickle.APPENDS)
        elif type(obj) is dict:
            self.w(pickle.EMPTY_DICT)
            self.put(obj)
            self.save_pairs(list(obj.items()))
        elif isinstance(obj, Reduced):
            self.save_reduced(obj)
        elif isinstance(obj, PidRef):
            self.save(obj.pid)
            self.w(pickle.BINPERSID)
        elif type(obj) in (bytes, bytearray):
            # Protocol 2 spells bytes as _codecs.encode(latin-1 text), which weights_only accepts.
            enc = Reduced(Global("_codecs", "encode"), (bytes(obj).decode("latin-1"), "latin1"))
            if type(obj) is bytearray:
                enc = Reduced(Global("builtins", "bytearray"), (enc,))
            self.save_reduced(enc)
        elif type(obj) in (set, frozenset):
            self.save_reduced(Reduced(Global("builtins", type(obj).__name__), (list(obj),)))
        elif type(obj) is complex:
            self.save_reduced(Reduced(Global("builtins", "complex"), (obj.real, obj.imag)))
        else:
            raise pickle.PicklingError(f"cannot re-write a {type(obj).__name__} from a checkpoint pickle")

    def save_int(self, value: int) -> None:
        if 0 <= value < 256:
            self.w(pickle.BININT1 + bytes([value]))
        elif 0 <= value < 65536:
            self.w(pickle.BININT2 + struct.pack("<H", value))
        elif -(2**31) <= value < 2**31:
            self.w(pickle.BININT + struct.pack("<i", value))
        else:
            raw = pickle.encode_long(value)
            self.w(pickle.LONG1 + bytes([len(raw)]) + raw)

    def save_str(self, text: str) -> None:
        if text in self.strings:
            self.get(self.strings[text])
            return
        raw = text.encode("utf-8", "surrogatepass")
        self.w(pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw)
        idx = self._next()
        self.strings[text] = idx
        self._put_index(idx)

    def save_global(self, glob: Global) -> None:
        key = (glob.module, glob.name)
        if key in self.globals:
            self.get(self.globals[key])
            return
        self.w(pickle.GLOBAL + f"{glob.module}\n{glob.name}\n".encode())
        idx = self._next()
        self.globals[key] = idx
        self._put_index(idx)

    def save_tuple(self, obj: tuple[Any, ...]) -> None:
        if not obj:
            self.w(pickle.EMPTY_TUPLE)
            return
        if len(obj) <= 3:
            for item in obj:
                self.save(item)
            self.w({1: pickle.TUPLE1, 2: pickle.TUPLE2, 3: pickle.TUPLE3}[len(obj)])
        else:
            self.w(pickle.MARK)
            for item in obj:
                self.save(item)
            self.w(pickle.TUPLE)
        self.put(obj)

    def save_items(self, items: list[Any], opcode: bytes) -> None:
        for start in range(0, len(items), 1000):
            self.w(pickle.MARK)
            for item in items[start:start + 1000]:
                self.save(item)
            self.w(opcode)

    def save_pairs(self, pairs: list[tuple[Any, Any]]) -> None:
        for start in range(0, len(pairs), 1000):
            self.w(pickle.MARK)
            for key, value in pairs[start:start + 1000]:
                self.save(key)
                self.save(value)
            self.w(pickle.SETITEMS)

    def save_reduced(self, obj: Reduced) -> None:
        self.save(obj.func)
        if obj.newobj and obj.kwargs:
            raise pickle.PicklingError("NEWOBJ_EX (keyword arguments) cannot be written as protocol 2")
        self.save(obj.args)
        self.w(pickle.NEWOBJ if obj.newobj else pickle.REDUCE)
        self.put(obj)
        if obj.listitems:
            self.save_items(obj.listitems, pickle.APPENDS)
        if obj.dictitems:
            self.save_pairs(obj.dictitems)
        for state in obj.states:
            self.save(state)
            self.w(pickle.BUILD)


def dumps(obj: Any) -> bytes:
    """A protocol-2 pickle of a shadow graph (what ``torch.save`` writes as ``data.pkl``)."""
    writer = _Writer()
    writer.w(pickle.PROTO + b"\x02")
    writer.save(obj)
    writer.w(pickle.STOP)
    return writer.out.getvalue()


def walk(obj: Any, visit: Callable[[Any], bool], _seen: set[int] | None = None) -> None:
    """Call ``visit`` on every node once (depth first); ``visit`` returns False to skip the children."""
    seen = _seen if _seen is not None else set()
    stack = [obj]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if not visit(node):
            continue
        if isinstance(node, (list, tuple, set, frozenset)):
            stack.extend(node)
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, Reduced):
            stack.extend([node.func, node.args, *node.listitems, *node.states])
            for key, value in node.dictitems:
                stack.extend([key, value])
