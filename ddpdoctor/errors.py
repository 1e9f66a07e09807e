"""The one exception type for expected failures, and the exit codes every command shares.

Commands raise :class:`DoctorError` for bad usage or bad input (missing file, corrupt checkpoint, bad
flag value); ``cli.main`` turns it into one line on stderr and exit code 2. Anything else that escapes is
a ddpdoctor bug: exit 3 with versions, so the user can file it.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_BUG = 3


class DoctorError(Exception):
    """An expected failure the user can fix; the message says what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def short_error(exc: BaseException) -> str:
    """An exception in one line: its first line, without c10d/gloo's '[/long/source/path.cc:537] ' prefix;
    the type name when the message is empty."""
    import re  # here: `ddpdoctor stacks` imports this module and must start fast

    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", first) or first


def typed_error(exc: BaseException) -> str:
    """``Type: first line`` (as :func:`short_error` gives it), or just ``Type`` for an empty message."""
    return f"{type(exc).__name__}: {short_error(exc)}" if str(exc).strip() else type(exc).__name__
