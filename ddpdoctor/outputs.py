"""The output policy: where a command may write, decided before any work starts, and how it writes.

Every file or folder ddpdoctor writes for a user goes through here (design.md "Outputs never destroy"),
so a slip on the command line (``--json train.log``, ``--plot model.py``, ``-o`` naming the input through a
symlink) costs a one-line refusal, never the user's file. The rules, each with the slip it stops:

- **Not an input, not another output.** An output never names a file the same run reads or writes, by
  any alias: a symlink, a hardlink, ``./x`` (compared by device and inode, or by real path when absent).
  ``ckpt strip dcp -o od --json od`` is refused before 200 MB are written into ``od``.
- **Only our own documents are replaced.** An existing file is replaced only when it is a document of
  ours of the same kind: a JSON document whose first keys are ``"tool": "ddpdoctor"`` and the same
  ``"command"`` (every document gets them, :func:`stamp`), a plot whose metadata carry :data:`PLOT_MARK`.
  A checkpoint is never replaced except by ``--in-place``; an output folder must be new or empty.
- **The name fits the content**: ``.json``; ``.png/.svg/.pdf``; ``.pt/.pth/.bin/.ckpt`` (and
  ``.pth.tar``); ``.safetensors``; a folder has no file extension.
- **What was there stays what it was.** A replaced file keeps its owner, group and mode; a read-only
  file, or one this user could not give back to its owner, is refused (``cp`` refuses the first).
  ``--in-place`` on a symlink rewrites the file it points to; the link stays a link.
- **New files follow the umask** (the kernel applies it: the temp file is created with 0666, a
  checkpoint copy with its input's mode, as ``cp`` does), never 0600 whatever the umask.
- **Atomic, and nothing left behind.** Data goes to ``.<name>.<pid>-<hex>.ddpdoctor-partial`` next to
  the target, locked (``flock``) while written, renamed over the target when complete. A run killed
  mid-write cannot clean up; the next write into that folder removes such a file when it is provably
  ours: our user's, our name pattern, its pid gone and no lock held. Others are named on stderr.
- **A failed run leaves no stale result.** When a run that accepted ``--json PATH`` fails before writing
  it, PATH gets an error document (:func:`end_session`), never an older run's result.

Reading users' files stays in :mod:`ddpdoctor.fileio`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ddpdoctor.errors import DoctorError

# What a process killed mid-write leaves next to the target (it cannot clean up after SIGKILL).
PARTIAL_SUFFIX = ".ddpdoctor-partial"
_PARTIAL_NAME = re.compile(r"^\..+\.(\d+)-[0-9a-f]{8}" + re.escape(PARTIAL_SUFFIX) + "$")

# ``--json -``: the JSON document on stdout, instead of the text report (the convention of every command).
STDOUT = "-"

# What makes a plot recognisably ours: PNG "Software" text chunk, SVG/PDF "Creator" (matplotlib metadata).
PLOT_MARK = "ddpdoctor bench --plot"
# Largest plot or JSON head read to recognise a document of ours (a plot is ~20-200 KB).
_MAX_PLOT_BYTES = 16 << 20
_JSON_HEAD = 512
_OUR_JSON = re.compile(rb'^\{\s*"tool"\s*:\s*"ddpdoctor"\s*,\s*"command"\s*:\s*"([a-z ]+)"')


@dataclass(frozen=True)
class Kind:
    """What an output holds: its name in messages, the extensions that fit it, and whether it is a folder."""

    name: str
    extensions: tuple[str, ...] = ()
    folder: bool = False
    # A folder the writer only adds new entries to (torchrun's --log-dir gets a new <run id>_<random>/ per
    # run): an existing one is used as it is, never required to be empty.
    adds_only: bool = False


JSON = Kind("a JSON document", (".json",))
PLOT = Kind("a plot", (".png", ".svg", ".pdf"))
# torch.save files: the common names; ``.pth.tar`` is pytorch/examples' ImageNet ``checkpoint.pth.tar``.
TORCH_FILE = Kind("a torch.save checkpoint", (".pt", ".pth", ".bin", ".ckpt", ".pth.tar", ".pt.tar"))
SAFETENSORS = Kind("a safetensors checkpoint", (".safetensors",))
CHECKPOINT_FOLDER = Kind("a checkpoint folder", folder=True)
EVIDENCE_FOLDER = Kind("an evidence folder", folder=True)
LOG_FOLDER = Kind("a log folder", folder=True, adds_only=True)
TEXT = Kind("a text file", (".txt",))
# `bench -J FILE.json`: nccl-tests' own JSON layout (util.cu), which has no room for our "tool" stamp; ours
# are recognised by their "args" (our writer puts "ddpdoctor" first, after "version" and "start_time").
NCCL_TESTS_JSON = Kind("an nccl-tests JSON document", (".json",))
_OUR_NCCL_TESTS_JSON = re.compile(rb'^\{\s*"version"\s*:\s*[^,]*,\s*"start_time"\s*:\s*"[^"]*"\s*,\s*'
                                  rb'"args"\s*:\s*\[\s*"ddpdoctor"')
# PyTorch's own dump names carry no extension (``<TORCH_FR_DUMP_TEMP_FILE><rank>``): any name fits.
FR_DUMP = Kind("a Flight Recorder dump")
_FILE_EXTENSIONS = tuple(ext for kind in (JSON, PLOT, TORCH_FILE, SAFETENSORS, TEXT) for ext in kind.extensions)


def json_to_stdout(path: str | os.PathLike[str] | None) -> bool:
    """Whether ``--json`` asks for the document on stdout (then the text report is not printed)."""
    return path is not None and os.fspath(path) == STDOUT


def _identity(path: str | os.PathLike[str]) -> tuple[Any, ...]:
    """The same value for every alias of a file (symlink, hardlink, ``./x``): device and inode when it
    exists, else its real path."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return ("path", real)
    return ("inode", st.st_dev, st.st_ino)


def is_our_json(path: str | os.PathLike[str], command: str | None = None) -> bool:
    """A JSON document ddpdoctor wrote (``command``: by that command), told by its first keys.

    :func:`stamp` puts ``"tool": "ddpdoctor", "command": ...`` first in every document, so the first
    bytes suffice; a regular file only, opened without blocking (a FIFO would wait for a writer).
    """
    head = _head(path, _JSON_HEAD)
    match = _OUR_JSON.match(head)
    return match is not None and (command is None or match.group(1).decode() == command)


def json_command(path: str | os.PathLike[str]) -> str | None:
    """The ``command`` of a ddpdoctor JSON document at ``path``; None for any other file."""
    match = _OUR_JSON.match(_head(path, _JSON_HEAD))
    return match.group(1).decode() if match else None


def is_our_nccl_tests_json(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an nccl-tests-style JSON document that ``bench -J`` wrote."""
    return bool(_OUR_NCCL_TESTS_JSON.match(_head(path, _JSON_HEAD)))


def is_our_plot(path: str | os.PathLike[str]) -> bool:
    """A PNG/SVG/PDF that ``bench --plot`` wrote: it carries :data:`PLOT_MARK` in its metadata."""
    data = _head(path, _MAX_PLOT_BYTES + 1)
    return len(data) <= _MAX_PLOT_BYTES and PLOT_MARK.encode() in data


def _head(path: str | os.PathLike[str], size: int) -> bytes:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return b""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb", closefd=True) as fh:
            return fh.read(size) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return b""


def stamp(doc: dict[str, Any], command: str) -> dict[str, Any]:
    """``doc`` with ``"tool": "ddpdoctor"`` and ``"command"`` as its first keys: what makes a document
    recognisably ours (:func:`is_our_json`), so a later run may replace it and ``fr`` never reads it."""
    rest = {k: v for k, v in doc.items() if k not in ("tool", "command")}
    return {"tool": "ddpdoctor", "command": command, **rest}


@dataclass(frozen=True)
class Target:
    """An output path checked against the policy: where the data really goes and what was there."""

    flag: str  # the option that took the path, for messages ("--json", "-o")
    given: str  # as the user wrote it
    real: Path  # symlinks resolved: the file that is written (renamed over)
    kind: Kind
    command: str | None = None  # JSON: the command whose documents may be replaced
    in_place: bool = False  # --in-place: ``real`` is the input, replaced on purpose
    like: Path | None = None  # a new file's mode is at most this file's (a checkpoint copy, as cp does)
    existing: os.stat_result | None = None

    @property
    def identity(self) -> tuple[Any, ...]:
        return _identity(self.real)


def _refuse(flag: str, given: str, why: str) -> DoctorError:
    return DoctorError(f"{flag} {given!r}: {why}")


def fits(name: str | os.PathLike[str], kind: Kind) -> bool:
    """Whether the file name ends in an extension of ``kind`` (case-insensitive; a bare ``.json`` is not)."""
    lowered = os.path.basename(os.fspath(name)).lower()
    return any(lowered.endswith(ext) and len(lowered) > len(ext) for ext in kind.extensions)


def has_file_extension(name: str | os.PathLike[str]) -> bool:
    """Whether the name ends in the extension of a file ddpdoctor writes (so it cannot name a folder)."""
    lowered = os.path.basename(os.fspath(name).rstrip(os.sep)).lower()
    return any(lowered.endswith(ext) for ext in _FILE_EXTENSIONS)


def resolve(flag: str, path: str | os.PathLike[str], kind: Kind, *, command: str | None = None,
            in_place: bool = False, like: str | os.PathLike[str] | None = None) -> Target:
    """``path`` checked as an output of ``kind`` for ``flag``; a one-line DoctorError for every refusal.

    Checked: the name fits the kind; a symlink is followed (a dangling one refused); the folder exists
    and is writable; an existing file is ours of the same kind (or the input, for ``in_place``), a
    regular file, writable, and one whose owner and group this user can give back; an existing folder
    (folder kinds) is empty. Nothing is created or written.
    """
    given = os.fspath(path)
    if given == "":
        raise DoctorError(f"{flag}: an empty path; give a {'folder' if kind.folder else 'file'} name")
    if given == STDOUT and kind is not JSON:
        raise _refuse(flag, given, "writes a file; - (stdout) is for --json")
    name = os.path.basename(given.rstrip(os.sep)) or given
    with contextlib.suppress(OSError):  # what is there decides first: /dev/null is a device, whatever its name
        mode = os.stat(given).st_mode
        if not kind.folder and stat.S_ISDIR(mode):
            raise _refuse(flag, given, "is a directory; give a file name")
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            # The output is renamed over PATH: for /dev/null as root that would replace the device node.
            raise _refuse(flag, given, "is not a regular file (a device, FIFO or socket); give a file path")
    if not in_place:
        if kind.folder:
            if has_file_extension(name):
                raise _refuse(flag, given, f"writes {kind.name}, not a file: give a folder name without "
                              f"a file extension ({os.path.splitext(name)[1] or name} names a file)")
        elif kind.extensions and not fits(name, kind):
            exts = "/".join(kind.extensions)
            raise _refuse(flag, given, f"writes {kind.name}; give a file name ending in {exts}")
    if os.path.islink(given) and not os.path.exists(given):
        raise _refuse(flag, given, f"is a symlink to {os.readlink(given)!r}, which does not exist; "
                      "give the real path")
    real = Path(os.path.realpath(given))
    parent = real.parent
    if kind.adds_only:
        # torchrun creates a missing --log-dir with its parents (os.makedirs): the nearest folder that
        # exists is the one that must take new entries.
        parent = _existing_ancestor(parent)
        if not parent.is_dir():
            raise _refuse(flag, given, f"{str(parent)!r} is not a folder; give a path of folders")
    elif not parent.is_dir():
        raise _refuse(flag, given, f"the folder {str(parent)!r} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _refuse(flag, given, f"cannot write to the folder {str(parent)!r} (not writable)")
    pseudo = pseudo_filesystem(parent)
    if pseudo is not None:
        raise _refuse(flag, given, f"the folder {str(parent)!r} is on the kernel's {pseudo} filesystem, where no "
                      "file can be created; give a path on a disk")
    try:
        existing: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        existing = None
    except OSError as exc:
        raise _refuse(flag, given, f"cannot check it ({exc.strerror or exc})") from None
    if existing is not None:
        _check_existing(flag, given, real, kind, existing, command, in_place)
    return Target(flag, given, real, kind, command, in_place, Path(like) if like is not None else None, existing)


# The kernel's own filesystems: no regular file can be created in them, whatever access(2) says (root passes its
# write check on /sys and /proc, and then open(O_CREAT) fails with EPERM or ENOENT: an output there was found
# unwritable only after the whole run, `bench`'s sweep, `check`'s report: an explorer's find).
PSEUDO_FILESYSTEMS = frozenset(("proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore",
                                "bpf", "configfs", "efivarfs", "fusectl", "binfmt_misc", "devpts", "mqueue"))


@functools.cache
def _mountinfo() -> tuple[str, ...] | None:
    """This process's mount table, read once per run (every output of a run asks)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            return tuple(fh.read().splitlines())
    except OSError:
        return None


def pseudo_filesystem(folder: Path) -> str | None:
    """The type of the kernel filesystem ``folder`` is on (see PSEUDO_FILESYSTEMS), from /proc/self/mountinfo (the
    mount point that is the longest prefix of its real path); None for a disk, or where that cannot be read."""
    mounts = _mountinfo()
    if mounts is None:
        return None
    target = os.path.realpath(folder)
    best, best_type = "", None
    for line in mounts:
        fields, _, tail = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not tail:
            continue
        point = parts[4].replace("\\040", " ")
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, best_type = point, tail.split()[0]
    return best_type if best_type in PSEUDO_FILESYSTEMS else None


def _existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (``/`` at worst)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _check_existing(flag: str, given: str, real: Path, kind: Kind, st: os.stat_result, command: str | None,
                    in_place: bool) -> None:
    if kind.folder:
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(flag, given, "exists and is not a folder; give a new folder name")
        if kind.adds_only:
            if not os.access(real, os.W_OK | os.X_OK):
                raise _refuse(flag, given, "is a folder this user cannot write to; give another folder")
            return
        try:
            contents = os.listdir(real)
        except OSError as exc:
            raise _refuse(flag, given, f"cannot list the folder ({exc.strerror or exc})") from None
        if contents:
            shown = ", ".join(sorted(contents)[:3]) + (", ..." if len(contents) > 3 else "")
            raise _refuse(flag, given, f"the folder already exists and is not empty ({shown}); give a new "
                          "folder name (nothing was written)")
        return
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(flag, given, "is a directory; give a file name")
    if not stat.S_ISREG(st.st_mode):
        # The output is renamed over PATH: for /dev/null as root that would replace the device node.
        raise _refuse(flag, given, "is not a regular file (a device, FIFO or socket); give a file path")
    if not in_place:
        if kind is JSON:
            other = json_command(real)
            if other != command:
                what = f"a ddpdoctor `{other}` document" if other else "not a ddpdoctor JSON document"
                raise _refuse(flag, given, f"exists and is {what}; {command} replaces only its own "
                              "documents: give a new file name, or remove the file first")
        elif kind is NCCL_TESTS_JSON:
            if not is_our_nccl_tests_json(real):
                raise _refuse(flag, given, "exists and is not an nccl-tests document ddpdoctor bench wrote; give "
                              "a new file name, or remove the file first")
        elif kind is PLOT:
            if not is_our_plot(real):
                raise _refuse(flag, given, "exists and is not a plot ddpdoctor wrote; give a new file name, "
                              "or remove the file first")
        else:
            raise _refuse(flag, given, f"already exists; ddpdoctor never replaces {kind.name} it did not "
                          "just read (--in-place replaces the input): give a new name, or remove the file first")
    if st.st_mode & 0o222 == 0 or not os.access(real, os.W_OK):
        raise _refuse(flag, given, "is read-only; make it writable first if it is to be replaced")
    euid = os.geteuid()
    if euid != 0 and st.st_uid != euid:
        raise _refuse(flag, given, f"belongs to another user (uid {st.st_uid}); replacing it would make it "
                      "yours: run as that user, or give another path")
    if euid != 0 and st.st_gid not in (os.getegid(), *os.getgroups()):
        raise _refuse(flag, given, f"belongs to group {st.st_gid}, which this user is not in; replacing it "
                      "would change its group: give another path")


@dataclass
class Plan:
    """Every input and output of one run, checked together before any work starts.

    Declare the inputs first (:meth:`reads`), then each output; an output that names an input or
    another output (by any alias, or inside an output folder) is refused with both options named.
    """

    command: str
    # (label, path, identity, the input folder it was found in or "")
    _inputs: list[tuple[str, str, tuple[Any, ...], str]] = field(default_factory=list)
    _input_folders: list[tuple[str, Path]] = field(default_factory=list)
    outputs: list[Target] = field(default_factory=list)

    def reads(self, label: str, path: str | os.PathLike[str] | None) -> None:
        """An input of the run (a folder's files count too); absent paths are the command's to report."""
        if path is None or os.fspath(path) in ("", STDOUT) or not os.path.exists(path):
            return
        text = os.fspath(path)
        self._inputs.append((label, text, _identity(path), ""))
        if os.path.isdir(path):
            self._input_folders.append((label, Path(os.path.realpath(path))))
            with contextlib.suppress(OSError):
                for entry in os.scandir(path):
                    if entry.is_file():
                        self._inputs.append((label, entry.path, _identity(entry.path), text))

    def reads_code(self, label: str, spec: str | None) -> None:
        """An input given as ``path.py:FN`` or ``MODULE:FN`` (--model, --batch): its file, when a path."""
        if spec:
            module = spec.rsplit(":", 1)[0]
            if module.endswith(".py") or os.sep in module:
                self.reads(label, module)

    def add(self, flag: str, path: str | os.PathLike[str], kind: Kind, **options: Any) -> Target:
        """Check ``path`` as an output of ``kind`` taken by ``flag``: first against the inputs and the
        outputs declared so far (the slip named as such), then by :func:`resolve`; keep it."""
        given = os.fspath(path)
        ident = _identity(given) if given else ("path", "")
        if not options.get("in_place"):
            for label, text, other, within in self._inputs:
                if other == ident and within:
                    # `fr DIR --json DIR/verdict.json` twice: the first document now sits among the inputs,
                    # and a file there is read as one (named like a dump, it even looks like one).
                    raise _refuse(flag, given, f"is a file in the input folder {label} {within}, which this run "
                                  "reads (an earlier output of ours there included); an output never replaces "
                                  f"what the command reads: write it outside {within}, or remove the file first")
                if other == ident:
                    same = os.path.abspath(text) == os.path.abspath(given)
                    alias = "" if same else f" {text} (the same file under another name)"
                    raise _refuse(flag, given, f"is the input {label}{alias}; an output never replaces what "
                                  "the command reads: give another path")
        for out in self.outputs:
            if out.identity == ident:
                raise _refuse(flag, given, f"names the same file as {out.flag} {out.given!r}; give each "
                              "output its own path")
        target = resolve(flag, given, kind, **options)
        if kind.folder:
            for label, folder in self._input_folders:
                if _inside(target.real, folder):
                    raise _refuse(flag, given, f"is inside the input {label} ({folder}); write the new "
                                  "folder somewhere else")
        for out in self.outputs:
            inner, outer = (target, out) if out.kind.folder else (out, target) if kind.folder else (None, None)
            if inner is not None and outer is not None and _inside(inner.real, outer.real):
                raise _refuse(flag, given, f"{inner.flag} {inner.given!r} would be written inside the folder "
                              f"of {outer.flag} {outer.given!r}; give it a path outside")
        self.outputs.append(target)
        if kind is JSON:
            _SESSION.accepted(target)
        return target

    def file(self, flag: str, path: str | os.PathLike[str] | None, kind: Kind, *,
             like: str | os.PathLike[str] | None = None) -> Target | None:
        """A file output (None when the option was not given)."""
        if path is None:
            return None
        return self.add(flag, path, kind, like=like)

    def json(self, flag: str, path: str | os.PathLike[str] | None) -> Target | None:
        """``--json PATH``: None when absent or ``-`` (stdout is never a file of the user's)."""
        if path is None or json_to_stdout(path):
            return None
        return self.add(flag, path, JSON, command=self.command)

    def folder(self, flag: str, path: str | os.PathLike[str] | None, kind: Kind, *,
               like: str | os.PathLike[str] | None = None) -> Target | None:
        """A folder output: new, or an empty folder (None when the option was not given)."""
        if path is None:
            return None
        return self.add(flag, path, kind, like=like)

    def in_place(self, flag: str, path: str | os.PathLike[str], kind: Kind) -> Target:
        """The input itself, replaced on purpose: a symlink is followed, its target rewritten."""
        return self.add(flag, path, kind, in_place=True)


def _inside(path: Path, folder: Path) -> bool:
    return path != folder and folder in path.parents


# ---- writing ------------------------------------------------------------------------------------------

def _live(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _writer_alive(pid: int, st: os.stat_result) -> bool | None:
    """Whether the process ``pid`` that is alive now is the one that wrote the partial output ``st``: True when
    it started before the file's last write (a pid is not reused while its process lives), False when it started
    after (the writer died and its pid went to another process), None when that cannot be read.

    A writer locks its file right after creating it (:func:`atomic_output`), so a sweep by another process of
    the same run (watch's ranks dump their Flight Recorder files into one folder at once) can find a fresh file
    not locked yet: its writer is alive, and it is no "older run that was killed"."""
    import psutil  # here, not at the top: only a sweep that finds a live pid needs it (ckpt strip's start-up)

    try:
        started = psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None
    return started <= st.st_mtime + 1.0  # create_time is read from the boot time and clock ticks: ~10 ms


def _remove_if_stale(path: str, st: os.stat_result, pid: int) -> str:
    """Remove a partial output when no process can still be writing it: nobody holds its lock (a writer
    keeps ``flock`` on it to the end) and its writer is gone (its pid is, or went to a process started after the
    file's last write). ``"removed"``, ``"live"`` (locked, or its writer still runs: a run is writing it), or
    ``"unproven"`` (unlocked, its pid alive, and whether that process is the writer cannot be read)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if stat.S_ISDIR(st.st_mode):
        flags |= os.O_DIRECTORY
    try:
        fd = os.open(path, flags)
    except OSError:
        return "unproven"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return "live"
        if _live(pid):
            writer = _writer_alive(pid, st)
            if writer is None:
                return "unproven"
            if writer:
                return "live"
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return "removed"
    except OSError:
        return "unproven"
    finally:
        os.close(fd)


def _size_text(path: str, st: os.stat_result) -> str:
    size = float(st.st_size)
    if stat.S_ISDIR(st.st_mode):
        size = float(sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink()))
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}"
        size /= 1000
    return ""


def sweep_partials(directory: Path) -> None:
    """Remove what killed runs of ours left in ``directory`` (see :func:`_remove_if_stale`); name on stderr
    the partial files of ours that cannot be proven stale. Never fails the run."""
    euid = os.geteuid()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if not (entry.name.startswith(".") and entry.name.endswith(PARTIAL_SUFFIX)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid != euid or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            continue  # another user's, or not something we create: not ours to judge
        match = _PARTIAL_NAME.match(entry.name)
        outcome = _remove_if_stale(entry.path, st, int(match.group(1))) if match is not None else "unproven"
        if outcome == "removed":
            print(f"ddpdoctor: removed {entry.path} ({_size_text(entry.path, st)}), left by an earlier run that "
                  "was killed while writing", file=sys.stderr)
        elif outcome == "unproven":
            print(f"ddpdoctor: note: {entry.path} ({_size_text(entry.path, st)}) is a partial output of an older "
                  "ddpdoctor run that was killed; remove it if no ddpdoctor is running", file=sys.stderr)


def _partial_name(name: str) -> str:
    return f".{name}.{os.getpid()}-{os.urandom(4).hex()}{PARTIAL_SUFFIX}"


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _new_mode(like: Path | None, base: int) -> int:
    """The mode a new file is created with (the kernel then applies the umask): at most ``like``'s."""
    if like is None:
        return base
    try:
        return base & os.stat(like).st_mode
    except OSError:
        return base


def replaces_existing(target: Target) -> bool:
    """Whether writing ``target`` replaces a file, and so fsyncs before the rename."""
    return target.real.exists()


@contextlib.contextmanager
def atomic_output(target: Target, phases: dict[str, float] | None = None) -> Iterator[BinaryIO]:
    """Yield a new temp file next to ``target``; on success rename it over ``target``.

    The target is checked again first (something may have appeared under the name since the plan). On
    any failure the temp file is removed, so no partial output is left behind; a process killed
    mid-write (SIGKILL, the OOM killer) leaves ``.<name>.<pid>-<hex>.ddpdoctor-partial``, which the next
    write into the folder removes (:func:`sweep_partials`). (O_TMPFILE would leave nothing, but linking it
    in through /proc/self/fd fails with EXDEV on some kernels and sandboxes, so it cannot be relied on.)

    Durability follows what is at stake. When the rename replaces an existing file (``ckpt strip
    --in-place`` replaces the user's checkpoint), the data and then the directory are fsynced, so a power
    loss leaves the old file or the new one, never neither. A new file is not fsynced, as ``cp`` and
    ``torch.save`` do not: everything ddpdoctor writes can be written again from its input, which a power
    loss never touches, and waiting for a 10 GB checkpoint to reach the disk would double the time of a
    strip (see benchmarks/ckpt_strip.py). Run ``sync FILE`` when a new file must be on disk now.

    ``phases``, when given, gets the seconds spent waiting for the disk (``"flush"``: the fsync of the
    data) and in ``"rename"`` (the rename and the folder's fsync), so a slow write shows where it waits.
    """
    fresh = resolve(target.flag, target.given, target.kind, command=target.command, in_place=target.in_place,
                    like=target.like)
    real, existing = fresh.real, fresh.existing
    directory = real.parent
    sweep_partials(directory)
    tmp = directory / _partial_name(real.name)
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     _new_mode(target.like, 0o666))
    except OSError as exc:
        raise DoctorError(f"cannot write to output directory {directory}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # "a writer is alive": the sweep of a concurrent run leaves it be
        with os.fdopen(fd, "w+b") as fh:
            yield fh
            start = time.perf_counter()
            fh.flush()
            if existing is not None:
                _keep_owner_and_mode(fh.fileno(), existing, fresh)
                os.fsync(fh.fileno())
            renamed = time.perf_counter()
            os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if existing is not None:
        # Without it the rename itself may not survive a power loss (the old name would come back).
        _fsync_dir(directory)
    if phases is not None:
        phases["flush"] = round(phases.get("flush", 0.0) + renamed - start, 6)
        phases["rename"] = round(phases.get("rename", 0.0) + time.perf_counter() - renamed, 6)


def _keep_owner_and_mode(fd: int, existing: os.stat_result, target: Target) -> None:
    """Give the new file the replaced one's owner, group and mode (chown first: it clears set-id bits)."""
    own = os.fstat(fd)
    if (own.st_uid, own.st_gid) != (existing.st_uid, existing.st_gid):
        try:
            os.fchown(fd, existing.st_uid, existing.st_gid)
        except OSError as exc:
            raise _refuse(target.flag, target.given, f"cannot keep its owner and group ({exc.strerror}); "
                          "nothing was replaced") from None
    os.fchmod(fd, existing.st_mode & 0o7777)


@contextlib.contextmanager
def atomic_folder(target: Target) -> Iterator[Path]:
    """A new temp folder next to ``target``, renamed to it when complete, removed on any error.

    The folder counterpart of :func:`atomic_output` (DCP and shard-set outputs): the target never holds a
    half-written checkpoint. It must not exist, or be an empty folder (rename(2) replaces an empty folder
    in one step). The folder gets the umask's mode, at most ``target.like``'s (a read-only input folder
    gives a read-only output; applied once everything is written, or the files could not go in).
    """
    fresh = resolve(target.flag, target.given, target.kind, like=target.like)
    directory = fresh.real.parent
    sweep_partials(directory)
    tmp = directory / _partial_name(fresh.real.name)
    try:
        os.mkdir(tmp, 0o777)
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise DoctorError(f"cannot write to output directory {directory}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield tmp
        if target.like is not None:
            os.chmod(tmp, os.stat(tmp).st_mode & 0o7777 & os.stat(target.like).st_mode)
        os.rename(tmp, fresh.real)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(fd)


def create_in(folder: Path, name: str, like: str | os.PathLike[str] | None = None) -> BinaryIO:
    """A new file ``name`` in a folder this run is writing (a temp folder, the evidence folder), opened for
    writing; never replaces anything (``O_EXCL``), never follows a link planted under the name."""
    mode = _new_mode(Path(like) if like is not None else None, 0o666)
    fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    return os.fdopen(fd, "wb")


def copy_into(src: Path, folder: Path, name: str) -> None:
    """Copy ``src`` (a file, or a folder with everything in it) to ``folder/name``, as ``cp -r`` would:
    contents and times; modes at most the source's, under the umask. Links are followed (a Hugging Face
    cache snapshot is all symlinks to blobs); anything but files and folders is refused."""
    dst = folder / name
    st = os.stat(src)
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(dst, 0o777)
        for child in sorted(os.listdir(src)):
            copy_into(src / child, dst, child)
        os.chmod(dst, os.stat(dst).st_mode & 0o7777 & st.st_mode)
        return
    if not stat.S_ISREG(st.st_mode):
        raise DoctorError(f"{src} is not a regular file or folder (a device, FIFO or socket); "
                          "move it out of the checkpoint folder first")
    with open(src, "rb") as fin, create_in(folder, name, like=src) as fout:
        shutil.copyfileobj(fin, fout, 8 << 20)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def write_bytes(target: Target, data: bytes) -> None:
    """``data`` to ``target`` atomically; a failed write (full disk, quota) is one line, nothing left."""
    try:
        with atomic_output(target) as handle:
            handle.write(data)
    except OSError as exc:
        raise DoctorError(f"cannot write {target.given!r}: {exc.strerror or exc}") from None


def _json_bytes(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, default=str) + "\n").encode("utf-8")


def write_json(path: str | os.PathLike[str], doc: dict[str, Any], command: str, flag: str = "--json") -> None:
    """The document, stamped (:func:`stamp`), written atomically to ``path`` under the policy."""
    write_bytes(resolve(flag, path, JSON, command=command), _json_bytes(stamp(doc, command)))
    _SESSION.written(path)


def emit_json(path: str | os.PathLike[str], doc: dict[str, Any], command: str) -> None:
    """The ``--json PATH`` convention: ``-`` prints the stamped document on stdout, anything else is
    written atomically under the policy."""
    if json_to_stdout(path):
        sys.stdout.write(json.dumps(stamp(doc, command), indent=2, default=str) + "\n")
        sys.stdout.flush()
    else:
        write_json(path, doc, command)


def write_private_json(path: Path, doc: dict[str, Any]) -> None:
    """A runtime file in a private folder (the stack-dump registry): stamped, mode 0600, written to a new
    temp file (``O_EXCL | O_NOFOLLOW``: never through a link) and renamed over ``path`` (never followed)."""
    tmp = path.parent / _partial_name(path.name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(_json_bytes(stamp(doc, "stack registration")))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


# ---- the run's session: the error document of a failed run -------------------------------------------

@dataclass
class _Session:
    """The ``--json`` files this process accepted, and what each held then (to tell whether this run
    wrote it)."""

    active: bool = False
    targets: list[tuple[Target, tuple[Any, ...] | None]] = field(default_factory=list)

    def accepted(self, target: Target) -> None:
        if self.active and target.flag == "--json":
            self.targets.append((target, _state(target.real)))

    def written(self, path: str | os.PathLike[str]) -> None:
        real = Path(os.path.realpath(path))
        self.targets = [(t, s) for t, s in self.targets if t.real != real]


def _state(path: Path) -> tuple[Any, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


_SESSION = _Session()


def begin_session() -> None:
    """Called by the CLI before a command runs: from now on accepted ``--json`` files are remembered."""
    _SESSION.active = True
    _SESSION.targets = []


def end_session(exit_code: int, message: str | None, version: str) -> None:
    """After the command: a failed run (exit code not 0) whose ``--json`` file was not written by it gets
    an error document there, so the file never shows an older run's result as if it were this one's.

    Only the process that writes the result does it: with a launcher (``RANK`` set) rank 0.
    """
    targets, _SESSION.targets, _SESSION.active = _SESSION.targets, [], False
    if exit_code == 0 or os.environ.get("RANK", "0") != "0":
        return
    for target, before in targets:
        if _state(target.real) != before or target.command is None:
            continue  # this run (or a rank of it) wrote its result there
        doc = {"version": version, "status": "error", "exit_code": exit_code,
               "error": message or f"ddpdoctor {target.command} ended with exit code {exit_code} before "
                                   "writing its result (see its error output)"}
        with contextlib.suppress(DoctorError, OSError):
            write_bytes(resolve(target.flag, target.given, JSON, command=target.command),
                        _json_bytes(stamp(doc, target.command)))


def write_error(path: str | os.PathLike[str], exc: OSError) -> DoctorError:
    """A one-line error for a failure while writing (disk full, quota, I/O error)."""
    return DoctorError(f"could not write {os.fspath(path)}: {exc.strerror or exc}; nothing was written")


__all__ = ["CHECKPOINT_FOLDER", "EVIDENCE_FOLDER", "FR_DUMP", "JSON", "PARTIAL_SUFFIX", "PLOT", "PLOT_MARK",
           "SAFETENSORS", "STDOUT", "TEXT", "TORCH_FILE", "Kind", "Plan", "Target", "atomic_folder", "atomic_output",
           "begin_session", "copy_into", "create_in", "emit_json", "end_session", "fits", "has_file_extension",
           "is_our_json", "is_our_plot", "json_command", "json_to_stdout", "replaces_existing", "resolve", "stamp",
           "sweep_partials", "write_bytes", "write_error", "write_json", "write_private_json"]
