"""A native crash whose backtrace runs from NCCL into the InfiniBand verbs libraries (issue 33).

A process that dies of SIGSEGV or SIGBUS inside NCCL's InfiniBand transport leaves no NCCL error line: only a signal
handler's line and a native backtrace. The backtrace says where it died, read innermost frame first: a frame of the
verbs stack (``libibverbs``, a provider such as ``libmlx5``, ``librdmacm``, or an ``ibv_*``/``mlx5_*`` function) with
a frame of ``libnccl`` (or an NCCL net plugin, ``libnccl-net``) further out is NCCL calling the host's verbs
libraries and those crashing: NCCL loads ``libibverbs`` with dlopen and calls ``ibv_get_device_list``,
``ibv_open_device``, ``ibv_reg_mr``... through its wrappers (NCCL src/misc/ibvwrap.cc, e.g. v2.4.8-1
``wrap_ibv_get_device_list`` at line 193; src/misc/ibvsymbols.cc since 2.19). That is a problem of the machine's
RDMA stack (a container's rdma-core against the host's driver, two copies of libibverbs on the library path, a
provider library missing), not of the training code, and ``NCCL_IB_DISABLE=1`` tells it apart.

Backtraces come in the forms their printers write, each innermost frame first:

- glibc's ``backtrace_symbols`` (execinfo): ``/lib/x86_64-linux-gnu/libibverbs.so.1(ibv_get_device_list+0x55)
  [0x7f21043c2635]``, the form UCX's fatal-signal handler prints after ``==== backtrace (tid:%7d) ====`` as
  ``%2d  %s`` (openucx/ucx src/ucs/debug/debug.c, UCS_DEBUG_BACKTRACE_LINE_FMT, v1.9.0 and master);
- gdb's ``bt``: ``#3  0x00007f... in ibv_get_device_list () from /lib/x86_64-linux-gnu/libibverbs.so.1``;
- c10's ``get_backtrace`` (an ``Exception raised from`` message's frames):
  ``frame #6: ibv_get_device_list + 0x55 (0x7f... in /lib/x86_64-linux-gnu/libibverbs.so.1)``.

The signal comes from the handler's line above the backtrace when the paste has one: UCX's ``Caught signal 11
(Segmentation fault: address not mapped to object at address 0x...)`` (ucs_debug_handle_error_signal, the same
file), PyTorch's and glog's ``*** SIGSEGV ... received by PID``, Python's faulthandler ``Fatal Python error:
Segmentation fault``, or a shell's ``Segmentation fault (core dumped)``.

Read from the input's last bytes the scanner keeps anyway, only when they hold a verbs name at all (one
``bytes.find`` per name: a healthy log pays nothing else).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddpdoctor.explain.frames import MIN_WRAP_WIDTH
from ddpdoctor.explain.lines import strip_paste
from ddpdoctor.explain.phases import MAX_TAIL_LINE_CHARS

# Literals one of which a verbs frame holds: the gate before any line is read.
VERBS_LITERALS = (b"libibverbs", b"ibv_", b"libmlx", b"mlx5_", b"librdmacm", b"rdma_")
_VERBS_LIB = re.compile(r"^lib(?:ibverbs|mlx[45]|rdmacm|efa|bnxt_re|irdma|hns)\b")
_VERBS_FUNC = re.compile(r"^(?:ibv_|mlx[45]_|rdma_|efa_)\w+")
_NCCL_LIB = re.compile(r"^libnccl(?:-net\w*)?\.so")
_NCCL_FUNC = re.compile(r"^(?:nccl|wrap_ibv_)\w*")

# One frame in each printer's form (see the module docstring); ``lib`` is the object's file name.
_FRAMES = (
    # backtrace_symbols, with UCX's "%2d  " index or none: /path/lib.so.1(func+0x55) [0x...]
    re.compile(r"^\s*(?:\d+\s+)?(?P<path>/?[^\s(]*?(?P<lib>lib[\w.+-]*?\.so[\w.]*))\((?P<func>[\w.:~]*)(?:\+0x[0-9a-fA-F]+)?\)"
               r"\s*\[0x[0-9a-fA-F]+\]"),
    # gdb: #3  0x00007f... in func () from /path/lib.so.1   (or "at file.c:12" with debug information)
    re.compile(r"^\s*#\d+\s+(?:0x[0-9a-fA-F]+ in )?(?P<func>[\w:~<>.]+) \(.*?\)(?: from (?P<path>\S*?(?P<lib>lib[\w.+-]*?\.so[\w.]*)))?"),
    # c10::get_backtrace: frame #6: func + 0x55 (0x7f... in /path/lib.so.1)
    re.compile(r"^\s*frame #\d+: (?P<func>.*?) \+ 0x[0-9a-fA-F]+ \(0x[0-9a-fA-F]+ in (?P<path>\S*?(?P<lib>lib[\w.+-]*?\.so[\w.]*))\)"),
)
# A fatal signal's line from a handler (or the shell), the nearest above the backtrace.
_SIGNAL = re.compile(r"Caught signal \d+ \([^)]*|\*\*\* (?:SIG[A-Z]+|Signal \d+)\b.*|Fatal Python error: "
                     r"(?:Segmentation fault|Bus error|Aborted)|Segmentation fault(?: \(core dumped\))?|"
                     r"Bus error(?: \(core dumped\))?")
_SIGNAL_NAME = re.compile(r"Caught signal \d+ \(([^:)]+)|\*\*\* (SIG[A-Z]+|Signal \d+)|Fatal Python error: ([A-Z][a-z ]+)|"
                          r"(Segmentation fault|Bus error)")
MAX_FRAME_GAP = 3  # lines between two frames of one backtrace (a wrapped line, a blank)
MAX_SIGNAL_LOOKBACK = 12  # lines above a backtrace's first frame where its handler's line is looked for


@dataclass(frozen=True)
class VerbsCrash:
    """A native backtrace in which NCCL called the verbs libraries and they crashed."""

    file: str
    file_index: int
    verbs_line: int  # the innermost verbs frame's line in the input
    verbs_frame: str  # as pasted
    verbs_call: str  # the verbs function, or the library when the frame has no symbol
    nccl_line: int
    nccl_frame: str
    nccl_lib: str
    signal_line: int  # 0 when the paste shows no handler's line
    signal: str  # that line, as pasted
    rank: int | None

    @property
    def signal_name(self) -> str:
        """The signal in a few words ("Segmentation fault", "SIGBUS"), "" when the paste shows none."""
        m = _SIGNAL_NAME.search(self.signal)
        return next((g for g in m.groups() if g), "") if m else ""


def _frame(text: str) -> tuple[str, str] | None:
    """(library file name, function) of one backtrace frame line, or None."""
    for pattern in _FRAMES:
        if m := pattern.match(text):
            return m.group("lib") or "", m.group("func") or ""
    return None


def _is_verbs(lib: str, func: str) -> bool:
    return bool(_VERBS_LIB.match(lib) or _VERBS_FUNC.match(func))


def _is_nccl(lib: str, func: str) -> bool:
    return bool(_NCCL_LIB.match(lib) or (not lib and _NCCL_FUNC.match(func)))


def _unwrapped(lines: list[str]) -> list[str]:
    """The lines with what a terminal wrapped put back on the line it came from (a backtrace's frames are long: a
    path, a symbol, two addresses): a line as wide as the widest (at least MIN_WRAP_WIDTH) takes the next line onto
    its end unless that one starts a frame. A joined line keeps its place; the lines it took become empty, so
    every line keeps its number."""
    width = max((len(line) for line in lines), default=0)
    if width < MIN_WRAP_WIDTH:
        return lines
    out = list(lines)
    head = -1  # the line the current wrapped run is joined onto
    for i, line in enumerate(lines):
        if head >= 0 and line and _frame(strip_paste(line)) is None:
            out[head] += line
            out[i] = ""
            if len(line) < width:
                head = -1
            continue
        head = i if len(line) == width else -1
    return out


def verbs_crash(tail: bytes, last_line: int, name: str, file_index: int, file_rank: int | None) -> VerbsCrash | None:
    """The first backtrace in ``tail`` (the input's last bytes, ending at line ``last_line``) whose innermost verbs
    frame has an NCCL frame further out; None when there is none (see the module docstring)."""
    if not any(literal in tail for literal in VERBS_LITERALS):
        return None
    lines = [ln[:MAX_TAIL_LINE_CHARS].rstrip("\r") for ln in tail.decode("utf-8", errors="replace").split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    first_no = last_line - len(lines) + 1
    lines = _unwrapped(lines)
    verbs: tuple[int, str, str] | None = None  # (index, pasted, call) of this backtrace's innermost verbs frame
    # ... that has a symbol: the call a reader knows (ibv_get_device_list), where the innermost is an offset
    last_frame = -MAX_FRAME_GAP - 1
    start = 0  # index of this backtrace's first frame
    for i, raw in enumerate(lines):
        text = strip_paste(raw)
        got = _frame(text)
        if got is None:
            continue
        if i - last_frame > MAX_FRAME_GAP:  # a new backtrace
            verbs, start = None, i
        last_frame = i
        lib, func = got
        if _is_verbs(lib, func) and (verbs is None or (not _VERBS_FUNC.match(verbs[2]) and _VERBS_FUNC.match(func))):
            verbs = (i, text.strip(), func if _VERBS_FUNC.match(func) else lib)
        elif verbs is not None and _is_nccl(lib, func):
            signal_line, signal = 0, ""
            for j in range(start - 1, max(-1, start - 1 - MAX_SIGNAL_LOOKBACK), -1):
                if _SIGNAL.search(lines[j]):
                    signal_line, signal = first_no + j, strip_paste(lines[j]).strip()
                    break
            return VerbsCrash(name, file_index, first_no + verbs[0], verbs[1], verbs[2], first_no + i, text.strip(),
                              lib or func, signal_line, signal, file_rank)
    return None
