"""Read a CPython 3.11-3.13 process's Python stacks straight from its memory, without py-spy.

Why: ``py-spy dump`` spends ~10 ms of CPU per process, nearly all of it loading the interpreter binary's
whole symbol table into a hash map. Eight ranks of one job share that binary, so ``ddpdoctor stacks``
looks up the few symbols it needs once per binary and then reads each rank's thread states and frames
through ``/proc/PID/mem`` (the same ptrace permission py-spy needs), about 1 ms per rank.

How (the layouts py-spy also follows, here for 64-bit Linux builds without Py_TRACE_REFS or free
threading): ``_PyRuntime.interpreters.head`` -> each interpreter's ``threads.head`` -> each thread's
current ``_PyInterpreterFrame`` -> ``previous``...; each frame's code object gives file, qualified name
and, from ``co_linetable`` (Objects/locations.md), the line of the instruction the frame is at. The
offsets for 3.11 and 3.12 come from ``offsetof`` against each version's own headers
(``Include/internal``); 3.13 states its own at the start of ``_PyRuntime`` (``_Py_DebugOffsets``).

Every object read is checked against the interpreter's own type objects (``PyCode_Type``,
``PyUnicode_Type``, ``PyBytes_Type``), so a build whose layout differs raises :class:`Unreadable` instead
of producing a wrong stack; the caller then asks py-spy. The process is not paused (as ``py-spy dump
--nonblocking``): a hung rank's stack does not move, and the stacks are read until two reads in a row
agree, so the moving stack of a rank that still computes is not taken for one (after four reads py-spy,
which pauses the process, takes over). Thread names other than the main thread's need the
``threading`` module's dicts and are left to py-spy (``--all-threads``).
"""

from __future__ import annotations

import os
import struct

from ddpdoctor.stacks.procfs import namespace_pid
from ddpdoctor.stacks.record import FrozenRecord
from ddpdoctor.stacks.report import Frame, ThreadStack

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: `ddpdoctor stacks` must start fast (see stacks_cli)
if TYPE_CHECKING:
    from typing import BinaryIO

_MAX_THREADS = 4096
_MAX_DEPTH = 100_000  # far deeper than any recursion limit in use: a longer chain is garbage from a torn read
_READ_ATTEMPTS = 4  # up to 4 reads to get two equal ones in a row


class Unreadable(Exception):
    """This process's stacks cannot be read here (version, layout, permission): use py-spy instead.

    ``denied`` is set when the kernel refused access (ptrace rights), which py-spy would meet too."""

    def __init__(self, message: str, denied: bool = False) -> None:
        super().__init__(message)
        self.denied = denied


class Layout(FrozenRecord):
    """Byte offsets of the fields the walk reads, for one CPython minor version (64-bit Linux)."""

    runtime_interpreters_head: int
    interp_next: int
    interp_threads_head: int
    thread_next: int
    thread_id: int
    native_thread_id: int
    thread_frame: int  # PyThreadState.cframe (3.11/3.12, then _PyCFrame.current_frame) or .current_frame
    cframe_current_frame: int | None
    frame_code: int
    frame_previous: int
    frame_instr: int  # prev_instr (3.11/3.12) or instr_ptr (3.13): the instruction the frame is at
    frame_owner: int
    code_filename: int
    code_qualname: int
    code_linetable: int
    code_firstlineno: int
    code_code_adaptive: int
    ascii_size: int  # sizeof(PyASCIIObject): where a compact ASCII string's characters start
    compact_size: int  # sizeof(PyCompactUnicodeObject): the same for other compact strings

    __slots__ = tuple(__annotations__)  # the fields above, each listed once

    def __init__(self, **offsets: int | None) -> None:
        for name in self.__slots__:
            setattr(self, name, offsets.pop(name))
        if offsets:
            raise TypeError(f"unknown Layout fields {sorted(offsets)}")


# offsetof() values printed by a C program compiled against each version's headers (Py_BUILD_CORE). 3.13
# publishes its own offsets at the start of _PyRuntime (see :func:`_layout_from_debug_offsets`).
_COMMON = {"interp_next": 0, "thread_next": 8, "frame_instr": 56, "code_filename": 112, "code_qualname": 128,
           "code_linetable": 136}
LAYOUTS = {
    (3, 11): Layout(**_COMMON, runtime_interpreters_head=40, interp_threads_head=16, thread_id=152,
                    native_thread_id=160, thread_frame=56, cframe_current_frame=8, frame_code=32,
                    frame_previous=48, frame_owner=69, code_firstlineno=72, code_code_adaptive=184,
                    ascii_size=48, compact_size=72),
    (3, 12): Layout(**_COMMON, runtime_interpreters_head=40, interp_threads_head=72, thread_id=136,
                    native_thread_id=144, thread_frame=56, cframe_current_frame=0, frame_code=0,
                    frame_previous=8, frame_owner=70, code_firstlineno=68, code_code_adaptive=192,
                    ascii_size=40, compact_size=56),
}
_FRAME_OWNED_BY_GENERATOR = 1
_FRAME_OWNED_BY_CSTACK = 3  # 3.12+: the shim frame at the bottom of each C-to-Python entry
_OB_TYPE = 8
_OB_SIZE = 16
_BYTES_DATA = 32
_STR_LENGTH = 16
_STR_STATE = 32

_SYMBOLS = (b"_PyRuntime", b"Py_Version", b"PyCode_Type", b"PyUnicode_Type", b"PyBytes_Type")


class _Binary:
    """An ELF file's symbols we need (addresses relative to its load base) and its lowest PT_LOAD vaddr."""

    def __init__(self, symbols: dict[bytes, int], first_vaddr: int) -> None:
        self.symbols = symbols
        self.first_vaddr = first_vaddr


_binary_cache: dict[tuple[int, int, int], _Binary | None] = {}


def _elf_symbols(path: str) -> _Binary | None:
    """Look up :data:`_SYMBOLS` in ``path``'s ``.dynsym`` (what ``-export-dynamic`` and shared libpython
    export); None when the file is not a 64-bit little-endian ELF or exports none of them."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        if key in _binary_cache:
            return _binary_cache[key]
        result = None
        head = f.read(64)
        if len(head) == 64 and head[:4] == b"\x7fELF" and head[4] == 2 and head[5] == 1:
            result = _parse_elf(f, head)
        _binary_cache[key] = result
        return result


def _parse_elf(f: BinaryIO, head: bytes) -> _Binary | None:
    phoff, shoff = struct.unpack_from("<QQ", head, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
    f.seek(phoff)
    programs = f.read(phentsize * phnum)
    loads = [struct.unpack_from("<IIQQ", programs, i * phentsize) for i in range(phnum)]
    vaddrs = [vaddr for p_type, _flags, _off, vaddr in loads if p_type == 1]  # PT_LOAD
    f.seek(shoff)
    sections = f.read(shentsize * shnum)
    headers = [struct.unpack_from("<IIQQQQIIQQ", sections, i * shentsize) for i in range(shnum)]
    dynsym = next((h for h in headers if h[1] == 11), None)  # SHT_DYNSYM
    if dynsym is None or not vaddrs or dynsym[6] >= len(headers):
        return None
    strtab = headers[dynsym[6]]
    f.seek(strtab[4])
    names = f.read(strtab[5])
    f.seek(dynsym[4])
    table = f.read(dynsym[5])
    wanted = {}
    for name in _SYMBOLS:
        at = names.find(b"\0" + name + b"\0")
        if at >= 0:
            wanted[at + 1] = name
    found: dict[bytes, int] = {}
    for st_name, _info, _other, shndx, value, _size in struct.iter_unpack("<IBBHQQ", table):
        if st_name in wanted and shndx != 0 and value:
            found[wanted[st_name]] = value
    if b"_PyRuntime" not in found:
        return None
    return _Binary(found, min(vaddrs))


def _interpreters(pid: int) -> list[dict[bytes, int]]:
    """The absolute addresses of :data:`_SYMBOLS` in each mapped file of ``pid`` that holds a
    ``_PyRuntime``: the executable (a static python) first, then each libpython (a process can map more
    than one, e.g. through ctypes; only one of them runs)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError as exc:
        raise Unreadable(f"cannot read /proc/{pid}/maps: {exc.strerror or exc}",
                         denied=isinstance(exc, PermissionError)) from exc
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    first_page: dict[str, tuple[int, str]] = {}  # path -> (start address, maps range) of its offset-0 mapping
    for line in maps.splitlines():
        if "libpython3." not in line and not (exe and exe in line):  # a torch rank maps hundreds of files
            continue
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and parts[5] not in first_page and int(parts[2], 16) == 0:
            start, end = (int(bound, 16) for bound in parts[0].split("-", 1))
            first_page[parts[5]] = (start, f"{start:x}-{end:x}")  # map_files names carry no zero padding
    deleted = " (deleted)"
    candidates = [p for p in first_page if p == exe] + [
        p for p in first_page if p != exe and p.removesuffix(deleted).rsplit("/", 1)[-1].startswith("libpython3.")]
    found = []
    for path in candidates:
        start, address_range = first_page[path]
        # A file replaced on disk since the process started is read through map_files (needs root); the
        # others through /proc/PID/root, so that a process in another mount namespace is read from its files.
        source = f"/proc/{pid}/map_files/{address_range}" if path.endswith(deleted) else f"/proc/{pid}/root{path}"
        try:
            binary = _elf_symbols(source)
        except OSError as exc:
            if path.endswith(deleted):
                raise Unreadable(f"{path.removesuffix(deleted)} was replaced on disk after the process started; "
                                 f"reading it from /proc/PID/map_files needs root ({exc.strerror or exc})") from exc
            continue
        if binary is not None:
            load_bias = start - (binary.first_vaddr & ~0xFFF)
            found.append({name: load_bias + value for name, value in binary.symbols.items()})
    if not found:
        raise Unreadable("no CPython interpreter (_PyRuntime) among the mapped files")
    return found


class _Memory:
    """Reads of one process's memory through /proc/PID/mem, with the type checks every object gets."""

    def __init__(self, pid: int, fd: int, symbols: dict[bytes, int], main_thread_id: int) -> None:
        self.pid = pid
        self.fd = fd
        self.symbols = symbols
        self.main_thread_id = main_thread_id
        self.code_cache: dict[int, _Code] = {}
        self.str_cache: dict[int, str] = {}
        self.line_cache: dict[tuple[int, int], int] = {}  # (code object, code unit) -> line

    def forget(self) -> None:
        """Drop what was learnt about objects: after a read that disagreed, an address may hold another."""
        self.code_cache.clear()
        self.str_cache.clear()
        self.line_cache.clear()

    def read(self, address: int, size: int) -> bytes:
        if address <= 0 or address >= 1 << 63:
            raise Unreadable(f"bad pointer {address:#x}")
        try:
            data = os.pread(self.fd, size, address)
        except OSError as exc:
            raise Unreadable(f"cannot read pid {self.pid} at {address:#x}: {exc.strerror or exc}") from exc
        if len(data) != size:
            raise Unreadable(f"short read at {address:#x}")
        return data

    def pointer(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")

    def check_type(self, address: int, type_symbol: bytes) -> None:
        if self.pointer(address + _OB_TYPE) != self.symbols[type_symbol]:
            raise Unreadable(f"object at {address:#x} is not a {type_symbol.decode()} (layout or torn read)")


def _version(mem: _Memory) -> tuple[int, int]:
    hexversion = int.from_bytes(mem.read(mem.symbols[b"Py_Version"], 4), "little")
    return hexversion >> 24, (hexversion >> 16) & 0xFF


# Where each offset we use sits in 3.13's _Py_DebugOffsets (Include/internal/pycore_runtime.h), counted in
# uint64 fields: cookie, version, free_threaded, then runtime_state{size, finalizing, interpreters_head},
# interpreter_state{size, id, next, threads_head, ...}, and so on. The struct is stable within 3.13.x.
_DEBUG_FIELDS_313 = {"runtime_interpreters_head": 5, "interp_next": 8, "interp_threads_head": 9,
                     "thread_next": 21, "thread_frame": 23, "thread_id": 24, "native_thread_id": 25,
                     "frame_previous": 29, "frame_code": 30, "frame_instr": 31, "frame_owner": 33,
                     "code_filename": 35, "code_qualname": 37, "code_linetable": 38, "code_firstlineno": 39,
                     "code_code_adaptive": 43, "ascii_size": 70}
_DEBUG_CHECKS_313 = {45: _OB_TYPE, 65: _OB_SIZE, 66: _BYTES_DATA, 68: _STR_STATE, 69: _STR_LENGTH}
_DEBUG_SIZE_313 = 73


def _layout_from_debug_offsets(mem: _Memory) -> Layout:
    """3.13's layout as the running interpreter states it in ``_PyRuntime.debug_offsets``, so that a patch
    release or build whose internal structs moved is still read right."""
    raw = mem.read(mem.symbols[b"_PyRuntime"], 8 * _DEBUG_SIZE_313)
    fields = struct.unpack_from(f"<8x{_DEBUG_SIZE_313 - 1}Q", raw)
    values = (0, *fields)  # index 0 is the cookie
    if raw[:8] != b"xdebugpy" or values[1] >> 16 != 0x030D:
        raise Unreadable("_PyRuntime does not start with 3.13's debug offsets")
    if values[2]:
        raise Unreadable("a free-threaded build (objects have another header)")
    if any(values[index] != expected for index, expected in _DEBUG_CHECKS_313.items()):
        raise Unreadable("object header offsets differ from a default 3.13 build")
    offsets = {name: values[index] for name, index in _DEBUG_FIELDS_313.items()}
    return Layout(**offsets, cframe_current_frame=None, compact_size=offsets["ascii_size"] + 16)


def _string(mem: _Memory, layout: Layout, address: int) -> str:
    """A ``str`` object's text (compact strings: every code object's names are compact)."""
    cached = mem.str_cache.get(address)
    if cached is not None:
        return cached
    mem.check_type(address, b"PyUnicode_Type")
    head = mem.read(address, layout.ascii_size)
    length = struct.unpack_from("<q", head, _STR_LENGTH)[0]
    state = struct.unpack_from("<I", head, _STR_STATE)[0]
    kind, compact, ascii_only = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or kind not in (1, 2, 4) or not 0 <= length < 1 << 20:
        raise Unreadable(f"str at {address:#x} is not a compact string")
    start = address + (layout.ascii_size if ascii_only else layout.compact_size)
    raw = mem.read(start, length * kind) if length else b""
    # "replace": a file name decoded with surrogateescape holds lone surrogates, which cannot be printed.
    text = raw.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "replace")
    mem.str_cache[address] = text
    return text


class _Code:
    """What a frame needs of its code object."""

    __slots__ = ("filename", "first_traceable", "firstlineno", "linetable", "qualname")

    def __init__(self, filename: str, qualname: str, linetable: bytes, firstlineno: int, first_traceable: int) -> None:
        self.filename = filename
        self.qualname = qualname
        self.linetable = linetable
        self.firstlineno = firstlineno
        self.first_traceable = first_traceable


# PyCodeObject ends (3.11-3.13) with `int _co_firsttraceable; void *co_extra; char co_code_adaptive[]`.
_FIRST_TRACEABLE_BEFORE_CODE = 16


def _code(mem: _Memory, layout: Layout, address: int) -> _Code:
    """A code object's names, line table, first line and first traceable instruction; cached."""
    cached = mem.code_cache.get(address)
    if cached is not None:
        return cached
    mem.check_type(address, b"PyCode_Type")
    head = mem.read(address, layout.code_code_adaptive)
    filename = _string(mem, layout, struct.unpack_from("<Q", head, layout.code_filename)[0])
    qualname = _string(mem, layout, struct.unpack_from("<Q", head, layout.code_qualname)[0])
    firstlineno = struct.unpack_from("<i", head, layout.code_firstlineno)[0]
    first_traceable = struct.unpack_from("<i", head, layout.code_code_adaptive - _FIRST_TRACEABLE_BEFORE_CODE)[0]
    table_at = struct.unpack_from("<Q", head, layout.code_linetable)[0]
    mem.check_type(table_at, b"PyBytes_Type")
    size = int.from_bytes(mem.read(table_at + _OB_SIZE, 8), "little", signed=True)
    if not 0 <= size < 1 << 24:
        raise Unreadable(f"line table of {qualname} has size {size}")
    linetable = mem.read(table_at + _BYTES_DATA, size) if size else b""
    code = _Code(filename, qualname, linetable, firstlineno, first_traceable)
    mem.code_cache[address] = code
    return code


def line_of(linetable: bytes, firstlineno: int, unit: int) -> int:
    """The source line of code unit ``unit`` from a 3.11+ ``co_linetable`` (Objects/locations.md);
    ``firstlineno`` before the first instruction, 0 when the instruction has no line."""
    if unit < 0:
        return firstlineno
    line, start, i, end = firstlineno, 0, 0, len(linetable)

    def varint() -> int:
        nonlocal i
        byte = linetable[i]
        i += 1
        value, shift = byte & 63, 0
        while byte & 64:
            byte = linetable[i]
            i += 1
            shift += 6
            value |= (byte & 63) << shift
        return value

    while i < end:
        first = linetable[i]
        i += 1
        code, length = (first >> 3) & 15, (first & 7) + 1
        has_line = True
        if code == 15:  # no location
            has_line = False
        elif code == 14:  # long form: line delta, end line delta, column, end column
            value = varint()
            line += -(value >> 1) if value & 1 else value >> 1
            varint(), varint(), varint()
        elif code == 13:  # no column: line delta only
            value = varint()
            line += -(value >> 1) if value & 1 else value >> 1
        elif code >= 10:  # one-line forms: the line moves by code - 10, two column bytes follow
            line += code - 10
            i += 2
        else:  # short forms: same line, one column byte
            i += 1
        if start <= unit < start + length:
            return line if has_line else 0
        start += length
    return line


def _frames(mem: _Memory, layout: Layout, frame_at: int) -> list[Frame]:
    frames: list[Frame] = []
    seen: set[int] = set()
    while frame_at:
        if frame_at in seen or len(frames) > _MAX_DEPTH:
            raise Unreadable("the frame chain loops (the stack changed while it was read)")
        seen.add(frame_at)
        raw = mem.read(frame_at, max(layout.frame_owner, layout.frame_instr, layout.frame_previous) + 8)
        code_at, previous, instr = (struct.unpack_from("<Q", raw, off)[0] for off in
                                    (layout.frame_code, layout.frame_previous, layout.frame_instr))
        owner = raw[layout.frame_owner]
        if owner != _FRAME_OWNED_BY_CSTACK:  # 3.11 has no such owner
            code = _code(mem, layout, code_at)
            unit = (instr - (code_at + layout.code_code_adaptive)) // 2
            # An incomplete frame (before its RESUME, e.g. 3.13's __init__ cleanup shim) is one that
            # CPython's own tracebacks leave out (_PyFrame_IsIncomplete).
            if owner == _FRAME_OWNED_BY_GENERATOR or unit >= code.first_traceable:
                line = mem.line_cache.get((code_at, unit))
                if line is None:
                    line = mem.line_cache[code_at, unit] = line_of(code.linetable, code.firstlineno, unit)
                frames.append(Frame(code.qualname, code.filename, line))
        frame_at = previous
    return frames


def _threads(mem: _Memory, layout: Layout) -> list[ThreadStack]:
    threads = []
    interp = mem.pointer(mem.symbols[b"_PyRuntime"] + layout.runtime_interpreters_head)
    seen: set[int] = set()
    while interp:
        state = mem.pointer(interp + layout.interp_threads_head)
        while state:
            if state in seen or len(seen) > _MAX_THREADS:
                raise Unreadable("the thread list loops (it changed while it was read)")
            seen.add(state)
            raw = mem.read(state, max(layout.native_thread_id, layout.thread_frame) + 8)
            ident, native, frame_ref, next_state = (struct.unpack_from("<Q", raw, off)[0] for off in (
                layout.thread_id, layout.native_thread_id, layout.thread_frame, layout.thread_next))
            if layout.cframe_current_frame is not None:
                frame_ref = mem.pointer(frame_ref + layout.cframe_current_frame) if frame_ref else 0
            main = native == mem.main_thread_id
            threads.append(ThreadStack(ident, "MainThread" if main else "", main, _frames(mem, layout, frame_ref)))
            state = next_state
        interp = mem.pointer(interp + layout.interp_next)
    # An idle subinterpreter keeps a frameless state on a thread that runs code elsewhere, and a thread
    # being started has no id yet: neither is a thread to show.
    busy = {t.thread_id for t in threads if t.frames}
    threads = [t for t in threads if t.frames or (t.thread_id and t.thread_id not in busy)]
    if not threads:
        raise Unreadable("no Python thread found (an interpreter not started, or shutting down)")
    return threads


def _settled_threads(mem: _Memory) -> list[ThreadStack]:
    """Two reads in a row that agree: the process is not paused, so a stack that moved while it was
    read (a rank still computing) must not pass for one; py-spy, which pauses it, then takes over."""
    version = _version(mem)
    layout = _layout_from_debug_offsets(mem) if version == (3, 13) else LAYOUTS.get(version)
    if layout is None:
        raise Unreadable(f"CPython {version[0]}.{version[1]} is not one this reader knows")
    previous = None
    for _ in range(_READ_ATTEMPTS):
        try:
            threads = _threads(mem, layout)
        except Unreadable:
            mem.forget()
            previous = None
            continue
        if threads == previous:
            return threads
        if previous is not None:
            mem.forget()
        previous = threads
    raise Unreadable("the stacks kept changing while they were read")


def read_stacks(pid: int) -> list[ThreadStack]:
    """Every Python thread of ``pid`` with its frames (innermost first), or :class:`Unreadable`."""
    candidates = _interpreters(pid)
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as exc:
        raise Unreadable(f"cannot open /proc/{pid}/mem: {exc.strerror or exc}",
                         denied=isinstance(exc, PermissionError)) from exc
    try:
        problem = Unreadable("no interpreter")
        main_thread_id = namespace_pid(pid)
        for symbols in candidates:
            if b"Py_Version" not in symbols:
                problem = Unreadable("CPython before 3.11 (no Py_Version symbol)")
                continue
            try:
                return _settled_threads(_Memory(pid, fd, symbols, main_thread_id))
            except Unreadable as exc:
                problem = exc
            except (IndexError, KeyError, ValueError, OverflowError, struct.error) as exc:  # garbage read
                problem = Unreadable(f"unexpected data ({type(exc).__name__}: {exc})")
        raise problem
    finally:
        os.close(fd)
