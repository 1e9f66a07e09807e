"""The ckpt family's data: what is found in a checkpoint, and what each command reports.

The bottom layer of :mod:`ddpdoctor.ckpt`: it imports none of the family's modules, and every other one
produces or consumes these (an opened checkpoint is :class:`ddpdoctor.ckpt.formats.Checkpoint`); keeping them here (and not in the
renderers) lets the state_dict check and the Python API use the reports without the text output.
Findings are :class:`ddpdoctor.findings.Finding` with check id ``state_dict``, the same objects
``ddpdoctor check`` reports.
"""

from __future__ import annotations

import reprlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ddpdoctor.errors import DoctorError
from ddpdoctor.findings import Finding, overall_status

# A key as text: containers shown a few levels and items deep, strings and numbers cut (reprlib).
_KEY_REPR = reprlib.Repr()  # attributes, not keywords: those arrived in Python 3.12
_KEY_REPR.maxlevel, _KEY_REPR.maxstring, _KEY_REPR.maxlong, _KEY_REPR.maxother = 3, 80, 40, 80
_KEY_REPR.maxtuple = _KEY_REPR.maxlist = _KEY_REPR.maxdict = _KEY_REPR.maxset = _KEY_REPR.maxfrozenset = 4


def key_text(key: Any) -> str:
    """A checkpoint key for a report, bounded in length whatever the file put there.

    Keys are names (``str``) in every real checkpoint; a crafted one may use a tuple or, in an
    ``OrderedDict``, a list holding shared references that expand to millions of items: ``str()`` of it
    wrote a 1.9 GB ``ckpt inspect`` report from a 1.6 KiB file. ``reprlib`` stops at a few items per level.
    """
    if isinstance(key, str):
        return key if len(key) <= 200 else key[:200] + "..."
    return _KEY_REPR.repr(key)


FORMAT_ZIP = "torch_zip"
FORMAT_LEGACY = "torch_legacy"
FORMAT_SAFETENSORS = "safetensors"
FORMAT_DCP = "dcp"
FORMAT_SHARDED = "sharded"

# The check id ckpt findings carry (docs/checks.md): `ckpt inspect/diff` and the `state_dict` check agree.
CHECK_ID = "state_dict"


class DuplicateKeyError(DoctorError, ValueError):
    """Stripping would map two keys to one name (the checkpoint mixes wrapped and unwrapped keys)."""


class UnsafeCheckpointError(DoctorError):
    """The checkpoint's pickle names a global outside ``torch.load(weights_only=True)``'s allowlist.

    Its text ends with the ``ckpt`` commands' way out (``--trust``); a caller with no such option (the
    ``state_dict`` check) words its own advice from ``path`` and ``name`` instead of repeating advice that
    does not work there.
    """

    def __init__(self, path: str, name: str) -> None:
        self.path, self.name = path, name
        super().__init__(f"{self.problem}. If you trust where the file came from, pass --trust")

    @property
    def problem(self) -> str:
        """What is wrong, without the advice."""
        return (f"{self.path} needs {self.name} to load, which torch.load(weights_only=True) refuses: unpickling "
                "it can run arbitrary code")


@dataclass(frozen=True)
class TensorMeta:
    """What a tensor is without its data: shape, dtype, and which storage holds it."""

    shape: tuple[int, ...] | None
    dtype: str | None
    storage: str | None
    storage_bytes: int


@dataclass(frozen=True)
class StoredObject:
    """A non-tensor value a DCP directory stores as its own pickle (epoch, lr...): named, never unpickled."""

    key: str
    size_bytes: int


@dataclass
class StateDictLoc:
    """A state_dict found in the checkpoint: the key path to it and the node itself."""

    path: tuple[str, ...]
    node: Any

    @property
    def name(self) -> str:
        return "/".join(self.path) if self.path else "(top level)"


@dataclass
class InspectReport:
    """What ``ckpt inspect`` found: format, tensors, state_dicts and their prefixes, other entries, findings."""

    path: str
    format: str
    size_bytes: int
    tensor_count: int
    tensor_bytes: int
    dtypes: dict[str, int]
    state_dicts: list[dict[str, Any]]
    other_entries: list[dict[str, str]]
    unsafe_globals: list[str]
    findings: list[Finding]
    # A directory's own structure (DCP files and ranks, shard files); None for a single file.
    layout: dict[str, Any] | None = None

    @property
    def status(self) -> str:
        """pass|warn|fail: the worst finding."""
        return overall_status(self.findings)

    def to_json(self) -> dict[str, Any]:
        data = {
            "path": self.path, "format": self.format, "size_bytes": self.size_bytes,
            "tensor_count": self.tensor_count, "tensor_bytes": self.tensor_bytes, "dtypes": self.dtypes,
            "state_dicts": self.state_dicts, "other_entries": self.other_entries,
            "unsafe_globals": self.unsafe_globals, "findings": [f.to_json() for f in self.findings],
            "status": self.status,
        }
        if self.layout is not None:
            data["layout"] = self.layout
        return data


@dataclass
class Fix:
    """A key rename: strip these prefixes from each key, then add ``add``."""

    strip: tuple[str, ...]
    add: str

    def describe(self) -> str:
        parts = [f"remove {' and '.join(repr(p) for p in self.strip)}"] if self.strip else []
        if self.add:
            parts.append(f"add {self.add!r}")
        return " then ".join(parts) or "no change"


@dataclass
class DiffReport:
    """What ``ckpt diff`` found: the mismatch as saved, the best rename, and the verdict as a finding.

    ``missing``/``unexpected``/``shape_mismatches`` are what ``load_state_dict(strict=True)`` would report
    for the keys as saved; ``fix`` is the best rename (None when no rename helps), with ``remaining_*``
    when it is not enough.
    """

    path: str
    format: str
    model: str
    location: str
    checkpoint_keys: int
    model_keys: int
    loads_as_is: bool
    missing: list[str]
    unexpected: list[str]
    shape_mismatches: list[dict[str, Any]]
    fix: dict[str, Any] | None
    finding: Finding
    # Keys of the compared state_dict whose data is in a missing file (a rank's .distcp, a shard), and the
    # folder's own failures (that file missing): the load fails on them however well the keys fit.
    unavailable_keys: list[str] = field(default_factory=list)
    layout_findings: list[Finding] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        """The folder's failures (the first thing to fix), then the key verdict: what the ``state_dict``
        check reports."""
        return [*self.layout_findings, self.finding]

    @property
    def status(self) -> str:
        """pass only when the checkpoint loads as is (its keys fit and no file of it is missing)."""
        return overall_status(self.findings)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("finding", "layout_findings")}
        data.update(status=self.status, findings=[f.to_json() for f in self.findings])
        return data


@dataclass
class StripReport:
    """What ``strip`` did: where, which prefixes, how many keys; JSON-able."""

    path: str
    output: str
    format: str
    state_dicts: list[dict[str, Any]]
    renamed_keys: int
    converted_from_legacy: bool = False
    written: bool = True
    # Where the run's time went, in seconds (:class:`Phases`): a slow strip shows whether it waited on
    # reading the checkpoint's pickle, the kernel copy, the disk (flush) or the rename.
    phases_s: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Phases:
    """Seconds per phase of a command, measured back to back: each :meth:`lap` ends the running phase.

    The phases of ``ckpt strip`` are ``open`` (the input's format, zip directory and pickle), ``plan``
    (the renames and the output's checks), ``prepare`` (the temp file), ``pickle`` (the renamed pickle
    written and checked), ``copy`` (headers and the kernel copy of the tensor bytes), then ``flush`` (the
    fsync, only when a file is replaced) and ``rename``, which the output policy reports itself.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()

    def lap(self, name: str) -> None:
        """The time since the last lap (or the start) goes to ``name``."""
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._since, 6)
        self._since = now

    def restart(self) -> None:
        """Start the next phase now (what happened since the last lap was counted elsewhere)."""
        self._since = time.perf_counter()


@dataclass
class LoadReport:
    """What :func:`ddpdoctor.ckpt.load_checkpoint_into` did."""

    path: str
    format: str
    location: str
    stripped_prefixes: list[str]
    added_prefix: str
    renamed_keys: int
    loaded_keys: int
    missing: list[str]
    unexpected: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
