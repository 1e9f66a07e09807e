"""Regenerate ``tests/data/explain_inventory/``: every error/warning text the sources can print, as templates.

``explain`` is only as good as the messages it knows (issue 26). This script reads the sources that print
what a distributed PyTorch job's log holds and writes one JSON-lines file per source, one entry per message:
``{"source", "project", "version", "commit", "file", "line", "kind", "level", "exception", "template"}``.
A template is the message's literal text with ``{}`` where the code formats a value in; no code is copied.

Usage (each SOURCE=PATH[@REV]; PATH is a directory or a bare git directory as the `fetch` tool brings it,
REV a commit or tag of that git directory; only the sources given are rewritten; a source given twice reads
its trees in that order, a file of the first hiding the same path in the next)::

    T=.venv/lib/python3.11/site-packages/torch   # the installed torch (2.13.0 here)
    python scripts/build_explain_inventory.py \\
        torch-python=$T torch-data=$T torch-cuda=$T torch-dynamo=$T \\
        torch-cpp=$T torch-cpp=/work/.mirror/jizhuoran+EasyFHE/repo \\
        nccl=/work/.mirror/NVIDIA+nccl/repo@v2.28.9-1 \\
        nccl+=/work/.mirror/NVIDIA+nccl/repo@v2.27.7-1 nccl+=/work/.mirror/NVIDIA+nccl/repo@v2.26.2-1 \\
        nccl+=/work/.mirror/NVIDIA+nccl/repo@v2.21.5-1 nccl+=/work/.mirror/NVIDIA+nccl/repo@v2.20.5-1 \\
        nccl+=/work/.mirror/NVIDIA+nccl/repo@v2.18.3-1 nccl+=/work/.mirror/NVIDIA+nccl/repo@v2.14.3-1 \\
        nccl+=/work/.mirror/NVIDIA+nccl/repo@v2.10.3-1 nccl+=/work/.mirror/NVIDIA+nccl/repo@v2.7.8-1 \\
        nccl+=/work/.mirror/NVIDIA+nccl/repo@v2.4.8-1 gloo=/work/.mirror/pytorch+gloo/repo \\
        lightning=/work/.mirror/Lightning-AI+pytorch-lightning/repo \\
        accelerate=/work/.mirror/huggingface+accelerate/repo deepspeed=/work/.mirror/deepspeedai+DeepSpeed/repo \\
        aws-ofi-nccl=/work/.mirror/aws+aws-ofi-nccl/repo aws-ofi-nccl+=/work/.mirror/aws+aws-ofi-nccl/repo@v1.7.4-aws \\
        transformers=/tmp/transformers-5.24.0  # the wheel, unpacked

``SOURCE+=PATH@REV`` names an earlier release of a source given before it (newest first): only the messages
none of the later releases prints are added, with that release's provenance (NCCL: the releases torch wheels
bundled, 2.4.8 in torch 1.4-1.6 to 2.27 in 2.8-2.9). ``torch-cpp=$T`` reads c10d's headers as the installed release ships them (``torch/include``, provenance: that
release and its commit from ``version.py``); the ``.cpp`` files are not in a wheel and come from the next tree,
a PyTorch 2.7.0a0 copy inside another repository, recorded as such in each entry's ``version``
(docs/internals/explain-kb.md says why no upstream copy is used).

What is read (``SCOPES``): torch's ``distributed/``, ``nn/parallel/``, ``multiprocessing/``, SyncBatchNorm's
``nn/modules/batchnorm.py`` and ``_functions.py`` (Python:
``raise``, ``warnings.warn``, logger ``error``/``warning``/``exception``/``critical`` calls, DDP's
``_log_and_throw(Type, msg)``, ``torch._check*(cond, lambda: msg)``, FSDP's ``_p_assert(cond, msg)`` (the
message positional or ``s=``, raised as ``AssertionError``: kind ``python-raise``); torchrun and
elastic files form the source ``torch-elastic``); c10d's C++ in ``torch/csrc/distributed/`` (``TORCH_CHECK``,
``TORCH_CHECK_WITH``, ``C10_THROW_ERROR``, ``C10D_THROW_ERROR``, ``TORCH_WARN``, ``LOG(ERROR|WARNING)``,
``C10D_ERROR``/``C10D_WARNING`` and socket.cpp's ``recordError``, and messages built with ``c10::str`` /
``fmt::format`` into a variable that is logged or thrown later: kind ``cpp-format``);
NCCL's ``src/`` (``WARN(...)`` and the texts of ``ncclGetErrorString``); gloo (``GLOO_ENFORCE*``,
``GLOO_THROW*``, ``GLOO_ERROR``/``GLOO_WARN``); the launch/strategy files of Lightning, accelerate, DeepSpeed
and the HF Trainer.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "explain_inventory"

# source -> (project, path globs relative to the source root, prefix that maps the root to the project's layout)
SCOPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch-python": ("pytorch", ("distributed/*.py", "distributed/**/*.py", "nn/parallel/*.py",
                                 "nn/modules/batchnorm.py", "nn/modules/_functions.py",  # SyncBatchNorm
                                 "multiprocessing/*.py")),
    # The neighbours a DDP job meets, from the same installed torch (issue 33): DataLoader workers
    # (torch.utils.data), CUDA's lazy initialisation (torch.cuda), Dynamo's DDPOptimizer (torch.compile + DDP).
    "torch-data": ("pytorch", ("utils/data/*.py", "utils/data/_utils/*.py")),
    "torch-cuda": ("pytorch", ("cuda/__init__.py",)),
    "torch-dynamo": ("pytorch", ("_dynamo/backends/distributed.py",)),
    "torch-cpp": ("pytorch", ("torch/csrc/distributed/**/*.cpp", "torch/csrc/distributed/**/*.hpp",
                              "torch/csrc/distributed/**/*.h")),
    "nccl": ("nccl", ("src/**/*.cc", "src/**/*.h", "src/**/*.cu", "src/*.cc")),
    "gloo": ("gloo", ("gloo/**/*.cc", "gloo/**/*.h")),
    "lightning": ("pytorch-lightning", ("src/lightning/fabric/strategies/**/*.py",
                                        "src/lightning/pytorch/strategies/**/*.py",
                                        "src/lightning/fabric/plugins/environments/*.py",
                                        "src/lightning/fabric/utilities/distributed.py",
                                        "src/lightning/fabric/utilities/device_parser.py",
                                        "src/lightning/fabric/accelerators/cuda.py",
                                        "src/lightning/pytorch/trainer/connectors/accelerator_connector.py",
                                        "src/lightning/fabric/connector.py")),
    "accelerate": ("accelerate", ("src/accelerate/state.py", "src/accelerate/commands/launch.py",
                                  "src/accelerate/utils/launch.py", "src/accelerate/utils/environment.py",
                                  "src/accelerate/utils/other.py")),
    # The AWS libfabric (EFA) network plugin of NCCL: src/ in C up to 1.7, C++ since.
    "aws-ofi-nccl": ("aws-ofi-nccl", ("src/*.c", "src/*.cpp", "src/**/*.c", "src/**/*.cpp", "include/*.h",
                                      "include/**/*.h")),
    "deepspeed": ("DeepSpeed", ("deepspeed/launcher/*.py", "deepspeed/comm/*.py", "deepspeed/utils/distributed.py")),
    "transformers": ("transformers", ("transformers/training_args.py", "transformers/trainer.py",
                                      "transformers/integrations/deepspeed.py")),
}
# Sources read from the installed torch package like torch-python, each reported on its own.
TORCH_NEIGHBOURS = ("torch-data", "torch-cuda", "torch-dynamo")
# Python files of torch that belong to torchrun / elastic (reported as their own source).
ELASTIC = ("distributed/elastic/", "distributed/run.py", "distributed/launch.py", "distributed/launcher/")
LOG_LEVELS = {"error": "error", "exception": "error", "critical": "error", "fatal": "error",
              "warning": "warning", "warn": "warning"}
# torch._check* and the exception each raises (torch/__init__.py)
TORCH_CHECKS = {"_check": "RuntimeError", "_check_value": "ValueError", "_check_type": "TypeError",
                "_check_index": "IndexError", "_check_not_implemented": "NotImplementedError", "_check_with": ""}
MIN_LITERAL = 6  # a template with less literal text than this cannot be recognised in a log (only "{}: {}")


@dataclass(frozen=True)
class Tree:
    """A source root: a plain directory, or a bare git directory read at one revision."""

    root: Path
    rev: str | None

    @property
    def is_git(self) -> bool:
        return (self.root / "HEAD").is_file() and (self.root / "objects").is_dir()

    def files(self) -> list[str]:
        if self.is_git:
            out = subprocess.run(["git", "-C", str(self.root), "ls-tree", "-r", "--name-only", self.rev or "HEAD"],
                                 capture_output=True, text=True, check=True).stdout
            return out.splitlines()
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def read(self, path: str) -> str:
        if self.is_git:
            return subprocess.run(["git", "-C", str(self.root), "show", f"{self.rev or 'HEAD'}:{path}"],
                                  capture_output=True, text=True, check=True, errors="replace").stdout
        return (self.root / path).read_text(encoding="utf-8", errors="replace")

    def commit(self) -> str:
        if self.is_git:
            return subprocess.run(["git", "-C", str(self.root), "rev-parse", f"{self.rev or 'HEAD'}^{{commit}}"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        return ""


# -- Python ------------------------------------------------------------------------------------------------
def _py_template(node: ast.AST | None) -> str:
    """The literal text of a message expression, ``{}`` for what is formatted in at run time."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else "{}"
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _py_template(node.left) + _py_template(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):  # "..." % args
        return re.sub(r"%[-#0 +]*\d*(?:\.\d+)?[sdifrgxeEc]", "{}", _py_template(node.left))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return re.sub(r"\{[^{}]*\}", "{}", _py_template(node.func.value))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
        return "{}"
    return "{}"


def _call_name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _receiver(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        v = func.value
        if isinstance(v, ast.Name):
            return v.id
        if isinstance(v, ast.Attribute):
            return v.attr
        if isinstance(v, ast.Call):
            return _call_name(v.func)
    return ""


def python_messages(text: str) -> Iterator[tuple[int, str, str, str, str]]:
    """(line, kind, level, exception or warning category, template) for each message the module can print."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            exc = _call_name(node.exc.func)
            if not exc or not exc[:1].isupper():
                continue
            arg = node.exc.args[0] if node.exc.args else None
            yield node.lineno, "python-raise", "error", exc, _py_template(arg)
        elif isinstance(node, ast.Call):
            name, recv = _call_name(node.func), _receiver(node.func)
            if name == "warn" and recv == "warnings":
                cat = "UserWarning"
                if len(node.args) > 1:
                    cat = _call_name(node.args[1]) or cat
                for kw in node.keywords:
                    if kw.arg == "category":
                        cat = _call_name(kw.value) or cat
                yield node.lineno, "python-warn", "warning", cat, _py_template(node.args[0] if node.args else None)
            elif name in LOG_LEVELS and ("log" in recv.lower() or recv in ("logging", "warnings_logger")):
                text = _py_template(node.args[0] if node.args else None)
                if len(node.args) > 1:  # logger.warning("... %s", value): the logger formats it
                    text = re.sub(r"%[-#0 +]*\d*(?:\.\d+)?[sdifrgxeEc]", "{}", text)
                yield node.lineno, "python-log", LOG_LEVELS[name], "", text
            elif name == "_log_and_throw" and len(node.args) >= 2:
                # DistributedDataParallel logs its construction errors, then raises them: _log_and_throw(Type, msg)
                yield node.lineno, "python-raise", "error", _call_name(node.args[0]), _py_template(node.args[1])
            elif name == "_p_assert" and recv in ("", "utils", "_utils"):
                # FSDP's _p_assert(cond, s) (torch/distributed/utils.py): prints s, then the stack, then raises
                # AssertionError(s); the message is the second positional argument or the keyword s=.
                msg = node.args[1] if len(node.args) > 1 else next(
                    (kw.value for kw in node.keywords if kw.arg == "s"), None)
                yield node.lineno, "python-raise", "error", "AssertionError", _py_template(msg)
            elif name in TORCH_CHECKS and recv == "torch":
                # torch._check(cond, lambda: msg): the message is the lambda's body; _check_with names the type
                args = node.args[1:] if name == "_check_with" else node.args
                exc = _call_name(node.args[0]) if name == "_check_with" and node.args else TORCH_CHECKS[name]
                msg = args[1] if len(args) > 1 else None
                yield (node.lineno, "python-raise", "error", exc,
                       _py_template(msg.body if isinstance(msg, ast.Lambda) else msg) if msg is not None else "")


# -- C / C++ -----------------------------------------------------------------------------------------------
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def _split_args(body: str, sep: str = ",") -> list[str]:
    """Top-level pieces of a macro's argument text split at ``sep`` (strings and brackets respected)."""
    out, depth, cur, i = [], 0, [], 0
    while i < len(body):
        c = body[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < len(body) and body[j] != c:
                j += 2 if body[j] == "\\" else 1
            cur.append(body[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if depth == 0 and body.startswith(sep, i):
            out.append("".join(cur))
            cur = []
            i += len(sep)
            continue
        cur.append(c)
        i += 1
    out.append("".join(cur))
    return [p.strip() for p in out]


def _unescape(lit: str) -> str:
    return (lit[1:-1].replace('\\"', '"').replace("\\n", "\n").replace("\\t", " ").replace("\\\\", "\\")
            .replace("\\'", "'"))


def _cpp_piece(expr: str, printf: bool = False) -> str:
    """Template of one C++ expression: string literals (adjacent ones joined), ``c10::str(...)`` flattened,
    ``+`` concatenation, printf ``%`` conversions; anything else is ``{}``."""
    expr = expr.strip()
    if not expr:
        return ""
    m = re.fullmatch(r"(?:c10::)?str\((.*)\)|std::string\((.*)\)|fmt::format\((.*)\)", expr, re.S)
    if m:
        inner = m.group(1) or m.group(2) or m.group(3) or ""
        parts = _split_args(inner)
        if m.group(3) is not None and parts:  # fmt::format("... {} ...", args)
            return _cpp_piece(parts[0])
        return "".join(_cpp_piece(p) for p in parts)
    pieces = _split_args(expr, "+")
    if len(pieces) > 1:
        return "".join(_cpp_piece(p, printf) for p in pieces)
    if expr.startswith('"'):
        # Adjacent literals with what the preprocessor puts between them, in place: `"Call to " #call " failed"`
        # (a stringified macro argument: a value), `"%" PRIu64` (a printf length macro: part of the conversion).
        text = ""
        for tok in re.finditer(r'"(?:[^"\\\n]|\\.)*"|PRI[a-zA-Z]\w*|#?\w+|\S', expr):
            t = tok.group(0)
            if t.startswith('"'):
                text += _unescape(t)
            elif t.startswith("PRI"):
                text += t[3] if printf else "{}"
            else:
                text += "{}"
        if printf:
            text = re.sub(r"%[-#0 +']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|z|j|t|L)?[diouxXeEfgGcspn]", "{}",
                          text).replace("%%", "%")
        return re.sub(r"(?:\{\})+", "{}", text)
    return "{}"


def _macro_calls(text: str, names: str) -> Iterator[tuple[int, str, str]]:
    """(line, macro name, argument text) of every call of the macros matched by ``names``."""
    for line, name, args, _span in _macro_spans(text, names):
        yield line, name, args


def _macro_spans(text: str, names: str) -> Iterator[tuple[int, str, str, tuple[int, int]]]:
    """``_macro_calls`` with the offsets each call spans in ``text``."""
    for m in re.finditer(rf"\b({names})\s*\(", text):
        start = m.end()
        depth, i = 1, start
        while i < len(text) and depth:
            c = text[i]
            if c == '"' or c == "'":
                j = i + 1
                while j < len(text) and text[j] != c and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                i = j + 1
                continue
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            i += 1
        if depth == 0:
            yield text.count("\n", 0, m.start()) + 1, m.group(1), text[start:i - 1], (m.start(), i)


def _strip_comments(text: str) -> str:
    """C comments blanked (newlines kept, so line numbers stay right); strings left alone."""
    def blank(m: re.Match[str]) -> str:
        s = m.group(0)
        return s if s.startswith('"') else re.sub(r"[^\n]", " ", s)
    return re.sub(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', blank, text, flags=re.S)


# A message built with c10::str / fmt::format into a variable, then logged or thrown elsewhere (ProcessGroupNCCL's
# watchdog timeout, socket.cpp's connect errors): kept when it reads like a sentence, not a key or a "{}:{}".
MIN_BUILT_MESSAGE = 20


def torch_cpp_messages(text: str) -> Iterator[tuple[int, str, str, str, str]]:
    text = _strip_comments(text)
    spans: list[tuple[int, int]] = []
    for line, name, args, span in _macro_spans(
            text, r"TORCH_CHECK|TORCH_CHECK_WITH|C10_THROW_ERROR|C10D_THROW_ERROR|TORCH_WARN|TORCH_WARN_ONCE|"
                  r"TORCH_CHECK_VALUE|TORCH_CHECK_TYPE|C10D_ERROR|C10D_WARNING|recordError|REDUCER_CHECK"):
        spans.append(span)
        parts = _split_args(args)
        if name in ("TORCH_CHECK", "TORCH_CHECK_VALUE", "TORCH_CHECK_TYPE"):
            exc = {"TORCH_CHECK_VALUE": "ValueError", "TORCH_CHECK_TYPE": "TypeError"}.get(name, "RuntimeError")
            yield line, "cpp-check", "error", exc, "".join(_cpp_piece(p) for p in parts[1:])
        elif name == "TORCH_CHECK_WITH":
            yield line, "cpp-check", "error", parts[0], "".join(_cpp_piece(p) for p in parts[2:])
        elif name == "REDUCER_CHECK":  # reducer.cpp: REDUCER_CHECK(cond, logger, message...) logs, then throws
            yield line, "cpp-check", "error", "RuntimeError", "".join(_cpp_piece(p) for p in parts[2:])
        elif name in ("C10_THROW_ERROR", "C10D_THROW_ERROR"):
            yield line, "cpp-throw", "error", parts[0], "".join(_cpp_piece(p) for p in parts[1:])
        elif name in ("C10D_ERROR", "C10D_WARNING", "recordError"):
            # c10d/logging.h: fmt-style, printed as a glog line "[c10d] ..."; socket.cpp's recordError() logs its
            # message with C10D_WARNING and keeps it for the exception thrown when every address failed.
            level = "error" if name == "C10D_ERROR" else "warning"
            yield line, "cpp-log", level, "c10d", _cpp_piece(parts[0]) if parts else ""
        else:
            yield line, "cpp-warn", "warning", "", "".join(_cpp_piece(p) for p in parts)
    for m in re.finditer(r"\bLOG\((ERROR|WARNING|FATAL)\)((?:[^;\"]|\"(?:[^\"\\\n]|\\.)*\")*);", text):
        spans.append((m.start(), m.end()))
        pieces = _split_args(m.group(2), "<<")
        template = "".join(_cpp_piece(p) for p in pieces if p)
        level = "warning" if m.group(1) == "WARNING" else "error"
        yield text.count("\n", 0, m.start()) + 1, "cpp-log", level, "", template
    # A message held in a variable: `kBaseErrorMsg = "Expected to have finished reduction ..." "...";` (reducer.cpp)
    for m in re.finditer(r"\b\w*(?:Msg|msg|Message|message)\w*\s*=\s*((?:\"(?:[^\"\\\n]|\\.)*\"\s*)+);", text):
        if not any(a <= m.start() < b for a, b in spans):
            spans.append((m.start(), m.end()))
            yield text.count("\n", 0, m.start()) + 1, "cpp-format", "error", "", _cpp_piece(m.group(1))
    for line, name, args, (start, _end) in _macro_spans(text, r"c10::str|fmt::format"):
        if any(a <= start < b for a, b in spans):
            continue  # part of a message extracted above
        parts = _split_args(args)
        template = _cpp_piece(parts[0]) if name == "fmt::format" else "".join(_cpp_piece(p) for p in parts)
        words = template.replace("{}", " ").split()
        if len(" ".join(words)) >= MIN_BUILT_MESSAGE and len(words) >= 3:
            yield line, "cpp-format", "error", "", template


def nccl_messages(text: str) -> Iterator[tuple[int, str, str, str, str]]:
    text = _strip_comments(text)
    for line, _name, args in _macro_calls(text, r"WARN"):
        parts = _split_args(args)
        if parts and parts[0].startswith('"'):
            yield line, "nccl-warn", "error", "", _cpp_piece(parts[0], printf=True)
    m = re.search(r"const char\*\s+ncclGetErrorString\s*\([^)]*\)\s*\{", text)
    if m:
        end = text.find("\n}", m.end())
        for cm in re.finditer(r'case\s+(\w+)\s*:\s*return\s+((?:"(?:[^"\\\n]|\\.)*"\s*)+);', text[m.end():end]):
            yield (text.count("\n", 0, m.end() + cm.start()) + 1, "nccl-errstr", "error", cm.group(1),
                   _cpp_piece(cm.group(2)))


def ofi_messages(text: str) -> Iterator[tuple[int, str, str, str, str]]:
    """aws-ofi-nccl's ``NCCL_OFI_WARN(fmt, ...)`` (include/nccl_ofi_log.h): NCCL's logger prints it as an NCCL
    WARN line with "NET/OFI " in front of the format (``host:pid:tid [0] NCCL WARN NET/OFI Unable to register
    memory ...``)."""
    text = _strip_comments(text)
    for line, _name, args in _macro_calls(text, r"NCCL_OFI_WARN"):
        parts = _split_args(args)
        if parts and parts[0].startswith('"') and "__VA_ARGS__" not in args:
            yield line, "nccl-warn", "error", "", "NET/OFI " + _cpp_piece(parts[0], printf=True)


def gloo_messages(text: str) -> Iterator[tuple[int, str, str, str, str]]:
    """gloo's ``GLOO_ENFORCE*``, ``GLOO_THROW*``, ``GLOO_ERROR``/``GLOO_WARN``, and every other
    ``GLOO_ERROR_MSG(...)``: the tcp transport's I/O errors are built with it and handed to
    ``signalException``, which throws them as ``gloo::IoException`` (transport/tcp/pair.cc): "connect {}: {}",
    "Connection closed by peer {}", "Read error {}: {}", what an uncaught IoException's ``what():`` shows."""
    text = _strip_comments(text)
    spans: list[tuple[int, int]] = []
    for line, name, args, span in _macro_spans(
            text, r"GLOO_ENFORCE(?:_[A-Z]+)?|GLOO_THROW(?:_[A-Z_]+)?|GLOO_ERROR|GLOO_WARN|GLOO_ERROR_MSG"):
        if "__VA_ARGS__" in args:
            continue  # the macros' own definitions (common/error.h)
        if name == "GLOO_ERROR_MSG":
            if not any(a <= span[0] < b for a, b in spans):
                yield line, "gloo-throw", "error", "IoException", "".join(_cpp_piece(p) for p in _split_args(args))
            continue
        spans.append(span)
        inner = re.fullmatch(r"\s*GLOO_ERROR_MSG\s*\((.*)\)\s*", args, re.S)
        if inner is not None:  # GLOO_THROW_IO_EXCEPTION(GLOO_ERROR_MSG("...", x)): the message is the inner one
            args = inner.group(1)
        parts = _split_args(args)
        if name.startswith("GLOO_ENFORCE"):
            skip = 1 if name in ("GLOO_ENFORCE", "GLOO_ENFORCE_THAT") else 2
            kind, level, exc = "gloo-enforce", "error", "EnforceNotMet"
            parts = parts[skip:]
        elif name.startswith("GLOO_THROW"):
            kind, level = "gloo-throw", "error"
            exc = {"GLOO_THROW_IO_EXCEPTION": "IoException",
                   "GLOO_THROW_INVALID_OPERATION_EXCEPTION": "InvalidOperationException"}.get(name, "Exception")
        else:
            kind, level, exc = "gloo-log", "error" if name == "GLOO_ERROR" else "warning", ""
        yield line, kind, level, exc, "".join(_cpp_piece(p) for p in parts)


# -- driver ------------------------------------------------------------------------------------------------
def _matches(path: str, globs: tuple[str, ...]) -> bool:
    for g in globs:
        if "**" in g:
            head, tail = g.split("**/", 1)
            if path.startswith(head) and fnmatch(path.rsplit("/", 1)[-1], tail.rsplit("/", 1)[-1]):
                return True
        elif fnmatch(path, g) and path.count("/") == g.count("/"):
            return True
    return False


def _version(source: str, tree: Tree) -> str:
    def show(path: str) -> str:
        try:
            return tree.read(path)
        except (subprocess.CalledProcessError, OSError):
            return ""
    if source == "torch-python":
        m = re.search(r"__version__ = '([^']+)'", show("version.py"))
        return m.group(1) if m else ""
    if source == "torch-cpp":
        return show("version.txt").strip()
    if source == "nccl":
        mk = show("makefiles/version.mk")
        nums = [re.search(rf"NCCL_{k}\s*:=\s*(\d+)", mk) for k in ("MAJOR", "MINOR", "PATCH")]
        return ".".join(n.group(1) for n in nums if n)
    if source == "lightning":
        return show("src/version.info").strip()
    if source == "accelerate":
        m = re.search(r'version="([^"]+)"', show("setup.py"))
        return m.group(1) if m else ""
    if source == "deepspeed":
        return show("version.txt").strip()
    if source == "aws-ofi-nccl":
        # Releases write the version into AC_INIT; the main branch computes it (m4/get_version.sh from git tags).
        m = re.search(r"AC_INIT\(\[aws-ofi-nccl\],\s*\[([\w.-]+)\]", show("configure.ac"))
        return m.group(1) if m else "main"
    if source == "transformers":
        m = re.search(r'__version__ = "([^"]+)"', show("transformers/__init__.py"))
        return m.group(1) if m else ""
    return ""


def _torch_commit(tree: Tree) -> str:
    m = re.search(r"git_version = '([0-9a-f]+)'", tree.read("version.py"))
    return m.group(1) if m else ""


def _mirror_repo(root: Path) -> str:
    """``owner/name`` of a snapshot the `fetch` tool brought (``/work/.mirror/owner+name/repo``), else ""."""
    for part in reversed(root.resolve().parts):
        if "+" in part:
            return part.replace("+", "/", 1)
    return ""


def provenance(source: str, tree: Tree) -> tuple[Tree, str, str]:
    """(the tree to read, version, commit) of one source root, as the entries record them.

    torch-cpp takes an installed torch package (``site-packages/torch``): its ``include/`` holds c10d's
    headers exactly as that release ships them, and ``version.py`` names the release and its PyTorch commit.
    A git tree that is not PyTorch's own repository (a copy inside another project) says so in the version,
    with the commit of the repository it was read from: the provenance is that copy, not upstream.
    """
    if source in ("torch-python", "torch-cpp", *TORCH_NEIGHBOURS) and (tree.root / "version.py").is_file():
        m = re.search(r"__version__ = '([^']+)'", tree.read("version.py"))
        version, commit = (m.group(1) if m else ""), _torch_commit(tree)
        if source == "torch-cpp":
            return Tree(tree.root / "include", None), version, commit
        return tree, version, commit
    version, commit = _version(source, tree), tree.commit()
    repo = _mirror_repo(tree.root)
    if source == "torch-cpp" and repo and repo != "pytorch/pytorch":
        version = f"{version} (copy in {repo})"
    return tree, version, commit


def build(source: str, trees: list[Tree], older: list[Tree] | None = None) -> list[dict[str, object]]:
    """Every message of ``source`` in ``trees``; a file found in an earlier tree hides the same path in later
    ones (the exact release's headers before an older copy's), each entry with its own tree's provenance.

    ``older``: earlier releases of the same project (newest first), read whole: a message whose text none of
    the releases before it prints is added with its own release's provenance. Users' logs come from the NCCL
    their torch wheel bundles (2.4 for torch 1.4-1.6 ... 2.28 today), and NCCL rewords its messages between
    releases ("Connect to {} failed" in include/socket.h up to 2.11, "socketStartConnect: Connect to {}
    failed" in misc/socket.cc since): a text only an older release prints is still what users paste."""
    project, globs = SCOPES[source]
    extract = {"torch-cpp": torch_cpp_messages, "nccl": nccl_messages, "gloo": gloo_messages,
               "aws-ofi-nccl": ofi_messages}.get(source,
                                                                                                  python_messages)
    entries: list[dict[str, object]] = []
    seen: set[tuple[str, int, str]] = set()
    done: set[str] = set()
    known: set[str] = set()  # templates of the releases read so far (for ``older``)
    releases = [(t, False) for t in trees] + [(t, True) for t in older or ()]
    for given, is_older in releases:
        if is_older:
            done = set()
            known |= {str(e["template"]) for e in entries}
        tree, version, commit = provenance(source, given)
        for path in tree.files():
            if path in done or not _matches(path, globs) or "/test" in path or path.startswith("test"):
                continue
            done.add(path)
            for line, kind, level, exc, template in extract(tree.read(path)):
                if is_older and template.strip() in known:
                    continue
                # torch's Python files are listed by their place in the PyTorch repository (torch/...).
                shown = f"torch/{path}" if source in ("torch-python", *TORCH_NEIGHBOURS) else path
                src = "torch-elastic" if source == "torch-python" and path.startswith(ELASTIC) else source
                template = template.strip()
                key = (shown, line, template)
                if key in seen:
                    continue
                seen.add(key)
                entries.append({"source": src, "project": project, "version": version, "commit": commit,
                                "file": shown, "line": line, "kind": kind, "level": level, "exception": exc,
                                "template": template,
                                "literal": len(template.replace("{}", "").strip()) >= MIN_LITERAL})
    entries.sort(key=lambda e: (str(e["source"]), str(e["file"]), int(str(e["line"])), str(e["version"])))
    return entries


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    trees: dict[str, list[Tree]] = {}  # a source given twice: its trees in the order given
    older: dict[str, list[Tree]] = {}  # SOURCE+=PATH@REV: an earlier release of it (see build)
    for arg in argv:
        source, _, spec = arg.partition("=")
        is_older = source.endswith("+")
        source = source.removesuffix("+")
        if source not in SCOPES or not spec:
            print(f"unknown source {arg!r}; one of {sorted(SCOPES)} as SOURCE=PATH[@REV] or SOURCE+=PATH@REV",
                  file=sys.stderr)
            return 2
        path, _, rev = spec.partition("@")
        if not Path(path).is_dir():
            print(f"{source}: no such directory {path!r}", file=sys.stderr)
            return 2
        (older if is_older else trees).setdefault(source, []).append(Tree(Path(path), rev or None))
    if set(older) - set(trees):
        print(f"an older release needs its source's current one first: {sorted(set(older) - set(trees))}",
              file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    for source, given in trees.items():
        by_source: dict[str, list[dict[str, object]]] = {}
        for e in build(source, given, older.get(source)):
            by_source.setdefault(str(e["source"]), []).append(e)
        for name, rows in by_source.items():
            target = OUT / f"{name}.jsonl"
            tmp = target.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
            tmp.replace(target)
            print(f"{name}: {len(rows)} messages -> {target.relative_to(OUT.parent.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
