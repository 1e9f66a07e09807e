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

from ddpdoctor.errors import DoctorError

# Limits on what a pickle may build (see docs/ckpt.md, "Limits"). A real state_dict of a 70B-parameter model
# is ~10^4-10^6 objects, a few levels deep, with integers of at most 64 bits: these are far above that and
# far below what makes reading it (or hashing, printing, rewriting what it built) take long.
MAX_OBJECTS = 20_000_000
# The size of the object tree once every shared (memoised) reference is expanded: a BINGET of a tuple of a
# million leaves costs a million here, as hashing or printing it would. 39 five-byte steps of
# ``t = (t, t)`` describe 2^39 leaves: refused at the 26th.
MAX_EXPANDED = 50_000_000
# Our writer and torch.save recurse once or a few times per level (Python's limit: 1000 frames).
MAX_DEPTH = 200
# LONG4 can announce a 2 GiB integer; torch writes 64-bit ones. 256 bytes keep str() of any product of a few
# of them far below Python's 4300-digit limit.
MAX_INT_BYTES = 256


class PickleLimitError(pickle.UnpicklingError):
    """The pickle goes beyond one of the limits above: refused before anything expensive happens."""


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


# The pure-Python unpickler's handlers, which the limit-keeping ones below call.
_BASE: dict[int, Callable[[Any], None]] = dict(pickle._Unpickler.dispatch)


class ShadowUnpickler(pickle._Unpickler):
    """The pure-Python unpickler with every code-running opcode replaced by a record of it."""

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)
    # Set by pickle._Unpickler.load(); declared for the type checker.
    stack: list[Any]
    metastack: list[list[Any]]
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
        # Expanded size and depth of every container built so far, by id; the containers are kept alive so
        # an id is never reused while this unpickler lives.
        self._size: dict[int, int] = {}
        self._depth: dict[int, int] = {}
        self._keep: list[Any] = []
        self._expanded = 0
        # Containers put back on the stack by GET/DUP: growing one after that would make the sizes recorded
        # for its parents too small, so the finished graph is measured again (see _check_final).
        self._shared: set[int] = set()
        self._grew_shared = False

    def load(self) -> Any:
        obj = super().load()
        if self._grew_shared:
            self._check_final(obj)
        return obj

    # --- limits -------------------------------------------------------------------------------------------

    def _measure(self, items: Iterable[Any]) -> tuple[int, int]:
        size, depth = 0, 0
        sizes, depths = self._size, self._depth
        for item in items:
            i = id(item)
            size += sizes.get(i, 1)
            d = depths.get(i, 1)
            if d > depth:
                depth = d
        return size, depth

    def _made(self, obj: Any, items: Iterable[Any]) -> None:
        """Record a new container built from ``items`` (already on the stack, so already counted)."""
        size, depth = self._measure(items)
        self._record(obj, size + 1, depth + 1)

    def _record(self, obj: Any, size: int, depth: int) -> None:
        i = id(obj)
        if i not in self._size:
            self._keep.append(obj)
            if len(self._keep) > MAX_OBJECTS:
                raise PickleLimitError(f"the pickle holds more than {MAX_OBJECTS:,} objects; refusing to read it")
        self._size[i] = size
        self._depth[i] = depth
        if size > MAX_EXPANDED:
            raise _expanded_error()
        if depth > MAX_DEPTH:
            raise _depth_error()

    def _grew(self, obj: Any, items: Iterable[Any]) -> None:
        """``obj`` (a list, dict, set or shadow record) received ``items``."""
        size, depth = self._measure(items)
        i = id(obj)
        self._record(obj, self._size.get(i, 1) + size, max(self._depth.get(i, 1), depth + 1))
        if i in self._shared:
            self._grew_shared = True

    def _check_final(self, root: Any) -> None:
        """Measure the finished graph (each node once, iteratively): a container grown after it was shared."""
        size: dict[int, int] = {}
        depth: dict[int, int] = {}
        on_path: set[int] = set()
        todo: list[tuple[Any, bool]] = [(root, False)]
        while todo:
            node, done = todo.pop()
            kids = _children(node)
            if kids is None:
                continue
            i = id(node)
            if done:
                on_path.discard(i)
                s, d = 1, 1
                for kid in kids:  # a kid still on the path is a cycle: counted once, as a leaf
                    s += size.get(id(kid), 1)
                    d = max(d, depth.get(id(kid), 1) + 1)
                if s > MAX_EXPANDED:
                    raise _expanded_error()
                if d > MAX_DEPTH:
                    raise _depth_error()
                size[i], depth[i] = s, d
            elif i not in size and i not in on_path:
                on_path.add(i)
                todo.append((node, True))
                todo.extend((kid, False) for kid in kids)

    def _shared_ref(self) -> None:
        """A memo reference (or DUP) on top of the stack costs the size it expands to."""
        obj = self.stack[-1]
        i = id(obj)
        n = self._size.get(i, 1)
        if n > 1 or isinstance(obj, (list, dict, set, Reduced)):  # an empty list may still grow
            self._shared.add(i)
        self._expanded += n
        if self._expanded > MAX_EXPANDED:
            raise _expanded_error()

    def _load_get(self) -> None:
        _BASE[pickle.GET[0]](self)
        self._shared_ref()

    def _load_binget(self) -> None:
        _BASE[pickle.BINGET[0]](self)
        self._shared_ref()

    def _load_long_binget(self) -> None:
        _BASE[pickle.LONG_BINGET[0]](self)
        self._shared_ref()

    def _load_dup(self) -> None:
        _BASE[pickle.DUP[0]](self)
        self._shared_ref()

    def _load_long4(self) -> None:
        (n,) = struct.unpack("<i", self.read(4))
        if n < 0 or n > MAX_INT_BYTES:
            raise PickleLimitError(f"the pickle holds an integer of {n:,} bytes (a checkpoint's integers take "
                                   f"at most 8; the limit is {MAX_INT_BYTES}); refusing to read it")
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("LONG4 runs past the end of the pickle")
        self.append(pickle.decode_long(data))

    def _made_top(self) -> None:
        obj = self.stack[-1]
        self._made(obj, obj)

    def _load_tuple(self) -> None:
        _BASE[pickle.TUPLE[0]](self)
        self._made_top()

    def _load_tuple1(self) -> None:
        _BASE[pickle.TUPLE1[0]](self)
        self._made_top()

    def _load_tuple2(self) -> None:
        _BASE[pickle.TUPLE2[0]](self)
        self._made_top()

    def _load_tuple3(self) -> None:
        _BASE[pickle.TUPLE3[0]](self)
        self._made_top()

    def _load_list(self) -> None:
        _BASE[pickle.LIST[0]](self)
        self._made_top()

    def _load_frozenset(self) -> None:
        items = list(self.stack)
        self._check_hashable(items)
        _BASE[pickle.FROZENSET[0]](self)
        self._made(self.stack[-1], items)

    def _load_dict(self) -> None:
        items = list(self.stack)
        self._check_hashable(items[0::2])
        _BASE[pickle.DICT[0]](self)
        self._made(self.stack[-1], items)

    def _check_hashable(self, keys: list[Any]) -> None:
        """Hashing a key walks all of it in C: tuples over the limit never get here (refused when built)."""
        for key in keys:
            if isinstance(key, (list, dict, set, bytearray)):
                raise pickle.UnpicklingError(f"a {type(key).__name__} used as a dict key or set item")

    def _load_append(self) -> None:
        value, target = self.stack[-1], self.stack[-2]
        _BASE[pickle.APPEND[0]](self)
        self._grew(target, (value,))

    def _load_appends(self) -> None:
        items, target = self.stack, self.metastack[-1][-1] if self.metastack and self.metastack[-1] else None
        _BASE[pickle.APPENDS[0]](self)
        self._grew(target, items)

    def _load_setitem(self) -> None:
        target, key, value = self.stack[-3], self.stack[-2], self.stack[-1]
        if not isinstance(target, Reduced):
            self._check_hashable([key])
        _BASE[pickle.SETITEM[0]](self)
        self._grew(target, (key, value))

    def _load_setitems(self) -> None:
        items, target = self.stack, self.metastack[-1][-1] if self.metastack and self.metastack[-1] else None
        if not isinstance(target, Reduced):
            self._check_hashable(items[0::2])
        _BASE[pickle.SETITEMS[0]](self)
        self._grew(target, items)

    def _load_additems(self) -> None:
        items, target = self.stack, self.metastack[-1][-1] if self.metastack and self.metastack[-1] else None
        self._check_hashable(items)
        _BASE[pickle.ADDITEMS[0]](self)
        self._grew(target, items)

    def _load_binpersid(self) -> None:
        pid = self.stack[-1]
        _BASE[pickle.BINPERSID[0]](self)
        self._made(self.stack[-1], (pid,))

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
        func = self.stack[-1]
        self.stack[-1] = Reduced(func, args)
        self._made(self.stack[-1], (func, args))

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(Reduced(cls, args, newobj=True))
        self._made(self.stack[-1], (cls, args))

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(Reduced(cls, args, newobj=True, kwargs=kwargs))
        self._made(self.stack[-1], (cls, args, kwargs))

    def _load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if not isinstance(inst, Reduced):
            raise pickle.UnpicklingError(f"BUILD on a {type(inst).__name__}")
        inst.states.append(state)
        self._grew(inst, (state,))

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
    dispatch[pickle.GET[0]] = _load_get
    dispatch[pickle.BINGET[0]] = _load_binget
    dispatch[pickle.LONG_BINGET[0]] = _load_long_binget
    dispatch[pickle.DUP[0]] = _load_dup
    dispatch[pickle.LONG4[0]] = _load_long4
    dispatch[pickle.TUPLE[0]] = _load_tuple
    dispatch[pickle.TUPLE1[0]] = _load_tuple1
    dispatch[pickle.TUPLE2[0]] = _load_tuple2
    dispatch[pickle.TUPLE3[0]] = _load_tuple3
    dispatch[pickle.LIST[0]] = _load_list
    dispatch[pickle.DICT[0]] = _load_dict
    dispatch[pickle.FROZENSET[0]] = _load_frozenset
    dispatch[pickle.APPEND[0]] = _load_append
    dispatch[pickle.APPENDS[0]] = _load_appends
    dispatch[pickle.SETITEM[0]] = _load_setitem
    dispatch[pickle.SETITEMS[0]] = _load_setitems
    dispatch[pickle.ADDITEMS[0]] = _load_additems
    dispatch[pickle.BINPERSID[0]] = _load_binpersid


def _expanded_error() -> PickleLimitError:
    return PickleLimitError(f"the pickle expands to more than {MAX_EXPANDED:,} objects (shared references); "
                            "refusing to read it")


def _depth_error() -> PickleLimitError:
    return PickleLimitError(f"the pickle nests objects more than {MAX_DEPTH} levels deep; refusing to read it")


def _children(node: Any) -> Iterable[Any] | None:
    """The objects a node refers to (None for a leaf), as :func:`walk` visits them."""
    if isinstance(node, (list, tuple, set, frozenset)):
        return node
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    if isinstance(node, Reduced):
        return [node.func, node.args, node.kwargs, *node.listitems, *(x for kv in node.dictitems for x in kv),
                *node.states]
    if isinstance(node, PidRef):
        return (node.pid,)
    return None


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
            # LONG1 holds at most 255 bytes; LONG4 (2^2039 and up) is not among the opcodes
            # torch.load(weights_only=True) reads ("Unsupported operand 139"): refuse rather than write it.
            if len(raw) > 255:
                raise pickle.PicklingError(f"an integer of {len(raw)} bytes cannot be written in a form "
                                           "torch.load(weights_only=True) reads (LONG1 holds 255 bytes)")
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


def dumps_or_refuse(obj: Any, what: object) -> bytes:
    """:func:`dumps`, with what it cannot write as one line naming ``what`` (the checkpoint), exit 2."""
    try:
        return dumps(obj)
    except RecursionError:
        raise DoctorError(f"{what}: its pickle nests objects too deeply to rewrite") from None
    except pickle.PicklingError as exc:
        raise DoctorError(f"{what}: cannot rewrite its pickle: {exc}") from None


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
