"""What one log line says apart from its message: the rank, the time, what pasting put in front of it.

Ranks come from, in order: the signature's own ``rank`` group, torchrun's ``[rank3]:`` line prefix (also
``[default3]:`` and Open MPI's ``[1,3]<stdout>:``), the file name (``rank3.log``, ``*_rank_3*``, torchrun
``--log-dir`` layout ``attempt_0/3/stderr.log``), ProcessGroupNCCL's ``[Rank 3]`` / ``[PG ... Rank 3]``,
and ``rank 3`` in NCCL lines. Pure functions of text: the scanner and the ranking use them.
"""

from __future__ import annotations

import itertools
import re
import signal as _signal

MAX_RANK_DIGITS = 7

MIN_WRAP_CHARS = 60

LINE_PREFIX_RANK = re.compile(
    r"^\s*\[(?:rank|default)(\d{1,7})\]:|^\[\d+,(\d{1,7})\]<std(?:out|err)>:|^\[RANK (\d{1,7})\]")
# SLURM's `srun --label` puts the task id in front of every line: "10: ..."; the task id is the rank.
SRUN_LABEL = re.compile(r"^(\d{1,6}): ")
# What users paste around the real line, stripped before matching (repeatedly, outermost first): "> " quote
# marks, pasted line numbers ("[80746] ", "1743] "), srun's "10: " label, Ray's "(RayWorker pid=7046, ip=...) ", pytest's
# "E       ", vLLM-style "ERROR 04-15 00:31:11 worker_base.py:574] " and glog "E0325 20:57:27.62 2606 api.py:869] ".
# And what a log collector puts in front of every line of a whole log (a paste from a cluster's or a CI's log
# viewer): an RFC 3339 time stamp, bare or in brackets (`docker logs -t` and `kubectl logs --timestamps`:
# RFC3339Nano, "2024-05-01T10:00:00.123456789Z "; GitHub Actions' raw logs, "2024-05-01T10:00:00.1234567Z "; a
# `[%(asctime)s] ` logger, "[2024-05-01 10:00:00,123] "), docker compose's service column ("trainer-1  | ":
# cmd/formatter/logs.go, `%-{width}s | `), `kubectl logs --prefix`'s "[pod/NAME/CONTAINER] "
# (kubectl pkg/cmd/logs/logs.go, addPrefixIfNeeded), docker's json-file records as stored on the host
# ('{"log":"...\\n","stream":"stderr","time":"..."}', moby daemon/logger/jsonfilelog; their escapes are read by
# `unflatten`), the CRI log format of a Kubernetes node's /var/log/containers ("2024-05-01T10:00:00.123456789Z
# stderr F ": containerd and CRI-O, a time stamp, the stream and a full/partial tag), and journald's / syslog's
# short format
# ("May 01 10:00:00 node1 python[1234]: "). These and Ray's may follow the indentation of a paste indented as a
# whole (a Markdown code block written by indenting every line four spaces); the short ones ("[2] ", "10: ") may not:
# indented, they are a message's own text (the desync report's "\t     [2] finished collective #5, ...").
PASTE_PREFIX = re.compile(
    r"^(?:>+ ?"
    r"|\[?\d{1,7}\][ \t]"
    r"|\d{1,7}:[ \t]"
    r"|E {3,}"
    r"|[A-Z]{4,8} \d\d-\d\d \d\d:\d\d:\d\d [\w.]+:\d+\] "
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] "
    r"|[ \t]*(?:\(\w+ pid=\d+(?:, ip=[\d.]+)?\) ?"
    r"|\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?\]?[ \t](?:std(?:out|err) [FP] )?"
    r"|[\w.-]{1,64} +\| "
    r"|\[pod/[\w.-]{1,253}/[\w.-]{0,63}\] "
    r"|\{\"log\": ?\""
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]{1,64} [\w./-]{1,64}(?:\[\d{1,9}\])?: ))")
# Terminal colours (SGR: "\x1b[31m", "\x1b[1;36m", "\x1b[0m") that a log written by a colouring logger or
# Ray's coloured actor prefixes keeps, also where the page they were copied from dropped the ESC byte ("[36m").
ANSI_SGR = re.compile(r"\x1b?\[\d{1,3}(?:;\d{1,3}){0,4}m|\x1b\[[\d;]{0,16}[A-HJKSTfhl]")
# A log that shows no sign of a distributed job (no rank, launcher or process group): a CUDA error or a Python
# exception in it is not a DDP problem. The launchers are named by what only their runs print: torch's
# mp.spawn (torch/multiprocessing/spawn.py; the standard library's multiprocessing/spawn.py also starts
# DataLoader workers on Windows and macOS), `accelerate launch` (accelerate/commands/launch.py; a
# site-packages/accelerate/ frame is also in single-GPU runs of the HF Trainer), deepspeed's launcher, and
# Lightning asked for more than one GPU (`You requested gpu: [0, 1]`, fabric/utilities/device_parser.py: its
# accelerator connector picks the ddp strategy for more than one device and launches a process per device;
# a request of one GPU is a single-process run). Per-rank line prefixes are signs too: torchrun's
# `--tee`/`--log-line-prefix-template` `[default3]:`, Open MPI's `--tag-output` `[1,3]<stdout>:` (mpirun,
# horovodrun); and what the frameworks log only when the job is distributed: Lightning's `Initializing
# distributed: GLOBAL_RANK: 0, MEMBER: 1/2` (fabric/utilities/distributed.py), accelerate's `Distributed
# environment: MULTI_GPU` (state.py; `NO` for one process), the HF example scripts' `distributed training:
# True`, and the rendezvous variables MASTER_ADDR / MASTER_PORT. And a traceback through DDP's own module
# (torch/nn/parallel/distributed.py: DistributedDataParallel.forward, _pre_forward; a rank that pastes only its
# own traceback shows it) or Lightning's DDP strategy (lightning/pytorch/strategies/ddp.py, ddp_spawn.py).
DIST_CONTEXT = re.compile(
    rb"torch[./\\]distributed|torchrun|\[rank\d|\[RANK \d|ProcessGroup|NCCL|[Rr]ank \d|local_rank|LOCAL_RANK"
    rb"|DistributedDataParallel|init_process_group|torch[./\\]multiprocessing[./\\]spawn|WORLD_SIZE|deepspeed"
    rb"|accelerate[./\\]commands[./\\]launch|accelerate launch|requested gpu: \[\d, \d|requested GPUs: \[\d, \d"
    rb"|\[default\d\]:|\[default\d\d\]:|\]<stdout>:|\]<stderr>:|GLOBAL_RANK: \d|distributed training: True"
    rb"|Distributed environment: MULTI_|Distributed environment: DistributedType.MULTI_|Distributed environment: DEEPSPEED"
    rb"|Distributed environment: FSDP|MASTER_ADDR|MASTER_PORT"
    rb"|torch[./\\]nn[./\\]parallel[./\\]distributed\.py|strategies[./\\]ddp"
    # Lightning's launchers of the processes of a multi-device strategy (strategies/launchers/: the DDP strategy's
    # subprocess_script.py, ddp_spawn's multiprocessing.py), in a traceback's frames.
    rb"|strategies[./\\]launchers[./\\](?:subprocess_script|multiprocessing)\.py"
    # Frameworks that only run as a multi-process job (their code in a frame path or a package name): Megatron
    # (megatron/core, Megatron-LM, Pai-Megatron-Patch's megatron_patch, class names such as MegatronGPTModel or a
    # Ray actor's MegatronPolicyTrainer), ColossalAI, torchtitan, nanotron,
    # fairscale, Horovod; and the variables of the MPI and Slurm launchers.
    rb"|[Mm]egatron[A-Z./\\_-]|colossalai[./\\]|torchtitan[./\\]|nanotron[./\\]|fairscale[./\\]|horovod[./\\]"
    # verl's workers and controller (Ray actors of an FSDP or Megatron job: verl/workers/fsdp_workers.py,
    # verl/single_controller/); torch.distributed's own exception types, also as a Ray task error's cause
    # (ray.exceptions.RayTaskError(DistBackendError)).
    rb"|verl[./\\](?:workers|single_controller|trainer)[./\\]|Dist(?:Backend|Network|Store)Error"
    rb"|SLURM_PROCID|OMPI_COMM_WORLD_"
    # c10d and gloo exist only for process groups (and NCCL's library in a native backtrace, libnccl.so: it is
    # loaded when a process group or DataParallel's broadcast uses it); DGL's distributed graph store (its
    # dgl.distributed package and the C++ RPC layer only it uses, dgl/src/rpc/); a torch.distributed call in a
    # traceback's source line.
    rb"|c10d|gloo[./\\]|libnccl|dgl[./\\]distributed|dgl[./\\]src[./\\]rpc[./\\]"
    rb"|\bdist\.(?:barrier|all_reduce|all_gather|broadcast|reduce_scatter|all_to_all|get_rank|get_world_size)\("
    # OpenMMLab's distributed entry points (mmcv/engine/test.py and mmdet/apis/test.py multi_gpu_test: "Test model
    # with multiple gpus", results collected by rank 0 through get_dist_info; mmcv.runner's init_dist), in a frame
    # or a code line, also as projects' copies (UniAD's custom_multi_gpu_test).
    rb"|multi_gpu_test\b|\binit_dist\(|\bget_dist_info\(")
# Literals every DIST_CONTEXT match contains. DIST_CONTEXT has no literal start, so `re` tries every
# alternative at every position: 22-38 MB/s over a log with no sign (a plain single-GPU run pays it on every
# block), against GB/s for `bytes.find` of a literal; the regex only confirms around each literal found.
DIST_LITERALS = (b"NCCL", b"rank", b"Rank", b"RANK", b"torch", b"ProcessGroup", b"DistributedDataParallel",
                 b"init_process_group", b"WORLD_SIZE", b"deepspeed", b"accelerate", b"requested", b"[default",
                 b"]<std", b"distributed training: True", b"Distributed environment: ", b"MASTER_", b"strategies",
                 b"egatron", b"colossalai", b"torchtitan", b"nanotron", b"fairscale", b"horovod", b"SLURM_PROCID",
                 b"OMPI_COMM_WORLD_", b"c10d", b"gloo", b"dist.", b"libnccl", b"dgl", b"verl",
                 b"DistBackendError", b"DistNetworkError", b"DistStoreError", b"multi_gpu_test", b"init_dist(",
                 b"get_dist_info(")
DIST_WINDOW = 32  # bytes either side of a literal: more than the longest DIST_CONTEXT alternative
DIST_MAX_CANDIDATES = 256  # literals found but not confirmed (torch/nn/... frames): then one regex pass
# mp.spawn: the traceback after "-- Process 3 terminated with the following error:" is rank 3's.
# What starts a new log line, never the middle of a wrapped one: a glog or ISO time stamp, an NCCL
# "host:pid:tid [dev] NCCL" header, a traceback's header.
LINE_HEADER = re.compile(
    r"\[?[IWEF]\d{4} \d\d:\d\d:\d\d|\[?\d{4}-\d\d-\d\d[ T]\d\d:|[\w.-]+:\d+:\d+ \[\d+\] NCCL |Traceback \(most"
    # a field of torchrun's failure summary (torch/distributed/elastic/multiprocessing/errors/__init__.py): the line
    # under a long `error_file: /tmp/torchelastic_.../error.json` is `traceback : Traceback ...`, never its wrap
    r"|\s{2}(?:time|host|rank|exitcode|error_file|traceback)\s*: ")
SPAWN_HEADER = re.compile(r"Process (\d{1,7}) terminated with the following error")
PG_RANK = re.compile(r"\[(?:PG [^\]\[]*?)?Rank (\d{1,7})\]")
NCCL_RANK = re.compile(r"\brank (\d{1,7})\b")
FILE_RANK = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,7})(?!\d)", re.IGNORECASE)
# torchrun --log-dir: {log_dir}/{run_id}_{suffix}/attempt_{n}/{local_rank}/{stdout,stderr}.log
LOGDIR_RANK = re.compile(r"attempt_\d+[/\\](\d{1,7})[/\\](?:stdout\.log|stderr\.log|error\.json)$")
# torchrun failure summary, see torch/distributed/elastic/multiprocessing/errors/__init__.py
SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d{1,7})(?!\d)")
SUMMARY_ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")
SUMMARY_TIME = re.compile(r"^\s*time\s*:\s*(\S+)")  # "  time      : 2026-11-22_03:02:29"
# A Python exception's last line: "torch.OutOfMemoryError: CUDA out of memory. ...", "KeyError: 'RANK'".
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<exception>[A-Z]\w*(?:Error|Exception|Interrupt|Exit))"
                            r"(?:: (?P<message>.*))?$")
# The same exception's name twice back to back (``RuntimeErrorRuntimeError: ...``): several processes wrote their
# exception lines into one stream at the same moment (ranks launched without per-rank prefixes), as interleaved
# tracebacks are. One process prints its exception line whole, so this is a sign of a multi-process job.
SEVERAL_WRITERS = re.compile(r"((?:[A-Z][a-z0-9]*)+(?:Error|Exception))\1")
MAX_GLUED_NAME_CHARS = 200  # two glued names longer than this are not read as one (the regex backtracks on names)


def one_writer(exception: str, message: str) -> tuple[str, str]:
    """An exception line's type and message as one process wrote them, when several writers glued theirs
    (``RuntimeErrorRuntimeError: RuntimeError/path...`` -> ``RuntimeError``, ``/path...``); unchanged otherwise."""
    twice = SEVERAL_WRITERS.match(exception[:MAX_GLUED_NAME_CHARS + 1])
    if twice is None or twice.end() != len(exception):
        return exception, message
    exception = twice.group(1)
    while message.startswith(exception):
        message = message[len(exception):].lstrip(": ")
    return exception, message


# An exception's last line glued onto the line above it by the paste: the traceback's source line, a run of the
# spaces that padded it to the terminal's or the page's width, then "AttributeError: 'NoneType' object has no
# attribute 'dtype'" (a thread excerpt or a comment box that lost the line break and kept the padding). Four
# spaces at least, after text, and a message: indentation and "x = f(y)  # ValueError" comments are not it.
GLUED_EXCEPTION = re.compile(r"\S {4,}((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): \S.*)$")
# Where a line that a paste flattened (a comment box or a thread's excerpt that lost the line breaks) holds the start
# of another log line: Python logging's default "ERROR:torch.distributed.elastic...:", a glog header, a traceback's
# header, torchrun's "[rank3]: " prefix, each after text and a space. Each piece is matched on its own, so two
# messages on one flattened line are both read (a watchdog timeout, then torchrun's "failed (exitcode: 1)").
EMBEDDED_LINE_START = re.compile(r"(?<=\S)[ \t]+(?=(?:ERROR|WARNING|CRITICAL|INFO):[\w.]+:|\[?[EWFI]\d{4} \d\d:\d\d:\d\d\.\d{3}"
                                 r"|Traceback \(most recent call last\):|\[rank\d{1,7}\]: )")
MAX_EMBEDDED_LINES = 32  # pieces read of one flattened line: its first and last ones (an error ends a log)


def embedded_lines(text: str) -> list[str]:
    """``text`` cut where another log line starts inside it (``EMBEDDED_LINE_START``); ``[text]`` when none does.
    Of more than ``MAX_EMBEDDED_LINES`` pieces, the first and the last half of that are kept (a line's cost
    stays bounded; a failure is most often at a log's end)."""
    starts = [m.end() for m in EMBEDDED_LINE_START.finditer(text)]
    if not starts:
        return [text]
    bounds = [0, *starts, len(text)]
    pieces = [text[a:b].rstrip() for a, b in itertools.pairwise(bounds) if text[a:b].strip()]
    half = MAX_EMBEDDED_LINES // 2
    return pieces if len(pieces) <= MAX_EMBEDDED_LINES else pieces[:half] + pieces[-half:]


# glog "E1122 01:39:40.561000" (optionally after "[rank0]:[") and ISO-ish "2026-11-22 01:39:40,123"
GLOG_TIME = re.compile(r"(?:^|[\[\s:])[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?")
ISO_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?")
SIGTERM_LIKE = {int(_signal.SIGTERM), int(_signal.SIGINT), int(_signal.SIGHUP)}
# The level a line was printed at, by the first level mark in it (see quiet_level). Quiet: glog W/I and
# torch._logging's V (debug) ("[W1122 ...", "I1122 ...", "V1126 ...", "[W socket.cpp:462]"), Python
# warnings ("UserWarning: ", TORCH_WARN's "Warning: "), logging's WARNING/INFO/DEBUG ("WARNING:root:", "[INFO]", " - WARNING - ", "WARNING 04-15").
# Loud: glog E/F, ERROR/CRITICAL, "SomeError: " / "SomeException: " (or an exception's repr, "SomeError('..."), and
# NCCL's "NCCL WARN", which is how
# NCCL reports its errors (src/include/debug.h: WARN is its error level).
# A level word followed by "or"/"and"/"to"/"level" is prose naming a level ("set TORCH_DISTRIBUTED_DEBUG to
# either INFO or DETAIL", the tail of the reducer's unused-parameter error), not the line's own level.
LEVEL_MARK = re.compile(
    r"(?P<quiet>(?:^|[\[\s:])[WIV]\d{4} \d\d:\d\d:\d\d|\[[WIV] [\w./-]+:\d+\]|\b\w*Warning: |\b(?:WARNING|INFO|DEBUG)\b(?=[:\] -])(?! (?:or|and|to|level)\b))"
    r"|(?P<loud>NCCL WARN|(?:^|[\[\s:])[EF]\d{4} \d\d:\d\d:\d\d|\[[EF] [\w./-]+:\d+\]|\b(?:ERROR|CRITICAL|FATAL)\b"
    r"|\w(?:Error|Exception)(?:: |\(['\"]))")
# A Python traceback frame: File "/workspace/train.py", line 212, in <module>
FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d{1,9}), in (?P<func>\S+)')
# Frames that are not the user's own code: torch (installed or a source tree), any installed package, the
# standard library, frozen and generated code.
LIBRARY_PATH = re.compile(r"[/\\](?:site|dist)-packages[/\\]|(?:^|[/\\])torch[/\\]|[/\\]lib[/\\]python\d[\d.]*[/\\]"
                          r"|^<|[/\\]Lib[/\\]")

def rank_from_path(path: str) -> int | None:
    """One file per rank: ``rank3.log``, ``train_rank_3.out``, torchrun ``attempt_0/3/stderr.log``."""
    m = LOGDIR_RANK.search(path)
    if m:
        return int(m.group(1))
    base = re.split(r"[/\\]", path)[-1]
    m = FILE_RANK.search(base)
    return int(m.group(1)) if m else None

def timestamp(text: str) -> tuple[int, ...] | None:
    m = ISO_TIME.search(text)
    if m:
        return (int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)), int(m.group(6)),
                int((m.group(7) or "0").ljust(9, "0")[:9]))
    m = GLOG_TIME.search(text)
    if m:
        return (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                int((m.group(6) or "0").ljust(9, "0")[:9]))
    return None

def quiet_level(text: str) -> bool:
    """Whether the line was printed as a warning or an info line rather than an error (by its first level
    mark; a line with none is an error: an exception's last line, NCCL's error texts, torchrun's summary)."""
    m = LEVEL_MARK.search(text[:MAX_LEVEL_CHARS])
    return m is not None and m.group("quiet") is not None


MAX_LEVEL_CHARS = 512  # the level mark sits near the start; a bound keeps the search linear


def user_frame(lines: list[str]) -> str | None:
    """``path:line in function`` of the innermost frame outside torch, installed packages and the standard
    library, from the traceback lines above an exception (nearest first, rank prefixes stripped), or None.

    Stops at the traceback's header: what lies above it belongs to another message."""
    for ln in lines:
        if ln.startswith("Traceback (most recent call last)"):
            return None
        m = FRAME.match(ln)
        if m and not LIBRARY_PATH.search(m.group("path")):
            return f"{m.group('path')}:{m.group('line')} in {m.group('func')}"
    return None


def signal_name(digits: str) -> str:
    number = rank_int(digits)
    try:
        return _signal.Signals(number).name if number is not None else f"signal {digits[:MAX_RANK_DIGITS]}..."
    except ValueError:
        return f"signal {number}"


def rank_int(digits: str) -> int | None:
    """A rank (or a signal number) from a regex group; None for an absurdly long run of digits."""
    return int(digits) if digits.isdecimal() and len(digits) <= MAX_RANK_DIGITS else None

def has_dist_sign(block: bytearray, size: int) -> bool:
    """Whether ``block[:size]`` shows a sign of a distributed job (``DIST_CONTEXT``), at ``bytes.find`` speed.

    Each literal of ``DIST_LITERALS`` is searched; the regex confirms in a small window around each hit.
    Past ``DIST_MAX_CANDIDATES`` unconfirmed hits (a log full of ``torch/nn/...`` frames) one regex pass
    over the block decides: never slower than that pass alone, which is all there was before.
    """
    candidates = 0
    for literal in DIST_LITERALS:
        at = block.find(literal, 0, size)
        while at >= 0:
            if DIST_CONTEXT.search(block, max(0, at - DIST_WINDOW), min(size, at + len(literal) + DIST_WINDOW)):
                return True
            candidates += 1
            if candidates > DIST_MAX_CANDIDATES:
                return DIST_CONTEXT.search(block, 0, size) is not None
            at = block.find(literal, at + 1, size)
    return False


_TRACEBACK_HEADER = b"Traceback (most recent call last):"
MAX_TRACEBACK_HEADERS = 64  # headers looked at per block: interleaving shows at the first few
_FRAME_LINE = re.compile(rb'^\s*File "[^"\n]*", line \d+')
# A traceback's last line, as Python prints it at the margin: `pkg.SomeError: message` or a bare `SomeError`.
_EXCEPTION_LINE = re.compile(rb"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\b")


def _bare(raw: bytes | bytearray) -> bytes:
    """A line of a block without its line end and what pasting put in front of it (see ``strip_paste``)."""
    text = bytes(raw[:MAX_LEVEL_CHARS]).rstrip(b"\r")
    return strip_paste(text.decode("utf-8", "replace")).encode("utf-8", "replace")


# A terminal's wrap: at least this many lines exactly as wide as the widest line of the block (every piece a
# terminal cut a long line into is that wide, but its last).
MIN_WRAPPED_LINES = 3


def terminal_unwrapped(block: bytes | bytearray, size: int) -> bytes | None:
    """``block[:size]`` with the lines a terminal wrapped joined again, or None when it shows no such wrap.

    A log copied from a terminal ``W`` columns wide has its long lines cut into ``W``-character pieces (xterm, tmux
    and VS Code's terminal put no marker on the clipboard): no line is wider than ``W``, and several are exactly
    ``W`` wide (``MIN_WRAPPED_LINES``, ``W >= MIN_WRAP_CHARS``). Each such line is joined with the one after it. For
    the signs of a distributed job only (``has_dist_sign``): a path such as ``.../pytorch_lightning/stra`` +
    ``tegies/launchers/subprocess_script.py`` holds its sign again. Linear in the block; run once an input, and
    only when the block as it is showed no sign."""
    lines = bytes(block[:size]).split(b"\n")
    widths = [len(ln.rstrip(b"\r")) for ln in lines]
    width = max(widths, default=0)
    if width < MIN_WRAP_CHARS or widths.count(width) < MIN_WRAPPED_LINES:
        return None
    return b"".join(ln.rstrip(b"\r") if w == width else ln + b"\n" for ln, w in zip(lines, widths, strict=True))


def interleaved_tracebacks(block: bytes | bytearray, size: int) -> bool:
    """Whether two tracebacks are interleaved in ``block[:size]``: a ``Traceback (most recent call last):``
    header right after another header or inside another traceback's frames (after a ``File "...", line N``
    line or the code line under it). One Python process prints a traceback whole, ending with its exception
    line; several processes writing to one stream (ranks of a job launched without per-rank prefixes) cut
    each other's tracebacks like this. A sign of a multi-process job, as strong as a rank prefix.

    Also two headers each right after the same exception line (``AssertionError`` then ``Traceback ...``, twice):
    one process prints one uncaught traceback and exits, and Python separates chained ones with "During handling
    of the above exception ..." lines, so the same exception ending traceback after traceback back to back is
    several processes (ranks) failing alike, printed one after another rather than cut into each other."""
    at = block.find(_TRACEBACK_HEADER, 0, size)
    seen = 0
    endings: set[bytes] = set()  # exception lines seen right above a header
    while at >= 0 and seen < MAX_TRACEBACK_HEADERS:
        seen += 1
        end = block.rfind(b"\n", 0, at) if at else -1
        if end > 0:
            start = block.rfind(b"\n", 0, end) + 1
            # What pasting put in front of every line ('> ', '[40] ', a collector's time stamp) is not the line's.
            above = _bare(block[start:end])
            if _TRACEBACK_HEADER in above or _FRAME_LINE.match(above):
                return True
            if _EXCEPTION_LINE.match(above.lstrip()):  # lstrip: a paste indented as a whole
                if above in endings:
                    return True
                endings.add(above)
            if above[:4] == b"    " and start > 0:  # the code line under a frame
                pstart = block.rfind(b"\n", 0, start - 1) + 1
                if _FRAME_LINE.match(_bare(block[pstart:start - 1])):
                    return True
        at = block.find(_TRACEBACK_HEADER, at + 1, size)
    return False


def wraps_onto(above: str, below: str) -> bool:
    """Whether ``below`` may be the rest of ``above`` that a terminal wrapped onto the next line."""
    return (len(above) >= MIN_WRAP_CHARS and 0 < len(below) <= len(above) and bool(below.strip())
            and not LINE_PREFIX_RANK.match(below) and not LINE_HEADER.match(below))

# What a rich-text editor, a chat client or a web page makes of a pasted message's ASCII: curly quotes for ' and "
# (macOS / iOS smart punctuation, word processors: "doesn’t have NCCL built in"), no-break and thin spaces for
# spaces, and zero-width characters that come with copying from rendered HTML. Templates are read through it too:
# a source may print a curly quote itself (accelerate's "SageMaker doesn’t support ...").
TYPOGRAPHIC = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                              "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2033": '"', "\u00a0": " ",
                              "\u202f": " ", "\u2009": " ", "\u200b": None, "\u200c": None, "\u200d": None,
                              "\ufeff": None})


def strip_paste(text: str) -> str:
    """The line without what pasting added in front of it (quote marks, line numbers, runner and collector
    prefixes) and without terminal colour codes anywhere in it."""
    if "[" in text and ANSI_SGR.search(text):
        text = ANSI_SGR.sub("", text)
    if not text.isascii():
        text = text.translate(TYPOGRAPHIC)
    for _ in range(6):  # "> [12] (Actor pid=1) ..." nests a few; a bound keeps it linear
        m = PASTE_PREFIX.match(text)
        if m is None or not m.end():
            break
        text = text[m.end():]
    return text


# A line a paste flattened: the lines of a traceback or a log joined with a literal "\n" (a JSON string, such as
# torchrun's error file or a log collector's record; a Python repr of the text, a list of lines). Such a line is
# known by a "\n" before what starts a line of a log (indentation, "[rank3]:", a capital: "  File ...",
# "Traceback ...", "RuntimeError: ..."), another escape, or its end; not by a Windows path's "\nccl" or "\new".
_ESCAPED_BREAK = re.compile(rb"\\n(?=[ \t\[A-Z\"']|\\[ntr]|\r?$)", re.MULTILINE)
_ESCAPE = re.compile(rb"""\\([ntr"'\\])""")
# The end of a docker json-file record: its line's own "\n", the stream and the time (moby's JSONLog).
_DOCKER_RECORD_END = re.compile(rb'\\n","stream":"\w{1,16}","time":"[^"]{0,64}"\}\r?$')
_UNESCAPED = {b"n": b"\n", b"t": b"\t", b"r": b"\r", b'"': b'"', b"'": b"'", b"\\": b"\\"}


# What a log picks up when it is copied from a web page, a chat or a document rather than a terminal: the
# characters of ``TYPOGRAPHIC`` (curly quotes, no-break and zero-width spaces), and HTML's escapes of the quote and
# angle-bracket characters every traceback holds (`in &lt;module&gt;`, `&#39;NoneType&#39; object`). Either keeps
# a keyword from the prefilter and a message from its pattern; read as the characters they stand for (``&amp;``
# last, so that an escaped escape stays one level escaped). Per line, ``strip_paste`` reads TYPOGRAPHIC too.
_WEB_CHARS = tuple((chr(code).encode(), (plain or "").encode()) for code, plain in TYPOGRAPHIC.items())
_WEB_LEADS = tuple({encoded[:1] for encoded, _ in _WEB_CHARS})  # b"\xc2", b"\xe2", b"\xef": found by memchr
_WEB_CHAR = re.compile(b"|".join(re.escape(encoded) for encoded, _ in _WEB_CHARS))
_HTML_ESCAPES = ((b"&lt;", b"<"), (b"&gt;", b">"), (b"&quot;", b'"'), (b"&#39;", b"'"), (b"&#x27;", b"'"),
                 (b"&#34;", b'"'), (b"&apos;", b"'"), (b"&amp;", b"&"))
_HTML_ESCAPE = re.compile(b"|".join(re.escape(escaped) for escaped, _ in _HTML_ESCAPES))


# A stretch of a block at least this long has its line breaks counted with numpy: bytes.count of one byte is a
# plain C loop (~1.5 GB/s: 2-3 ms of a 4 MB block, a sixth of a healthy log's scan), numpy's compare and count run
# at ~5 GB/s. Shorter stretches (between two hits) keep bytes.count; numpy is imported only for a large input.
NUMPY_COUNT_MIN_BYTES = 1 << 18


def newlines(block: bytes | bytearray, start: int, end: int) -> int:
    """How many ``\n`` bytes ``block[start:end]`` holds (the line numbers of the hits after it)."""
    if end - start < NUMPY_COUNT_MIN_BYTES:
        return block.count(b"\n", start, end)
    import numpy as np

    return int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8, count=end - start, offset=start) == 10))


def from_the_web(block: bytes | bytearray, size: int) -> bytearray | None:
    """``block[:size]`` with a web copy's typographic characters and HTML escapes read as plain text, or None
    when it has none. An ASCII log without ``&`` costs four one-byte ``find`` passes (memchr, ~20 GB/s); one
    regex pass confirms a lead byte (a tqdm bar's, a dash) or an ``&`` before anything is copied."""
    web = (any(block.find(lead, 0, size) >= 0 for lead in _WEB_LEADS)
           and _WEB_CHAR.search(block, 0, size) is not None)
    escapes = block.find(b"&", 0, size) >= 0 and _HTML_ESCAPE.search(block, 0, size) is not None
    if not web and not escapes:
        return None
    data = bytes(block[:size])
    for pairs, wanted in ((_WEB_CHARS, web), (_HTML_ESCAPES, escapes)):
        for escaped, plain in pairs if wanted else ():
            data = data.replace(escaped, plain)
    return bytearray(data)


def unflatten(block: bytes | bytearray, size: int) -> bytearray | None:
    """``block[:size]`` with each flattened line (see ``_ESCAPED_BREAK``) unescaped into the lines it joined
    (``\\n``, ``\\t``, ``\\r``, ``\\"``, ``\\'``, ``\\\\`` read as JSON and Python write them), or None when it has none.
    Line numbers then count the lines it held."""
    data = bytes(block[:size])
    if _ESCAPED_BREAK.search(data) is None:
        return None
    out = []
    for line in data.split(b"\n"):
        if b"\\n" in line and _ESCAPED_BREAK.search(line):
            line = _ESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], _DOCKER_RECORD_END.sub(b"", line, count=1))
        out.append(line)
    return bytearray(b"\n".join(out))
