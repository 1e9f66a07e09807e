"""Reading Flight Recorder dumps without running them, and ``ddpdoctor stacks --json`` files beside them.

PyTorch writes a dump with its own C++ pickler (``FlightRecorder::dump``, torch/csrc/distributed/c10d/
FlightRecorder.cpp; ``NCCLTraceBuffer::dump`` in NCCLUtils.hpp before 2.6): plain dicts, lists, tuples,
strings, numbers, booleans and None, never a class. So the unpickler here admits no global at all
(:class:`PlainDataUnpickler`, Python's documented way to restrict unpickling): a file that names a class or
function would run code, is refused, and nothing in it runs. ``_dump_fr_trace_json`` writes the same
document as JSON (without frames; ``pg_status`` numbers as strings).

Field names across dump versions (the ``version`` key), from PyTorch's writer:

- 1.x (the first releases with the recorder; NCCLUtils.hpp ``NCCLTraceBuffer::dump()``): ``seq_id``, ``pg_id``,
  ``profiling_name``, ``input_sizes``, ``output_sizes``, ``state``, ``frames``; ``pg_config`` from 1.4.
- 2.x: ``collective_seq_id`` and ``p2p_seq_id`` replace ``seq_id``; ``is_p2p``, ``op_id``,
  ``process_group`` (name, desc), ``input_dtypes``/``output_dtypes``, ``timeout_ms``, ``pg_status``
  (``last_enqueued/started/completed_collective`` per group id); 2.10 (torch 2.13) adds
  ``comm_lib_version``. ``pg_config`` is ``{name: {name, desc, ranks: "[0, 1]"}}`` on NCCL; on gloo in
  torch 2.13 it is ``{'': {'name': '', 'desc': '', 'ranks': '[]'}}`` and says nothing.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import stat
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import ddpdoctor
from ddpdoctor.errors import DoctorError
from ddpdoctor.fileio import read_regular
from ddpdoctor.fr.model import NO_CALL, Call, CallTable, GroupTrace, P2POp, RankDump, StackNow, Unreadable
from ddpdoctor.outputs import PARTIAL_SUFFIX, json_command
from ddpdoctor.safejson import UntrustedJSONError, loads_untrusted

_EXTENSIONS = (".json", ".pkl", ".pickle", ".bin")
_RANK_AT_END = re.compile(r"(\d+)$")
_TORCH_FILE = re.compile(r"(^|[/\\])torch[/\\]")
# Python's own library (threading.py, runpy.py): not the user's code either.
_STDLIB_FILE = re.compile(r"[/\\]lib[/\\]python3[^/\\]*[/\\](?!site-packages|dist-packages)")
_OWN_DIR = os.path.dirname(os.path.abspath(ddpdoctor.__file__)) + os.sep
_P2P_NAME = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)$")


class UnsafeDump(Exception):
    """The pickle names a Python global: loading it would run code."""


class UnreadableDump(DoctorError):
    """A rank's dump that holds no readable document: empty, cut short, damaged, or not a dump at all. That rank
    is counted as having left no usable dump (named with ``why``), and the others are still judged; a file that
    is refused as hostile (it names code to run) stops the run instead (plain DoctorError, exit 2)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


class OddKey(ValueError):
    """A dict key that is not a name or a number, or a set: no dump has one, and hashing one can stall."""


def _scalar_key(key: Any) -> Any:
    if key is None or type(key) in (str, int, bool, float, bytes):
        return key
    raise OddKey(f"a {type(key).__name__} used as a dict key")


def _refuse_sets(self: Any) -> None:
    raise OddKey("a set (no Flight Recorder dump holds one)")


class PlainDataUnpickler(pickle._Unpickler):
    """Admits builtin containers and scalars only: every GLOBAL/STACK_GLOBAL/INST/EXT goes through
    ``find_class`` and is refused, so REDUCE/NEWOBJ never get anything to call.

    The pure-Python unpickler (``pickle._Unpickler``), not the C one, so that dict keys can be checked
    as they are set: a tuple key built from shared copies of itself (2^39 leaves through the memo in a few
    hundred bytes) is hashed in C by the C unpickler's SETITEM, where nothing can stop it. Here a key must
    be a string or a number, and sets are refused. It costs ~0.15 s per 1 MB dump (4x the C unpickler).
    """

    dispatch: ClassVar[dict[int, Callable[..., None]]] = dict(pickle._Unpickler.dispatch)
    # Set by pickle._Unpickler.load(); declared for the type checker.
    stack: list[Any]
    append: Callable[[Any], None]
    pop_mark: Callable[[], list[Any]]

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeDump(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeDump("a persistent id (external object)")

    def _load_setitem(self) -> None:
        value = self.stack.pop()
        key = _scalar_key(self.stack.pop())
        self.stack[-1][key] = value

    def _load_setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        for i in range(0, len(items), 2):
            target[_scalar_key(items[i])] = items[i + 1]

    def _load_dict(self) -> None:
        items = self.pop_mark()
        self.append({_scalar_key(items[i]): items[i + 1] for i in range(0, len(items), 2)})

    dispatch[pickle.SETITEM[0]] = _load_setitem
    dispatch[pickle.SETITEMS[0]] = _load_setitems
    dispatch[pickle.DICT[0]] = _load_dict
    for _op in (pickle.EMPTY_SET, pickle.ADDITEMS, pickle.FROZENSET):
        dispatch[_op[0]] = _refuse_sets


def _brief(exc: BaseException) -> str:
    """An exception in at most 120 characters without ``str()`` of what it carries (a KeyError's key may
    be a structure that expands to millions of items)."""
    arg = exc.args[0] if exc.args else ""
    return f"{type(exc).__name__}: {arg[:120]}" if isinstance(arg, str) else type(exc).__name__


# What a real dump can be, generously: nesting (a dump is 6 deep), integers (ns timestamps fit 63 bits),
# and the work its shared objects expand to (see :func:`check_plain`). A real dump's expanded size is a
# small multiple of its bytes; a pickle whose memo re-uses one list thousands of times is not.
MAX_DEPTH = 64
MAX_INT_BITS = 128
EXPANSION_FLOOR = 10_000_000
EXPANSION_PER_BYTE = 8
# A ring buffer of 20,000 entries with frames is tens of megabytes; a stacks --json file a few.
MAX_DUMP_BYTES = 2 << 30
MAX_STACKS_BYTES = 256 << 20


class Unbounded(ValueError):
    """The document is not plain bounded data: too deep, a cycle, a huge number, or a memo bomb."""


def _leaf_weight(obj: Any) -> int:
    if isinstance(obj, int) and not isinstance(obj, bool):
        if obj.bit_length() > MAX_INT_BITS:
            raise Unbounded(f"an integer of {obj.bit_length()} bits")
        return 1
    if isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            raise Unbounded(f"the number {obj} (no dump holds one)")
        return 1
    if isinstance(obj, (str, bytes, bytearray)):
        return 1 + len(obj) // 16  # str() of a container repeats each string it reaches
    return 1


def check_plain(doc: Any, budget: int) -> None:
    """Refuse a document that reading it would make expensive, before anything reads it.

    Every later step (``str()`` of a value, the sizes of every entry) walks values as trees, so what it
    costs is the *expanded* size: a shared object counts once per reference. A pickle's memo lets a
    20 KB file reference one 3,000-long list 3,000 times per entry (billions of steps), or build a
    tuple of 2**40 leaves from 41 objects. The expanded size is computed here bottom-up over the distinct
    objects (linear in the file), without recursion, and must stay within ``budget``; nesting beyond
    :data:`MAX_DEPTH`, cycles, huge integers and infinities are refused too.
    """
    weights: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(doc, 0, False)]
    while stack:
        obj, depth, done = stack.pop()
        if isinstance(obj, dict):
            children: Any = [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = obj
        else:
            _leaf_weight(obj)
            continue
        key = id(obj)
        if done:
            total = 1 + sum(weights[id(c)] if id(c) in weights else _leaf_weight(c) for c in children)
            if total > budget:
                raise Unbounded(f"its shared objects expand to over {budget} values (a pickle memo bomb?)")
            weights[key] = total
            on_path.discard(key)
            continue
        if key in weights:
            continue
        if key in on_path:
            raise Unbounded("a container that contains itself")
        if depth >= MAX_DEPTH:
            raise Unbounded(f"nested deeper than {MAX_DEPTH} levels")
        on_path.add(key)
        stack.append((obj, depth, True))
        for child in children:
            if isinstance(child, (dict, list, tuple, set, frozenset)):
                if id(child) in on_path:
                    raise Unbounded("a container that contains itself")
                if id(child) not in weights:
                    stack.append((child, depth + 1, False))


def _head(path: str, size: int) -> bytes:
    """The first bytes of a regular file (for sniffing); empty for anything else or an unreadable file."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return b""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb", closefd=True) as fh:
            return fh.read(size) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return b""


@dataclass(frozen=True)
class Inputs:
    """The files to read: dumps with their rank, and stacks JSON files."""

    dumps: list[tuple[int, str]]
    stacks: list[str]
    skipped: list[str]


def _stem(path: str) -> str:
    """The file's name without a dump's extension (``fr_rank_3.json`` -> ``fr_rank_3``)."""
    name = os.path.basename(path)
    for ext in _EXTENSIONS:
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def rank_from_name(path: str, prefix: str | None) -> int | None:
    """The rank in ``nccl_trace_rank_3`` / ``fr_rank_3.json`` / ``<prefix>3``; None when the name has none."""
    name = _stem(path)
    if prefix is not None:
        if not name.startswith(prefix):
            return None
        name = name[len(prefix):]
        return int(name) if name.isdigit() else None
    match = _RANK_AT_END.search(name)
    return int(match.group(1)) if match else None


# PyTorch's dump names (TORCH_NCCL_DEBUG_INFO_TEMP_FILE's and TORCH_FR_DUMP_TEMP_FILE's default
# /tmp/nccl_trace_rank_<N>) and watch's bundle (flight_recorder/fr_rank_<N>): a file named so is a rank's dump
# even when it holds nothing readable (the rank was killed while writing it), never an unrelated file to skip.
_DUMP_NAME = re.compile(r"(?:^|[_.-])rank[_-]?\d+$")


def _named_like_a_dump(path: str, prefix: str | None) -> bool:
    name = _stem(path)
    return name.startswith(prefix) if prefix is not None else _DUMP_NAME.search(name) is not None


def _looks_like_stacks(path: str) -> bool:
    if not path.endswith(".json"):
        return False
    head = _head(path, 4096)
    return b'"processes"' in head and b'"ddpdoctor"' in head


def _looks_like_dump(path: str) -> bool:
    """A pickle (protocol 2+ starts with 0x80) or a JSON object: what a Flight Recorder dump can be.

    In a folder (``ddpdoctor fr /tmp``, where PyTorch writes its dumps by default) other files whose names
    end in a number (``tmpab3k9``, ``core.12345``) are skipped instead of failing the run.
    """
    head = _head(path, 64).lstrip()
    return head[:1] in (b"\x80", b"{")


def collect_inputs(paths: Sequence[str], prefix: str | None) -> Inputs:
    """Expand directories; every file given by name must be a dump (with a rank) or a stacks JSON."""
    dumps: dict[int, str] = {}
    stacks: list[str] = []
    skipped: list[str] = []

    def add(path: str, explicit: bool) -> None:
        ours = json_command(path)
        if ours is not None and ours not in ("stacks", "stacks merge"):
            # Our own outputs are never inputs: `fr DIR --json DIR/verdict.json`, then `fr DIR` again.
            if explicit:
                raise DoctorError(f"{path}: a ddpdoctor `{ours}` document (an output of ddpdoctor), not a Flight "
                                  "Recorder dump or a `ddpdoctor stacks --json` file")
            skipped.append(path)
            return
        if _looks_like_stacks(path):
            stacks.append(path)
            return
        rank = rank_from_name(path, prefix)
        if rank is not None and not explicit and not _looks_like_dump(path) and not _named_like_a_dump(path, prefix):
            rank = None  # /tmp/core.12345: a number at the end, but no dump's name and no dump's bytes
        if rank is None:
            if explicit:
                hint = f" starting with {prefix!r}" if prefix else " ending in _rank_<N> (PyTorch's default)"
                raise DoctorError(f"{path}: cannot tell which rank wrote it: name dump files{hint}, "
                                  "or pass --prefix")
            skipped.append(path)
            return
        if rank in dumps:
            raise DoctorError(f"two dumps for rank {rank}: {dumps[rank]} and {path}; pass one run's dumps")
        dumps[rank] = path

    for path in paths:
        if not path:  # os.stat("") fails with ENOENT, which would print as ": no such file or directory"
            raise DoctorError("PATH is empty (''): give the dump files or their folder (an unset shell variable?)")
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:  # missing, or a folder on the way this user may not enter
            raise DoctorError(f"{path}: {(exc.strerror or str(exc)).lower()}") from None
        if stat.S_ISDIR(mode):
            try:
                listed = os.listdir(path)
            except OSError as exc:
                raise DoctorError(f"{path}: cannot list the folder ({exc.strerror or exc})") from None
            names = sorted(n for n in listed if not n.startswith(".") and not n.endswith(PARTIAL_SUFFIX))
            files = [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
            for file in files:
                add(file, explicit=False)
        elif stat.S_ISREG(mode):
            add(path, explicit=True)
        else:
            raise DoctorError(f"{path}: not a regular file or directory")
    if not dumps:
        where = ", ".join(paths)
        raise DoctorError(f"no Flight Recorder dump found in {where} (files named like nccl_trace_rank_<N>; "
                          "see TORCH_NCCL_DEBUG_INFO_TEMP_FILE)")
    return Inputs(sorted(dumps.items()), stacks, skipped)


def read_document(path: str) -> tuple[str, dict[str, Any]]:
    """('pickle' | 'json', the dump's top-level dict); UnreadableDump for a damaged or foreign file, DoctorError
    (exit 2) for one refused as hostile."""
    try:
        data = read_regular(path, MAX_DUMP_BYTES)
    except OSError as exc:
        raise DoctorError(f"{path}: cannot read it ({exc.strerror})") from None
    # Sniffed before parsing: a checkpoint or log passed by mistake is refused at once.
    if data[:1] != b"\x80" and data.lstrip()[:1] != b"{":
        if not data:
            raise UnreadableDump(path, "empty file (the rank was killed while writing its dump?)")
        raise UnreadableDump(path, "not a Flight Recorder dump (neither a pickle nor JSON)")
    if data[:1] == b"\x80":
        fmt = "pickle"
        try:
            import io

            doc = PlainDataUnpickler(io.BytesIO(data)).load()
        except UnsafeDump as exc:
            raise DoctorError(f"{path}: refused: the pickle names the Python global {exc}, which would run "
                              "code when loaded; a Flight Recorder dump holds plain data only") from None
        except OddKey as exc:
            raise DoctorError(f"{path}: refused: not a Flight Recorder dump ({exc})") from None
        except MemoryError:
            raise UnreadableDump(path, "corrupt pickle (announces an impossible length)") from None
        except Exception as exc:  # any failure of a damaged pickle is bad input, not a bug
            raise UnreadableDump(path, f"truncated or corrupt Flight Recorder dump ({_brief(exc)})") from None
    else:
        fmt = "json"
        try:
            doc = loads_untrusted(data)
        except UntrustedJSONError as exc:
            raise UnreadableDump(path, f"truncated or corrupt JSON dump ({str(exc)[:120]})") from None
    try:
        check_plain(doc, EXPANSION_FLOOR + EXPANSION_PER_BYTE * len(data))
    except Unbounded as exc:
        raise DoctorError(f"{path}: refused: not a Flight Recorder dump ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries", []), list) or \
            not ({"entries", "pg_status", "pg_config"} & set(doc)):
        raise UnreadableDump(path, "not a Flight Recorder dump (no 'entries')")
    return fmt, doc


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def _sizes(value: Any) -> tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    try:  # the usual case, fast: a list of lists of ints
        sizes = tuple(map(tuple, value))
        if all(type(x) is int for s in sizes for x in s):
            return sizes
    except TypeError:
        pass
    return tuple(tuple(_int(x) for x in s) if isinstance(s, (list, tuple)) else _int(s) for s in value)


def _dtypes(value: Any) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(x if type(x) is str else str(x) for x in value)
    return ()


@functools.lru_cache(maxsize=65536)
def _not_users(filename: str) -> bool:
    return (not filename or bool(_TORCH_FILE.search(filename)) or filename.startswith((_OWN_DIR, "<"))
            or bool(_STDLIB_FILE.search(filename)))


def user_frame(frames: Any) -> tuple[str | None, int | None, str | None]:
    """The first frame (innermost first) outside torch, Python's library and ddpdoctor: the user's line."""
    if not isinstance(frames, list):
        return None, None, None
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename = str(frame.get("filename", ""))
        if _not_users(filename):
            continue
        return filename, _int(frame.get("line"), 0), str(frame.get("name", "")) or None
    return None, None, None


def _ranks(text: Any, path: str) -> tuple[int, ...] | None:
    ranks: Any
    if isinstance(text, (list, tuple)):
        ranks = text
    else:
        try:  # "[0, 1]" as pg_config writes it; a string from the file, so read with the same limits
            ranks = loads_untrusted(text) if isinstance(text, str) else None
        except UntrustedJSONError:
            raise DoctorError(f"{path}: a process group's ranks are {str(text)[:80]!r}, not a list of ranks") from None
    if not isinstance(ranks, list) or not ranks:
        return None
    return tuple(sorted(_int(r) for r in ranks))


def normalise(rank: int, path: str, fmt: str, doc: dict[str, Any], table: CallTable) -> RankDump:
    """The dump reduced to per-group call-id arrays; the raw document can be dropped afterwards."""
    configs: dict[str, tuple[str, tuple[int, ...] | None]] = {}
    raw_config = doc.get("pg_config")
    if isinstance(raw_config, dict):
        for key, cfg in raw_config.items():
            if isinstance(cfg, dict):
                name = str(cfg.get("name", key) or key)
                if name:
                    configs[name] = (str(cfg.get("desc", "")), _ranks(cfg.get("ranks"), path))
    entries = doc.get("entries") or []
    dump = RankDump(rank=rank, path=path, format=fmt, version=str(doc.get("version", "?")), entries=len(entries),
                    has_frames=False, oldest_ns=None)

    def group(name: str, desc: str = "") -> GroupTrace:
        trace = dump.groups.get(name)
        if trace is None:
            cfg_desc, ranks = configs.get(name, (desc, None))
            trace = dump.groups[name] = GroupTrace(name=name, desc=desc or cfg_desc, ranks=ranks)
        elif desc and not trace.desc:
            trace.desc = desc
        return trace

    id_to_name: dict[str, str] = {}
    # Within one document a list object shared by several entries (the pickle memoised it) is read once.
    frame_cache: dict[int, tuple[str | None, int | None, str | None]] = {}
    newest: tuple[int, str, int] | None = None  # (time_created_ns, group, seq) of the newest collective
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        pg = entry.get("process_group")
        pg_id = str(entry.get("pg_id", "0"))
        if isinstance(pg, (list, tuple)) and len(pg) == 2:
            name, desc = str(pg[0]), str(pg[1])
        else:  # version 1.x: only the numeric pg_id
            name, desc = pg_id, ""
        id_to_name.setdefault(pg_id, name)
        frames = entry.get("frames")
        if frames:
            dump.has_frames = True
            where = frame_cache.get(id(frames))
            if where is None:
                where = frame_cache[id(frames)] = user_frame(frames)
            file, line, function = where
        else:
            file, line, function = None, None, None
        profiling = str(entry.get("profiling_name", "?"))
        op = profiling.split(":", 1)[-1].strip()  # 'nccl:all_reduce' -> 'all_reduce'
        created = _int(entry.get("time_created_ns"), 0)
        if created and (dump.oldest_ns is None or created < dump.oldest_ns):
            dump.oldest_ns = created
        trace = group(name, desc)
        p2p = _P2P_NAME.match(op)
        if entry.get("is_p2p") or p2p:
            call = Call(p2p.group(1) if p2p else op, _sizes(entry.get("input_sizes")),
                        _dtypes(entry.get("input_dtypes")), _sizes(entry.get("output_sizes")),
                        _dtypes(entry.get("output_dtypes")), file, line, function)
            peer = None
            if p2p:
                # 'send 1->2' (src->dst), 'recv 2<-1' (dst<-src): ranks within the group.
                peer = int(p2p.group(4))
            trace.p2p.append(P2POp(send=call.op == "send", peer=peer, call_id=table.intern(call),
                                   p2p_seq=_int(entry.get("p2p_seq_id"), 0), time_created_ns=created,
                                   state=str(entry.get("state", ""))))
            continue
        seq = _int(entry.get("collective_seq_id", entry.get("seq_id")), 0)
        if seq <= 0:
            continue
        newest_seen = (created, name, seq)
        if newest is None or newest_seen[0] >= newest[0]:
            newest = newest_seen
        trace.put(seq, table.intern_fields(op, _sizes(entry.get("input_sizes")), _dtypes(entry.get("input_dtypes")),
                                           _sizes(entry.get("output_sizes")), _dtypes(entry.get("output_dtypes")),
                                           file, line, function))
    if newest is not None:
        dump.newest = (newest[1], newest[2])
    status = doc.get("pg_status")
    if isinstance(status, dict):
        # Keyed by the numeric pg id (FlightRecorder::getPgStatus); entries carry both pg_id and the name.
        # A group with no entry left keeps its id as its name (on gloo in torch 2.13 they are the same).
        for key, values in status.items():
            if not isinstance(values, dict):
                continue
            trace = group(id_to_name.get(str(key), str(key)))
            trace.last_enqueued = max(trace.last_enqueued, _int(values.get("last_enqueued_collective"), 0))
            completed = _int(values.get("last_completed_collective"), -1)
            trace.last_completed = completed if completed >= 0 else None
    return dump


def read_dumps(inputs: Inputs, table: CallTable, unreadable: list[Unreadable]) -> Iterator[RankDump]:
    """One dump at a time, so memory holds one raw document, never all of them; the ones that cannot be read
    go to ``unreadable``."""
    for rank, path in inputs.dumps:
        try:
            fmt, doc = read_document(path)
        except UnreadableDump as exc:
            unreadable.append(Unreadable(rank, path, exc.why))
            continue
        yield normalise(rank, path, fmt, doc, table)
        del doc


# Below this many dumps, starting worker processes costs more than it saves.
PARALLEL_FROM = 32


def _read_chunk(chunk: list[tuple[int, str]]) -> tuple[list[RankDump], list[Call], list[Unreadable]]:
    table = CallTable()
    unreadable: list[Unreadable] = []
    dumps = list(read_dumps(Inputs(chunk, [], []), table, unreadable))
    return dumps, table.calls, unreadable


def read_all(inputs: Inputs, table: CallTable, unreadable: list[Unreadable],
             workers: int | None = None) -> list[RankDump]:
    """Every dump reduced, in worker processes when there are many (each holds one raw dump at a time); the
    ranks whose dump cannot be read go to ``unreadable``.

    Each worker interns its own calls; their ids are mapped into ``table`` here.
    """
    workers = workers if workers is not None else min(os.cpu_count() or 1, 8)
    if workers <= 1 or len(inputs.dumps) < PARALLEL_FROM:
        return list(read_dumps(inputs, table, unreadable))
    from concurrent.futures import ProcessPoolExecutor

    size = max(1, -(-len(inputs.dumps) // (workers * 4)))
    chunks = [inputs.dumps[i:i + size] for i in range(0, len(inputs.dumps), size)]
    result: list[RankDump] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for dumps, calls, bad in pool.map(_read_chunk, chunks):
            unreadable.extend(bad)
            remap = array("i", (table.intern(call) for call in calls))
            for dump in dumps:
                for trace in dump.groups.values():
                    trace.calls = array("i", (c if c == NO_CALL else remap[c] for c in trace.calls))
                    for op in trace.p2p:
                        op.call_id = remap[op.call_id]
                result.append(dump)
    return result


def _stack_where(frames: list[dict[str, Any]]) -> tuple[str, str | None]:
    call = None
    for frame in frames:
        file = str(frame.get("file", ""))
        if _TORCH_FILE.search(file) and "distributed" in file and call is None:
            function = str(frame.get("function", ""))
            if function and not function.startswith("_") and function != "wrapper":
                call = function
            continue
        if _not_users(file):
            continue
        return f"{os.path.basename(file)}:{frame.get('line')} in {frame.get('function')}", call
    first = frames[0] if frames else {}
    return str(first.get("where", "?")), call


def read_stacks(paths: Sequence[str]) -> dict[int, StackNow]:
    """Each rank's main-thread position from ``ddpdoctor stacks --json`` files (docs/stacks.md)."""
    found: dict[int, StackNow] = {}
    for path in paths:
        try:
            doc = loads_untrusted(read_regular(path, MAX_STACKS_BYTES))
        except (OSError, UntrustedJSONError) as exc:
            raise DoctorError(f"{path}: cannot read this `ddpdoctor stacks --json` file "
                              f"({type(exc).__name__}: {str(exc)[:200]})") from None
        processes = doc.get("processes") if isinstance(doc, dict) else None
        if not isinstance(processes, list):
            raise DoctorError(f"{path}: not a `ddpdoctor stacks --json` file (no 'processes')")
        for proc in processes:
            if not isinstance(proc, dict) or not isinstance(proc.get("rank"), int) or proc["rank"] in found:
                continue
            listed = proc.get("threads")
            threads = [t for t in listed if isinstance(t, dict)] if isinstance(listed, list) else []
            main = next((t for t in threads if t.get("main")), threads[0] if threads else None)
            frame_list = (main or {}).get("frames")
            frames = [f for f in frame_list if isinstance(f, dict)] if isinstance(frame_list, list) else []
            if not frames:
                continue
            where, call = _stack_where(frames)
            found[proc["rank"]] = StackNow(proc["rank"], str(proc.get("host", "?")), _int(proc.get("pid")),
                                           where, call, path)
    return found
