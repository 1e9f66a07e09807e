"""In-rank recorder for `ddpdoctor watch`: every collective the script issues, with its call site.

The functions of ``torch.distributed`` are replaced by thin wrappers (both the ``torch.distributed``
attributes a script calls and the ``distributed_c10d`` globals torch's own Python helpers call). Each
wrapper notes op, group, per-group sequence number, tensor shapes/dtype and the first stack frame outside
torch and ddpdoctor, then calls the original. The main thread only appends to a deque and bumps
counters; the watchdog thread (``watch_rank``) ships them. Collectives DDP issues from C++ (the gradient
all_reduce inside ``backward``, the initial parameter broadcast) never pass through Python and are not
recorded; ``backward`` itself is shown as a pseudo-op so a rank blocked there is named.

Nested calls (``all_gather_object`` calls ``all_gather``) are recorded once, as the outer call: the
sequence numbers then count what the script wrote, the same on every rank.

``init_process_group`` is recorded with what it was called with (backend, init_method, rank, world_size,
timeout, the call site: a *claim*) and the claim is handed to ``Recorder.init_hook`` *before* torch runs
the rendezvous, so two processes claiming the same rank are named before the second one dies of
``EADDRINUSE`` on the store port (the symptom a user otherwise sees).

Step accounting for straggler detection: the time between optimizer steps (a global
``register_optimizer_step_post_hook``), or between DDP ``backward()`` calls when no torch optimizer runs, and
the time spent inside recorded calls in that step. A rank that is chronically late makes the others wait
in their collectives; comparing the per-step medians of the ranks names it (see ``aggregate.straggler``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import os
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable
from typing import Any

import ddpdoctor
from ddpdoctor.watch.progress import Completions

# op -> (tensor parameter described, root parameter, whether shapes must match on every rank).
# Shapes legitimately differ for all_to_all with uneven splits and for the *_object variants (the
# pickled sizes differ), so only dtype / root is compared there.
COLLECTIVES: dict[str, tuple[str | None, str | None, bool]] = {
    "all_reduce": ("tensor", None, True),
    "broadcast": ("tensor", "src", True),
    "reduce": ("tensor", "dst", True),
    "all_gather": ("tensor", None, True),
    "all_gather_into_tensor": ("input_tensor", None, True),
    "reduce_scatter": ("output", None, True),
    "reduce_scatter_tensor": ("output", None, True),
    "all_to_all": ("input_tensor_list", None, False),
    "all_to_all_single": ("input", None, False),
    "gather": ("tensor", "dst", True),
    "scatter": ("tensor", "src", True),
    "barrier": (None, None, False),
    "monitored_barrier": (None, None, False),
    "broadcast_object_list": (None, "src", False),
    "all_gather_object": (None, None, False),
    "gather_object": (None, "dst", False),
    "scatter_object_list": (None, "src", False),
}
P2P_SEND = ("send", "isend")
P2P_RECV = ("recv", "irecv")
# Calls that block until peers arrive but have no sequence number of their own.
SYNC_POINTS = ("init_process_group", "new_group", "batch_isend_irecv")

MAX_WORKS = 256
# Per-step (step time, time in collectives) pairs kept for the medians: enough that one slow step (a
# checkpoint, a cold cache) never moves the median, small enough to sort once a second for nothing.
STEP_WINDOW = 128
_SKIP_DIRS: tuple[str, ...] = ()
_site_names: dict[str, str] = {}
_dtype_names: dict[Any, str] = {}


class Record:
    """One call: what, on which group, which number, from where."""

    __slots__ = ("desc", "device", "group", "members", "op", "seq", "sig", "site", "t0")

    def __init__(self, op: str, group: str, members: list[int] | None, seq: int | None, sig: str,
                 desc: str, site: str, device: Any = None) -> None:
        self.op = op
        self.device = device  # the CUDA device of its tensors, None on CPU (see progress.Completions)
        self.group = group
        self.members = members
        self.seq = seq
        self.sig = sig
        self.desc = desc
        self.site = site
        self.t0 = time.time()

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "group": self.group or None, "members": self.members, "seq": self.seq,
                "sig": self.sig, "desc": self.desc, "site": self.site}


def _skip_dirs() -> tuple[str, ...]:
    import multiprocessing

    import torch

    # multiprocessing: the bootstrap frames of a process the script started (mp.spawn) are not its code;
    # nor is the rest of the standard library (selectors, threading, queue: where a wait ends up); nor our
    # own command line's typer and click, under which `watch` runs the script when a launcher started it
    # (loaded by then if they are on the stack at all).
    # A module without a file would give "/" and hide every frame: only those with one count.
    ours = [getattr(sys.modules.get(name), "__file__", None) for name in ("typer", "click")]
    return (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(ddpdoctor.__file__) + os.sep,
            os.path.dirname(multiprocessing.__file__) + os.sep, os.path.dirname(os.__file__) + os.sep,
            *(os.path.dirname(path) + os.sep for path in ours if path), *_entry_scripts())


def _entry_scripts() -> list[str]:
    """Our console script (``bin/ddpdoctor``: ``sys.exit(entry())``), the outermost frame under a launcher.

    Where pip puts it: beside the interpreter (a venv's bin) or in the scheme's scripts folders; it is
    ours when it imports ddpdoctor's entry point. Compared as a path prefix like the folders above.
    """
    import sysconfig

    folders = {os.path.dirname(sys.executable), sysconfig.get_path("scripts")}
    with contextlib.suppress(KeyError):
        folders.add(sysconfig.get_path("scripts", f"{os.name}_user"))
    found: list[str] = []
    for folder in filter(None, folders):
        path = os.path.join(folder, "ddpdoctor")
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            head = fh.read(4096)
            if b"from ddpdoctor" in head and b"sys.exit(" in head:
                found += {path, os.path.realpath(path)}
    return found


def skip_dirs() -> tuple[str, ...]:
    """The folders whose frames are not the user's (torch, ddpdoctor, multiprocessing); () before install."""
    return _SKIP_DIRS


def site_name(filename: str) -> str:
    """How a file is shown: relative to the working directory when inside it, else its base name. A relative
    name is the path the script was started with (``ddpdoctor watch sub/train.py``: its code's file name is
    ``sub/train.py``), kept as given: its base name alone would not say which ``train.py``."""
    name = _site_names.get(filename)
    if name is None:
        cwd = os.getcwd() + os.sep
        if filename.startswith(cwd):
            name = filename[len(cwd):]
        elif not os.path.isabs(filename) and not filename.startswith("<"):
            name = os.path.normpath(filename)
        else:
            name = os.path.basename(filename)
        _site_names[filename] = name
    return name


def user_site(depth: int = 2) -> str:
    """file:line of the first frame outside torch and ddpdoctor: the line the user wrote."""
    frame: Any = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{site_name(frame.f_code.co_filename)}:{frame.f_lineno}"


def user_stack(frame: Any) -> list[str]:
    """The user-code frames of a stack, outermost first ("train.py:55 in main: dist.barrier()")."""
    lines = []
    for summary in traceback.extract_stack(frame):
        filename = summary.filename
        if filename.startswith(_SKIP_DIRS) or filename.startswith("<") or "runpy" in filename:
            continue
        source = (summary.line or "").strip()
        lines.append(f"{site_name(filename)}:{summary.lineno} in {summary.name}" + (f": {source}" if source else ""))
    return lines


def cuda_device(value: Any) -> Any:
    """The CUDA device of a tensor (or of a list's first tensor); None for CPU tensors and non-tensors."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if getattr(value, "is_cuda", False):
        return value.device
    return None


def describe(value: Any) -> str:
    """A tensor (or list of tensors) as 'float32[4,8]' ('float32[4,8] x3' for lists)."""
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        return f"{describe(value[0])} x{len(value)}"
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    dtype = value.dtype
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).replace("torch.", "")
    return f"{name}[{','.join(map(str, shape))}]"


class Recorder:
    """The collectives of this rank so far; written by the script's threads, read by the watchdog."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.pending: collections.deque[Record] = collections.deque()  # records not shipped yet
        self.current: Record | None = None
        self.progress = 0  # calls entered and left: the watchdog beats when it moves
        self.completions = Completions()  # progress in the hang sense: what completed
        self.started = False  # the user's code runs (torch imported, hooks installed)
        self._seq: dict[Any, int] = {}
        self._groups: dict[int, tuple[str, list[int] | None]] = {}
        self._local = threading.local()
        self.uses_ddp = False
        self.works: collections.OrderedDict[int, tuple[Any, Record]] = collections.OrderedDict()
        # Called with this process's init_process_group claim before the rendezvous runs.
        self.init_hook: Callable[[dict[str, Any]], None] | None = None
        self.claim: dict[str, Any] | None = None
        self.pid = os.getpid()
        # Step accounting (main thread writes, the watchdog reads a snapshot).
        self.in_calls_s = 0.0
        self.steps = 0
        self.step_window: collections.deque[tuple[float, float]] = collections.deque(maxlen=STEP_WINDOW)
        self._step_start: float | None = None
        self._boundary: str | None = None

    def reset(self, rank: int, world_size: int) -> None:
        """A forked child inherits the parent's recorder (its wrappers point at this object): start afresh."""
        hook = self.init_hook
        self.__init__(rank, world_size)  # type: ignore[misc]
        self.init_hook = hook

    # -- steps -------------------------------------------------------------------------------------

    def mark_step(self, kind: str) -> None:
        """A step boundary: an optimizer step, or (when no torch optimizer ever steps) a DDP backward."""
        if kind == "optimizer":
            self.completions.completed()  # an optimizer step is progress
        if kind != self._boundary:
            if self._boundary == "optimizer":
                return  # once an optimizer steps, backward calls are no longer boundaries
            self._boundary, self._step_start = kind, None
        now = time.perf_counter()
        if self._step_start is not None:
            self.step_window.append((now - self._step_start, self.in_calls_s))
            self.steps += 1
        self._step_start = now
        self.in_calls_s = 0.0

    def step_stats(self) -> dict[str, Any] | None:
        """Medians over the last STEP_WINDOW steps: step time and time inside collectives, in us."""
        window = list(self.step_window)
        if not window:
            return None
        steps = sorted(w[0] for w in window)
        waits = sorted(w[1] for w in window)
        mid = len(window) // 2
        return {"steps": self.steps, "window": len(window), "boundary": self._boundary,
                "step_us": round(steps[mid] * 1e6, 1), "wait_us": round(waits[mid] * 1e6, 1)}

    # -- naming ------------------------------------------------------------------------------------

    def group_of(self, group: Any) -> tuple[str, list[int] | None]:
        """('WORLD', None) or (the group's name, its global ranks); names agree across ranks."""
        if group is None:
            return "WORLD", None
        known = self._groups.get(id(group))
        if known is None:
            import torch.distributed as dist

            if dist.is_initialized() and group is dist.distributed_c10d._get_default_group():
                known = ("WORLD", None)
            else:
                try:
                    members = sorted(dist.get_process_group_ranks(group))
                except Exception:  # a group this rank is not part of, or an exotic object
                    members = None
                known = (str(getattr(group, "group_name", "") or f"group{members}"), members)
            self._groups[id(group)] = known
        return known

    def group_seqs(self) -> dict[str, int]:
        """Collectives issued so far per group, and messages per point-to-point channel."""
        return dict(self._seq)

    def next_seq(self, key: Any) -> int:
        seq = self._seq.get(key, 0) + 1
        self._seq[key] = seq
        return seq

    # -- recording ---------------------------------------------------------------------------------

    def start(self, rec: Record) -> None:
        self.pending.append(rec)
        self.current = rec
        self.progress += 1

    @property
    def last_done(self) -> Record | None:
        """The last numbered call that completed (not merely returned: an async one completes later)."""
        last: Record | None = self.completions.last
        return last

    def finish(self, rec: Record) -> None:
        if self.current is rec:
            self.current = None
        self.progress += 1

    def remember_works(self, result: Any, rec: Record) -> None:
        """Note which call an async Work came from, so a rank blocked in ``work.wait()`` is named."""
        for work in result if isinstance(result, list) else (result,):
            if hasattr(work, "wait"):
                # The Work itself is kept (not its id: ids are reused) until waited on, at most MAX_WORKS.
                self.works[id(work)] = (work, rec)
                if len(self.works) > MAX_WORKS:
                    self.works.popitem(last=False)

    def wrap(self, original: Callable[..., Any], make: Callable[[tuple[Any, ...], dict[str, Any], str], Record],
             after: Callable[[Record, tuple[Any, ...], Any], None] | None = None) -> Callable[..., Any]:
        """A wrapper that records ``make(args, kwargs, site)`` around each outermost call, and tells the
        completion tracking about each call that returned (``after``; by default: what it issued)."""
        local = self._local
        completions = self.completions
        if after is None:
            def after(rec: Record, args: tuple[Any, ...], result: Any) -> None:
                completions.issued(rec, result, rec.device)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(local, "depth", 0):
                return original(*args, **kwargs)
            rec = make(args, kwargs, user_site())
            self.start(rec)
            local.depth = 1
            began = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            finally:
                self.in_calls_s += time.perf_counter() - began
                local.depth = 0
                self.finish(rec)
            if result is not None and not isinstance(result, (int, bool)):
                self.remember_works(result, rec)
            after(rec, args, result)
            return result

        wrapper.__ddpdoctor_original__ = original  # type: ignore[attr-defined]
        return wrapper


def _getter(original: Callable[..., Any], name: str | None) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """Fetch parameter ``name`` from a call's args/kwargs by position, cheaply (no signature binding)."""
    if name is None:
        return lambda args, kwargs: None
    pos = list(inspect.signature(original).parameters).index(name)

    def get(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args[pos] if pos < len(args) else kwargs.get(name)

    return get


def _collective_maker(rec: Recorder, op: str, original: Callable[..., Any]) -> Callable[..., Record]:
    tensor_param, root_param, shapes_match = COLLECTIVES[op]
    get_tensor, get_root = _getter(original, tensor_param), _getter(original, root_param)
    get_group = _getter(original, "group")

    def make(args: tuple[Any, ...], kwargs: dict[str, Any], site: str) -> Record:
        group, members = rec.group_of(get_group(args, kwargs))
        # A rank outside the group returns at once without taking part: nothing to number or compare.
        seq = rec.next_seq(group) if members is None or rec.rank in members else None
        tensor = get_tensor(args, kwargs) if tensor_param else None
        desc = describe(tensor) if tensor_param else ""
        root = get_root(args, kwargs)
        # Where shapes may differ, only the dtype is compared: "float32[8] x2" -> "float32".
        sig = desc if shapes_match else desc.split("[", 1)[0]
        if root is not None:
            sig += f" {root_param}={root}"
            desc += f"{', ' if desc else ''}{root_param}={root}"
        return Record(op, group, members, seq, sig, desc, site, cuda_device(tensor))

    return make


def _p2p_maker(rec: Recorder, op: str, original: Callable[..., Any]) -> Callable[..., Record]:
    sending = op in P2P_SEND
    get_tensor, get_group = _getter(original, "tensor"), _getter(original, "group")
    get_peer = _getter(original, "dst" if sending else "src")

    def make(args: tuple[Any, ...], kwargs: dict[str, Any], site: str) -> Record:
        group, members = rec.group_of(get_group(args, kwargs))
        peer = get_peer(args, kwargs)
        tensor = get_tensor(args, kwargs)
        desc, device = describe(tensor), cuda_device(tensor)
        if peer is None:  # recv from any source: no channel to number it on
            return Record(op, group, members, None, desc, f"{desc}, from any rank", site, device)
        src, dst = (rec.rank, peer) if sending else (peer, rec.rank)
        channel = f"{group}:p2p:{src}->{dst}"
        return Record(op, channel, [src, dst], rec.next_seq(channel), desc,
                      f"{desc}, {'to' if sending else 'from'} rank {peer}", site, device)

    return make


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def init_claim(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], site: str,
               ) -> dict[str, Any]:
    """What this process asked ``init_process_group`` for, resolved as torch resolves it.

    rank/world_size: the argument when given (torch's default is -1), else the ``init_method`` URL's
    ``?rank=&world_size=`` query (tcp://, file://), else the RANK/WORLD_SIZE variables env:// reads;
    None where nothing says (torch then fails on its own).
    """
    try:
        bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
    except TypeError:
        bound = dict(kwargs)
    init_method = bound.get("init_method")
    store = bound.get("store")
    method = str(init_method) if init_method else ("store" if store is not None else "env://")
    query = urllib.parse.parse_qs(urllib.parse.urlparse(method).query) if "?" in method else {}

    def resolve(name: str, env: str) -> int | None:
        value = bound.get(name, -1)
        if isinstance(value, int) and value != -1:
            return value
        if name in query:
            try:
                return int(query[name][0])
            except ValueError:
                return None
        return _env_int(env) if method.startswith("env://") else None

    timeout = bound.get("timeout")
    backend = bound.get("backend")
    return {"backend": str(backend) if backend else "default", "init_method": method,
            "rank": resolve("rank", "RANK"), "world_size": resolve("world_size", "WORLD_SIZE"),
            "timeout_s": timeout.total_seconds() if timeout is not None and hasattr(timeout, "total_seconds") else None,
            "site": site, "pid": os.getpid()}


def _init_maker(rec: Recorder, original: Callable[..., Any]) -> Callable[..., Record]:
    def make(args: tuple[Any, ...], kwargs: dict[str, Any], site: str) -> Record:
        claim = init_claim(original, args, kwargs, site)
        rec.claim = claim
        hook = rec.init_hook
        if hook is not None:
            # Reporting the claim must never break the user's init_process_group.
            with contextlib.suppress(Exception):
                hook(claim)
        return Record("init_process_group", "", None, None, "", "", site)

    return make


def _plain_maker(op: str) -> Callable[..., Record]:
    def make(args: tuple[Any, ...], kwargs: dict[str, Any], site: str) -> Record:
        return Record(op, "", None, None, "", "", site)

    return make


_installed: Recorder | None = None


def install(rank: int, world_size: int, recorder: Recorder | None = None) -> Recorder:
    """Patch torch.distributed (once per process) and return the recorder (``recorder`` when given: one
    made before torch was imported, so the watchdog could report the rank as started meanwhile)."""
    global _SKIP_DIRS, _installed
    if _installed is not None:
        if _installed.pid != os.getpid():
            _installed.reset(rank, world_size)  # a forked child (mp start method "fork")
        return _installed
    import torch.autograd
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    _SKIP_DIRS = _skip_dirs()
    rec = recorder if recorder is not None else Recorder(rank, world_size)
    for op in (*COLLECTIVES, *P2P_SEND, *P2P_RECV, *SYNC_POINTS):
        original = getattr(c10d, op, None)
        if original is None:
            continue
        if op in COLLECTIVES:
            make = _collective_maker(rec, op, original)
        elif op in P2P_SEND or op in P2P_RECV:
            make = _p2p_maker(rec, op, original)
        elif op == "init_process_group":
            make = _init_maker(rec, original)
        else:
            make = _plain_maker(op)
        wrapper = rec.wrap(original, make)
        setattr(c10d, op, wrapper)
        if getattr(dist, op, None) is original:
            setattr(dist, op, wrapper)

    # backward: where DDP's gradient all_reduce runs (from C++, invisible otherwise). Only shown, never
    # numbered: ``Tensor.backward`` calls ``torch.autograd.backward`` through the module attribute.
    backward = torch.autograd.backward
    backward_record = _plain_maker("backward (DDP gradient all_reduce inside)")
    plain_backward = rec.wrap(backward, backward_record,
                              lambda record, args, result: rec.completions.backward_done(record, args[0] if args else None))

    @functools.wraps(backward)
    def watched_backward(*args: Any, **kwargs: Any) -> Any:
        if rec.uses_ddp:
            rec.mark_step("backward")
            return plain_backward(*args, **kwargs)
        return backward(*args, **kwargs)

    torch.autograd.backward = watched_backward
    # DDP's constructor broadcasts the parameters and checks their shapes on every rank (from C++): a rank
    # blocked there is waiting for the others, and its end is progress (it takes seconds on gloo).
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel.__init__ = rec.wrap(  # type: ignore[method-assign]
        DistributedDataParallel.__init__, _plain_maker("DistributedDataParallel() (parameter broadcast inside)"))
    # Every torch optimizer's step() ends in the global post hooks: one boundary per training step.
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: rec.mark_step("optimizer"))

    # work.wait() of an async collective (async_op=True, isend/irecv): shown, not numbered. Inside a
    # synchronous collective torch waits on its own Work; the depth guard keeps that out.
    def wait_record(args: tuple[Any, ...], kwargs: dict[str, Any], site: str) -> Record:
        entry = rec.works.pop(id(args[0]), None) if args else None
        if entry is not None and entry[0] is args[0]:
            issued = entry[1]
            label = f"#{issued.seq} {issued.op}" if issued.seq is not None else issued.op
            return Record(f"wait for {label} ({issued.site})", "", None, None, "", "", site)
        return Record("wait (async collective)", "", None, None, "", "", site)

    work_cls = getattr(c10d, "Work", None)
    if work_cls is not None and hasattr(work_cls, "wait"):
        work_cls.wait = rec.wrap(work_cls.wait, wait_record,
                                 lambda record, args, result: rec.completions.waited(args[0] if args else None))
    _installed = rec
    return rec
