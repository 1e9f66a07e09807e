"""What a traceback shows when its last line is missing: the source line of the ``raise`` that failed.

Users paste the part of a traceback they think matters, and a pasted traceback often ends at the frame that
raised: ``raise RuntimeError("Distributed package doesn't have NCCL built in")`` (torch/distributed/
distributed_c10d.py), a message split over string literals the compiler joins (``raise ValueError("Error
initializing torch.distributed using env:// rendezvous: "`` on one line, ``"environment variable ..."`` on
the next), or an error built by a helper (rendezvous.py's ``raise _env_error(env_var)``, whose variable name
is in the caller's frame: ``master_addr = _get_env_or_raise("MASTER_ADDR")``). The message is then read from
the source line as Python would have printed it (``Type: message``, the literals joined: implicit string
concatenation), and matched like an exception's last line; the evidence quotes the source lines themselves.

Pure functions of text; the scanner calls them only for lines the prefilter admitted (``RAISE_KEYWORDS``).
"""

from __future__ import annotations

import re

# The prefilter's extra keywords: a raise line holds one (``raise FooError("``, ``raise _env_error(``; a line
# that ends in ``raise FooError(`` is admitted as a cut keyword, see prefilter). Not ``Error('``: urllib3's
# retry warnings print ``ProtocolError('Connection aborted.'`` on healthy runs (torch's sources use ``"``).
RAISE_KEYWORDS = ('Error("', 'Error(f"', 'Exception("', 'Exception(f"', "_env_error(")
# An exception's repr, ``RuntimeError('Default process group has not been initialized, ...')``: how it reaches a
# log inside a container (``[RuntimeError('...')]``, ``{'error': "RuntimeError('...')"}``), from ``logger.error(repr(e))``
# and from frameworks that report a worker's exception that way (Ray's ``RayTaskError(...)``). Python's
# ``BaseException.__repr__`` (Objects/exceptions.c) writes the type, then the message's repr: single quotes unless
# the message holds one. The double-quoted form is a raise keyword above already. The prefilter finds ``Error('``
# from its ``E``, as it finds urllib3's ``ProtocolError('Connection aborted.', ...)`` that healthy runs print
# with every retried upload (1.5 % of the realistic benchmark's lines: looked at, they cut its speed by 2.5x); so an
# ``Error('`` is looked at only after the name of a type the inventory's sources raise (``REPR_ERROR_TYPES``).
REPR_KEYWORDS = ("Error('", "Exception('")
# The ``...Error`` types raised with the messages of tests/data/explain_inventory (its ``exception`` field: the
# builtins torch.distributed, its launchers and neighbours raise, c10d's Dist*Error, the elastic rendezvous errors,
# torch's OutOfMemoryError and AcceleratorError), less their ``Error``; ``Exception('`` is always looked at.
REPR_ERROR_TYPES = frozenset({
    b"Runtime", b"Value", b"Type", b"Key", b"Index", b"Attribute", b"Assertion", b"NotImplemented", b"Timeout",
    b"OS", b"Import", b"ModuleNotFound", b"FileNotFound", b"Dist", b"DistBackend", b"DistStore", b"DistNetwork",
    b"Rendezvous", b"RendezvousConnection", b"RendezvousState", b"RendezvousTimeout", b"RendezvousClosed",
    b"OutOfMemory", b"Accelerator", b"CalledProcess", b"ChildFailed",
})
_TYPE_BEFORE = re.compile(rb"(?<![\w])[A-Za-z]{0,24}$")


def repr_type_known(block: bytes | bytearray, at: int) -> bool:
    """Whether the ``Error('`` at ``block[at]`` ends a type name of ``REPR_ERROR_TYPES`` (or is ``Exception('``)."""
    if block[at:at + 9] == b"Exception":
        return True
    m = _TYPE_BEFORE.search(bytes(block[max(0, at - 24):at]))
    return m is not None and m.group(0) in REPR_ERROR_TYPES
# ``raise [module.]SomeError(`` or rendezvous.py's ``raise _error(`` / ``raise _env_error(``.
RAISE_START = re.compile(r"^\s*raise\s+(?:[A-Za-z_]\w*\.){0,4}(?P<exception>[A-Z]\w{0,60}(?:Error|Exception)"
                         r"|_env_error|_error)\((?P<rest>.*)$")
# A string literal with its prefix (f, r, u, b, rf, fr); single-line (a traceback shows one source line each).
_LITERAL = re.compile(r"""(?P<prefix>[rRfFuUbB]{0,2})(?P<body>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")
# What may stand between two literals of one implicit concatenation: nothing but blanks.
_BETWEEN = re.compile(r"^\s*$")
# Python >= 3.11 underlines the failing expression on a line of its own: ``    ^^^^^^^^^`` / ``~~~~^^^``.
_CARETS = re.compile(r"^\s*[\^~]+\s*$")
# The caller's frame of rendezvous.py's helper: ``master_addr = _get_env_or_raise("MASTER_ADDR")``.
_ENV_CALLER = re.compile(r"""_get_env_or_raise\(\s*["'](?P<variable>\w{1,64})["']""")
# rendezvous.py (torch 1.x to 2.13): _error(msg) -> ValueError("Error initializing torch.distributed using
# {scheme} rendezvous: " + msg); _env_error(var) -> _error(f"environment variable {var} expected, but not set").
_RENDEZVOUS_PREFIX = "Error initializing torch.distributed using env:// rendezvous: "
MAX_RAISE_LINES = 6  # the raise line and the lines its call continues on


def _unquote(body: str) -> str:
    inner = body[1:-1]
    return inner.replace("\\n", " ").replace("\\'", "'").replace('\\"', '"').replace("\\\\", "\\")


def _literals(code: str, depth: int) -> tuple[list[str], int, bool]:
    """The string literals of one source line inside the call (parenthesis ``depth`` on entry), the depth
    after it, and whether the literals so far are one implicit concatenation (nothing else between them)."""
    out: list[str] = []
    pos = 0
    joined = True
    for m in _LITERAL.finditer(code):
        between = code[pos:m.start()]
        if out and not _BETWEEN.match(between):
            joined = False
        depth += between.count("(") - between.count(")")
        if depth <= 0:
            return out, depth, joined
        out.append(_unquote(m.group("body")))
        pos = m.end()
    rest = code[pos:]
    depth += rest.count("(") - rest.count(")")
    return out, depth, joined


def raise_message(lines: list[str], lookback: list[str]) -> tuple[str, int] | None:
    """``Type: message`` for a ``raise`` statement starting at ``lines[0]`` (its continuation lines after it,
    paste and rank prefixes already removed), and how many of the lines after the first it used; None if the
    statement is not one whose message can be read.

    ``lookback``: the lines above, nearest first (the caller's frame, for rendezvous.py's helper).
    """
    m = RAISE_START.match(lines[0])
    if m is None:
        return None
    exception = m.group("exception")
    pieces, depth, joined = _literals(m.group("rest"), 1)
    used = 0
    for line in lines[1:MAX_RAISE_LINES]:
        if depth <= 0 or not joined:
            break
        if _CARETS.match(line):
            used += 1
            continue
        if not line[:1].isspace() and not line.lstrip().startswith(("'", '"', "f'", 'f"', "r'", 'r"', ")")):
            break  # not a continuation of the call: the traceback's next line
        more, depth, joined = _literals(line, depth)
        if not more and depth > 0 and line.strip() and not line.strip().startswith(")"):
            break  # an argument that is no literal: the message is whatever it formats, unknown here
        pieces += more
        used += 1
    if exception == "_env_error":
        variable = next((v.group("variable") for v in map(_ENV_CALLER.search, lookback[:4]) if v), None)
        if variable is None:
            return None  # which variable is in the caller's frame; without it the message is not known
        return f"ValueError: {_RENDEZVOUS_PREFIX}environment variable {variable} expected, but not set", used
    message = "".join(pieces).strip()
    if len(message) < 8:
        return None  # nothing to match: a raise of a variable, an empty message
    if exception == "_error":
        return f"ValueError: {_RENDEZVOUS_PREFIX}{message}", used
    return f"{exception}: {message}", used
