"""Writing output files safely: atomically (temp file, rename) and checked before the work starts.

Every command that writes a file goes through here, so none leaves a half-written report or checkpoint
under the name the user asked for, and none finds out after the work that it cannot write its output.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ddpdoctor.errors import DoctorError

# What a process killed mid-write leaves next to the target (it cannot clean up after SIGKILL).
PARTIAL_SUFFIX = ".ddpdoctor-partial"


def replaces_existing(target: Path) -> bool:
    """Whether :func:`atomic_output` to ``target`` replaces a file, and so fsyncs before the rename."""
    return target.exists()


@contextlib.contextmanager
def atomic_output(target: Path, mode_from: Path | None = None) -> Iterator[BinaryIO]:
    """Yield a temp file next to ``target``; on success rename it over ``target``.

    On any failure the temp file is removed, so no partial output is left behind. A process killed
    mid-write (SIGKILL, the OOM killer) cannot clean up: it leaves ``.<target>.<random>.ddpdoctor-partial``,
    never a file under the target's name. (O_TMPFILE would leave nothing, but linking it in through
    /proc/self/fd fails with EXDEV on some kernels and sandboxes, so it cannot be relied on.)

    Durability follows what is at stake. When the rename replaces an existing file (``ckpt strip
    --in-place`` replaces the user's checkpoint), the data and then the directory are fsynced, so a power
    loss leaves the old file or the new one, never neither. A new file is not fsynced, as ``cp`` and
    ``torch.save`` do not: everything ddpdoctor writes can be written again from its input, which a power
    loss never touches, and waiting for a 10 GB checkpoint to reach the disk would double the time of a
    strip (see benchmarks/ckpt_strip.py). Run ``sync FILE`` when a new file must be on disk now.
    """
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise DoctorError(f"output directory {directory} does not exist; create it first")
    if os.path.lexists(target) and not target.is_file():
        # Checked here too, not only before the work: something may have appeared under the name since.
        # Renaming over a FIFO or a device node (as root, /dev/null) would replace it with a regular file.
        raise DoctorError(f"{target} is not a regular file (a device, FIFO, socket or directory); "
                          "refusing to replace it")
    replacing = replaces_existing(target)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=PARTIAL_SUFFIX, dir=directory)
    except OSError as exc:
        raise DoctorError(f"cannot write to output directory {directory}: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w+b") as fh:
            yield fh
            fh.flush()
            if mode_from is not None:
                os.fchmod(fh.fileno(), mode_from.stat().st_mode & 0o777)
            if replacing:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if replacing:
        # Without it the rename itself may not survive a power loss (the old name would come back).
        with contextlib.suppress(OSError):
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` through :func:`atomic_output`.

    A write that fails (a full disk, a file-size limit, a quota) is the user's environment, not a bug:
    one line and exit 2, with nothing left under the name (the temp file is removed).
    """
    text = (json.dumps(data, indent=2, default=str) + "\n").encode("utf-8")
    try:
        with atomic_output(Path(path)) as handle:
            handle.write(text)
    except OSError as exc:
        raise DoctorError(f"cannot write {os.fspath(path)!r}: {exc.strerror or exc}") from None


# ``--json -``: the JSON document on stdout, instead of the text report (the convention of every command).
STDOUT = "-"


def json_to_stdout(path: str | os.PathLike[str] | None) -> bool:
    """Whether ``--json`` asks for the document on stdout (then the text report is not printed)."""
    return path is not None and str(path) == STDOUT


def emit_json(path: str | os.PathLike[str], data: Any) -> None:
    """The ``--json PATH`` convention: ``-`` prints the document on stdout, anything else is written atomically."""
    if json_to_stdout(path):
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        sys.stdout.flush()
    else:
        write_json_atomic(path, data)


def validate_output_path(flag: str, path: str | os.PathLike[str] | None) -> None:
    """Fail before the work, not after it, when an output file cannot be written there."""
    if path is None or json_to_stdout(path):
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise DoctorError(f"{flag} {str(path)!r}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise DoctorError(f"{flag} {str(path)!r}: cannot write to the folder {folder!r} (not writable)")
    if os.path.isdir(path):
        raise DoctorError(f"{flag} {str(path)!r} is a directory; give a file name")
    if os.path.lexists(path) and not os.path.isfile(path):
        # The output is renamed over PATH: for /dev/null as root that would replace the device node.
        raise DoctorError(f"{flag} {str(path)!r} is not a regular file (a device, FIFO or socket); "
                          "give a file path")


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


def read_regular(path: PathArg, max_bytes: int, offset: int = 0) -> bytes:
    """The bytes of ``path`` from ``offset`` on; it must be a regular file, with at most ``max_bytes`` there.

    Raises :class:`NotRegularFile` for anything else, :class:`DoctorError` for a file too large, and lets
    ``OSError`` (missing, unreadable) through for the caller to word.
    """
    def refuse(mode: int) -> NotRegularFile:
        return NotRegularFile(f"{os.fspath(path)}: not a regular file ({_kind(mode)}); refused without reading it")

    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise refuse(mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
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
