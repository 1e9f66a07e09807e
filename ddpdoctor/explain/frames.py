"""A traceback cut before its message: what its last frames say (issue 33).

Users paste a traceback and stop before its last line (the message they thought was noise, or the comment box cut
it). The frames are still there, and the innermost frame of torch.distributed, DDP or torchrun code names the call
that failed: ``init_process_group`` or the env:// rendezvous (the processes could not meet, or the backend could
not start), DDP's constructor checking the parameters' shapes across ranks (its first collective), a collective
such as ``all_reduce``, torchrun raising ``ChildFailedError`` (a worker failed). That is a guess, never as certain as
a message: the diagnosis made from it says so in its title, quotes the frame, and ranks below every diagnosis made
from a real message (a ``symptom`` with the lowest precedence, explained by any cause or crash).

Read from the input's last bytes the scanner keeps anyway (no further pass): the last ``Traceback (most recent
call last):`` header there, followed only by frames (``File "...", line N, in F`` and the code lines under them)
up to the end of the input, is a cut traceback. Frames that only pass the call on (c10d's logging wrapper,
``Module._call_impl``, torchrun's ``@record``) are skipped; the innermost other frame is classified by its file,
function and code line (a user's own ``dist.init_process_group(...)`` line counts: the paste may stop before
torch's frames). An innermost frame that is no distributed call gives no guess: a cut traceback in the user's
model says nothing about DDP, unless the launcher said whose it is: torch.multiprocessing.spawn's "-- Process N
terminated with the following error:" right above the header says that process raised a Python exception
(``SPAWN_RAISED``), whatever its frames. Otherwise the innermost real frame is kept as ``RANK_RAISED``: in a job the
rest of the log shows to be distributed, a rank's traceback cut in its own code is that rank raising there, which
the ranking words as such (``ranking._cut_traceback_guesses``), and says nothing in a single-process log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddpdoctor.explain.lines import LINE_PREFIX_RANK, SPAWN_HEADER, rank_int, strip_paste
from ddpdoctor.explain.phases import LIGHTNING_INIT_LINE, MAX_TAIL_LINE_CHARS

TRACEBACK_HEADER = b"Traceback (most recent call last):"
# The stage of a cut traceback that mp.spawn reported as a process's exception (its frames name no distributed step).
SPAWN_RAISED = "spawn-raised"
# The stage of a cut traceback whose innermost real frame is the rank's own code (no distributed call).
RANK_RAISED = "rank-raised"
MAX_CUT_LINES = 400  # lines after the last header looked at: a deeper traceback is not a paste someone cut
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[\w<>.]+)\s*$')
# Where Python lives on Windows ("C:/Users/...", after _norm) and macOS (home folders, Homebrew, the framework build).
_WINDOWS_PATH = re.compile(r"^[A-Za-z]:/")
_MACOS_PATH = re.compile(r"^/Users/|^/opt/homebrew/|/Library/Frameworks/Python\.framework/")
# Lightning logs this on every rank right before init_process_group (lightning/fabric/utilities/distributed.py,
# _init_dist_connection; PyTorch Lightning 1.x's ddp plugins: "initializing ddp: ..."): a traceback right under it,
# cut in Lightning's own frames (trainer.fit, ...), is that call failing. On GPUs Lightning asks for nccl
# (get_default_process_group_backend_for_device), which its own "GPU available: True" and "LOCAL_RANK: R -
# CUDA_VISIBLE_DEVICES: [...]" lines show.
_LIGHTNING_CODE = ("pytorch_lightning/", "lightning/pytorch/", "lightning/fabric/")
_LIGHTNING_ON_GPU = re.compile(rb"GPU available: True|CUDA_VISIBLE_DEVICES: \[")
_NCCL_BACKEND = re.compile(r"""backend\s*=\s*["']nccl["']|["']nccl["']""")
# accelerate's PartialState creates the process group with the backend it chose: "nccl" whenever CUDA is available
# (accelerate/state.py: 0.25.0 PartialState.__init__, `self.backend = kwargs.pop("backend", "nccl")` then
# `init_process_group(backend=self.backend, ...)` at line 217; 1.15.0 _prepare_backend, `backend = "nccl"` under
# torch.cuda.is_available()), on Windows and macOS too, whose PyTorch builds have no NCCL.
_ACCELERATE_STATE = "accelerate/state.py"
MIN_WRAP_WIDTH = 60  # narrower lines are not taken for a terminal's wrap
_EXCEPTION_NAME = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning)\b")

# torch's own launcher and process code: a traceback cut there is the launcher's, not a rank's own code.
_LAUNCHER_CODE = ("torch/distributed/", "multiprocessing/", "/runpy.py")  # torch's and the standard library's

# Frames that pass a call on without being it.
_TRANSPARENT = (
    ("torch/distributed/c10d_logger.py", None),
    ("torch/nn/modules/module.py", None),
    ("torch/distributed/elastic/multiprocessing/errors/__init__.py", None),
    ("functools.py", None),
    ("torch/utils/_contextlib.py", None),
)


@dataclass(frozen=True)
class Stage:
    """A step of a distributed job that a frame can name, and what a failure there usually is."""

    key: str
    files: tuple[str, ...]  # path pieces (always with forward slashes)
    functions: frozenset[str]  # function names in those files (empty: any)
    code: re.Pattern[str] | None  # a call on the frame's code line, in any file


_COLLECTIVES = ("all_reduce|all_gather|all_gather_into_tensor|_all_gather_base|all_gather_object|reduce_scatter|"
                "reduce_scatter_tensor|_reduce_scatter_base|broadcast|broadcast_object_list|barrier|"
                "monitored_barrier|all_to_all|all_to_all_single|gather|gather_object|scatter|scatter_object_list|"
                "reduce|send|recv|isend|irecv|batch_isend_irecv")

# Innermost first: the first stage whose file/function or code line fits the frame is the guess.
STAGES = (
    Stage("worker-failed", ("torch/distributed/launcher/api.py",), frozenset({"launch_agent"}),
          re.compile(r"raise ChildFailedError\(")),
    Stage("rendezvous", ("torch/distributed/rendezvous.py", "torch/distributed/elastic/rendezvous/"),
          frozenset(), re.compile(r"\bTCPStore\(")),
    Stage("init", ("torch/distributed/distributed_c10d.py",),
          frozenset({"init_process_group", "_new_process_group_helper", "_store_based_barrier", "new_group"}),
          re.compile(r"\b(?:init_process_group|PartialState|init_distributed|initialize_model_parallel)\(")),
    # accelerate's state objects create the process group in their constructors (PartialState.__init__, 0.25;
    # _prepare_backend, 1.x): a traceback cut inside one (its code line cut too) is in that step.
    Stage("init", (_ACCELERATE_STATE,), frozenset({"__init__", "_prepare_backend"}), None),
    Stage("ddp-init", ("torch/nn/parallel/distributed.py", "torch/distributed/utils.py"),
          frozenset({"__init__", "_verify_param_shape_across_processes", "_sync_module_states",
                     "_sync_params_and_buffers", "_ddp_init_helper"}),
          re.compile(r"\b(?:DistributedDataParallel|DDP)\(")),
    Stage("collective", ("torch/distributed/distributed_c10d.py",), frozenset(_COLLECTIVES.split("|")),
          re.compile(rf"\b(?:dist|torch\.distributed|distributed)\.(?:{_COLLECTIVES})\(")),
)


@dataclass(frozen=True)
class CutTraceback:
    """A traceback at the end of an input with no exception line, and the distributed step its frames name."""

    file: str  # the input
    file_index: int
    line: int  # the frame's line in the input
    stage: str  # a Stage.key
    call: str  # the function (or the call on the code line) that names the stage
    frame: str  # the frame line as pasted
    code: str  # the code line under it ("" when cut)
    code_line: int  # its line in the input (0 when cut)
    rank: int | None
    platform: str = ""  # "windows" or "macos" when the frames' paths show it (PyTorch's builds there lack NCCL)
    names_nccl: bool = False  # a frame's code line asks for the nccl backend
    reported: str = ""  # the launcher's line that says the process raised (mp.spawn's), as pasted
    reported_line: int = 0  # its line in the input


def lightning_init_line(line: str) -> re.Match[str] | None:
    """Lightning's ``Initializing distributed: GLOBAL_RANK: R, ...`` line, when ``line`` ends with it."""
    m = LIGHTNING_INIT_LINE.search(line)
    return m if m is not None and not line[m.end():].strip() else None


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def _stage_of(path: str, func: str, code: str) -> tuple[str, str] | None:
    """(stage, call) for one frame, or None."""
    for stage in STAGES:
        if any(piece in path for piece in stage.files) and (not stage.functions or func in stage.functions):
            if stage.key == "worker-failed" and not (stage.code and stage.code.search(code)):
                continue  # launch_agent failing elsewhere (its rendezvous) is no worker's failure
            return stage.key, func
        if stage.code is not None and (m := stage.code.search(code)):
            return stage.key, m.group(0).rstrip("(").split(".")[-1].replace("raise ", "")
    return None


def cut_traceback(tail: bytes, last_line: int, name: str, file_index: int, file_rank: int | None) -> CutTraceback | None:
    """The cut traceback the input whose last bytes are ``tail`` ends with, if its frames name a distributed step
    (see the module docstring); ``last_line`` is the input's last line number (1-based)."""
    at = tail.rfind(TRACEBACK_HEADER)
    if at < 0:
        return None
    rest = tail[at:]
    if rest.count(b"\n") > MAX_CUT_LINES:
        return None
    # Each line cut to what the phases read of a tail line: no regex here is handed more (the linear-time rule).
    lines = [ln[:MAX_TAIL_LINE_CHARS] for ln in rest.decode("utf-8", errors="replace").split("\n")]
    if lines and lines[-1].strip() == "":
        lines.pop()
    first_no = last_line - len(lines) + 1
    frames: list[tuple[int, str, str, str, str, int]] = []  # (line no., path, func, frame line, code line, its no.)
    rank = file_rank
    width = max((len(raw.rstrip("\r")) for raw in lines), default=0)  # a terminal's width, if it wrapped them
    body: list[tuple[int, str, str]] = []  # (index, the line as pasted, the line without what pasting added)
    above = 0  # the length of the line above, as pasted
    for i, raw in enumerate(lines[1:], start=1):
        wrapped, above = above == width >= MIN_WRAP_WIDTH, len(raw.rstrip("\r"))
        text = strip_paste(raw.rstrip("\r"))
        if (prefix := LINE_PREFIX_RANK.match(text)) is not None:  # torchrun's [rankN]:, mpirun's [1,N]<stderr>:
            rank = rank_int(prefix.group(1) or prefix.group(2) or prefix.group(3) or "")
            text = text[prefix.end():]
            text = text.removeprefix(" ")
        if not text.strip():
            continue
        # The rest of the line above that a terminal wrapped: the line above as wide as the widest, this one no
        # exception's name, and no code line under a frame line that was whole.
        if (body and wrapped and not _EXCEPTION_NAME.match(text)
                and not (_FRAME.match(body[-1][2]) and text[:1].isspace())):
            j, pasted, joined = body[-1]
            body[-1] = (j, pasted + text, joined + text)
            continue
        if not text[:1].isspace():
            return None  # at the margin: the exception line (or anything else): the traceback is not cut
        body.append((i, raw.strip(), text))
    for i, pasted, text in body:
        if m := _FRAME.match(text):
            frames.append((first_no + i, _norm(m.group("file")), m.group("func"), pasted, "", 0))
        elif frames and not frames[-1][4] and not text.strip().startswith(("^", "~", "File ")):
            n, path, func, frame, _, _ = frames[-1]
            frames[-1] = (n, path, func, frame, text.strip(), first_no + i)
        # a cut 'File "...' line (the paste's last) or a caret line: nothing to read
    # torch.multiprocessing.spawn reports a process that raised as "-- Process N terminated with the following
    # error:" and that process's traceback: whatever the frames, process N raised a Python exception.
    before = tail[:max(0, tail.rfind(b"\n", 0, at))].rstrip(b"\r")  # up to the header's line, whatever prefixes it
    above_header = before[before.rfind(b"\n") + 1:][:MAX_TAIL_LINE_CHARS].decode("utf-8", "replace")
    spawn = SPAWN_HEADER.search(above_header)
    lightning = lightning_init_line(above_header)
    for n, path, func, frame, code, code_no in reversed(frames):
        if any(piece in path for piece, _ in _TRANSPARENT):
            continue
        got = _stage_of(path, func, code)
        if got is None and spawn is not None:  # the spawn line is the one above the header (line first_no)
            return CutTraceback(name, file_index, n, SPAWN_RAISED, func, frame, code, code_no, int(spawn.group(1)),
                                reported=spawn.string.strip(), reported_line=first_no - 1)
        if got is None and lightning is not None and any(piece in path for piece in _LIGHTNING_CODE):
            got = ("init", "init_process_group")  # Lightning's init line right above, its frames cut
            if rank is None:
                rank = rank_int(lightning.group("rank"))
        if got is None:  # the innermost real frame is no distributed call: the rank raised in its own code
            if any(piece in path for piece in _LAUNCHER_CODE):
                return None  # torchrun's own traceback (its agent, its metrics wrapper): no rank's
            return CutTraceback(name, file_index, n, RANK_RAISED, func, frame, code, code_no, rank)
        stage, call = got
        reported, reported_line = ("", 0) if lightning is None else (above_header.strip(), first_no - 1)
        paths = [f[1] for f in frames]
        platform = ("windows" if any(_WINDOWS_PATH.match(p) for p in paths)
                    else "macos" if any(_MACOS_PATH.search(p) for p in paths) else "")
        # accelerate asks for nccl whenever CUDA is available, so a cut in its state's set-up counts as asking.
        nccl = (any(_NCCL_BACKEND.search(f[4]) or f[1].endswith(_ACCELERATE_STATE) for f in frames)
                or (lightning is not None and _LIGHTNING_ON_GPU.search(before) is not None))
        return CutTraceback(name, file_index, n, stage, call, frame, code, code_no, rank, platform, nccl, reported,
                            reported_line)
    return None
