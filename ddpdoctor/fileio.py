"""Reading files a user named, safely: never blocking on a FIFO, never opening a device, bounded in size.

Writing is the output policy's job (:mod:`ddpdoctor.outputs`): every command's outputs go through it.
"""

from __future__ import annotations

import os
import stat

from ddpdoctor.errors import DoctorError

# Reading a file a user named, without ever blocking. ``open()`` of a FIFO blocks until a writer appears
# (forever, when none does), and opening a device node can have effects of its own (a tape rewinds, a
# watchdog arms). So the path is ``stat``-ed first and only a regular file is opened; it is opened with
# ``O_NONBLOCK`` and ``fstat``-ed again, so a file swapped for a FIFO between the two calls cannot block
# either. The read is bounded by the caller's limit.
PathArg = str | os.PathLike[str]


class NotRegularFile(DoctorError):
    """The path is a FIFO, socket, device or directory: refused before it is opened."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def read_regular(path: PathArg, max_bytes: int, offset: int = 0, *, follow_links: bool = True) -> bytes:
    """The bytes of ``path`` from ``offset`` on; it must be a regular file, with at most ``max_bytes`` there.

    ``follow_links=False`` (runtime files another user might plant a link for): a symlink is refused too,
    and the file is opened with ``O_NOFOLLOW``. Raises :class:`NotRegularFile` for anything else,
    :class:`DoctorError` for a file too large, and lets ``OSError`` (missing, unreadable) through for the
    caller to word.
    """
    def refuse(mode: int) -> NotRegularFile:
        kind = "a symlink" if stat.S_ISLNK(mode) else _kind(mode)
        return NotRegularFile(f"{os.fspath(path)}: not a regular file ({kind}); refused without reading it")

    mode = (os.stat(path) if follow_links else os.lstat(path)).st_mode
    if not stat.S_ISREG(mode):
        raise refuse(mode)
    nofollow = 0 if follow_links else os.O_NOFOLLOW
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | nofollow | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb", closefd=True) as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # replaced between stat and open
            raise refuse(info.st_mode)
        fh.seek(offset)
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DoctorError(f"{os.fspath(path)}: larger than {max_bytes} bytes; no file this command reads is "
                          "that large")
    return data
