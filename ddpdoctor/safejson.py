"""Parse JSON that came from a user's file, with limits, so bad input is one line and never a crash or a stall.

Python's ``json`` accepts what no tool that wrote the file would emit, and each of those turns into a
traceback or a wrong answer further on: ``NaN``/``Infinity`` (a world size of infinity), ``1e400`` (a float
that overflows to infinity), a number of 5,000 digits (CPython refuses to convert it with a ``ValueError``
deep inside, or a later arithmetic step takes seconds), and nesting thousands deep (``RecursionError``).
:func:`loads_untrusted` refuses all of them with :class:`UntrustedJSONError`, a ``ValueError`` whose text
says what was wrong, so every reader of a user's file (safetensors headers, shard indexes, ``stacks --json``
files, Flight Recorder JSON dumps, torchrun error files, the watch channel) gets the same rules.
"""

from __future__ import annotations

import json
import math
from typing import Any

# Nesting deeper than any real file we read (a safetensors header is 2 deep, a stacks file 5, an FR dump 6).
MAX_DEPTH = 200
# Digits in one JSON number: a 64-bit integer has 20; a tensor byte offset or a timestamp in ns fits easily.
MAX_NUMBER_DIGITS = 40


class UntrustedJSONError(ValueError):
    """The text is not JSON, or is JSON that no real writer of the file would produce."""


def _refuse_constant(name: str) -> Any:
    raise UntrustedJSONError(f"the non-standard number {name} (NaN/Infinity are not JSON)")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise UntrustedJSONError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_DIGITS + 10:
        raise UntrustedJSONError(f"a number written with {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise UntrustedJSONError(f"the number {text} (too large for a float)")
    return value


def _check_depth(text: str | bytes | bytearray, limit: int) -> None:
    """Refuse nesting beyond ``limit`` before ``json`` recurses into it (a linear scan, strings skipped)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    # Fast path: a document with fewer openers than the limit cannot nest deeper than it.
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    depth = 0
    in_string = False
    escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                raise UntrustedJSONError(f"nesting deeper than {limit} levels")
        elif byte in (0x5D, 0x7D):
            depth -= 1


def loads_untrusted(text: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` for a user's file: refuses NaN/Infinity, overflowing or huge numbers and deep nesting.

    Raises :class:`UntrustedJSONError` (a ``ValueError``) for all of those and for text that is not JSON
    at all, so a caller catches one exception type and turns it into its one-line error.
    """
    _check_depth(text, max_depth)
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_parse_int,
                          parse_float=_parse_float)
    except UntrustedJSONError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UntrustedJSONError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
