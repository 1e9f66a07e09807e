"""Opening any checkpoint without running it: a file, a DCP folder or a shard set, and its object tree.

Files are :mod:`ddpdoctor.ckpt.files`' job; the two folder layouts are ``torch.distributed.checkpoint``
(:mod:`ddpdoctor.ckpt.dcp`) and Hugging Face style shard sets (:mod:`ddpdoctor.ckpt.sharded`, whose shards
are files). This module sits on top of all three, so that none of them needs it (no import circle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor.ckpt import filecopy
from ddpdoctor.ckpt.files import FileCheckpoint, open_file
from ddpdoctor.ckpt.model import CHECK_ID, FORMAT_DCP, FORMAT_SHARDED
from ddpdoctor.errors import DoctorError
from ddpdoctor.findings import FAIL, WARN, Finding

if TYPE_CHECKING:
    from ddpdoctor.ckpt import dcp, sharded


@dataclass
class Checkpoint(FileCheckpoint):
    """Any opened checkpoint: a file's fields, and for a folder its layout (a DCP folder or a shard set)."""

    dcp: dcp.DcpDir | None = None
    shards: sharded.ShardSet | None = None

    def unavailable(self) -> list[tuple[Any, ...]]:
        """Key paths the folder names (in ``.metadata`` or the shard index) whose data is in a missing file.

        ``dcp.load`` or loading through the index fails on exactly these; a single file has none."""
        if self.dcp is not None:
            return self.dcp.unavailable()
        return self.shards.unavailable() if self.shards is not None else []


def open_checkpoint(path: str | Path, *, trust: bool = False, for_rewrite: bool = False) -> Checkpoint:
    """Open a checkpoint for inspection or rewriting; never runs code from it unless ``trust`` and ``for_rewrite``.

    A folder on the way that this user may not enter or list is one line: ``pathlib``'s ``exists()`` and
    ``is_dir()`` raise ``PermissionError`` there rather than answer False.
    """
    filecopy.refuse_empty(path)
    try:
        return _open_checkpoint(path, trust=trust, for_rewrite=for_rewrite)
    except PermissionError as exc:
        where = exc.filename or path
        raise DoctorError(f"cannot read {where}: permission denied (check the folder's and the file's "
                          "permissions for this user)") from None


def _open_checkpoint(path: str | Path, *, trust: bool, for_rewrite: bool) -> Checkpoint:
    directory = Path(path)
    if not directory.is_dir() and directory.suffix != ".json":
        # One file (a shard set may be named by its .index.json): the folder formats are not even
        # imported, which is start-up time every single-file command would pay.
        f = open_file(path, trust=trust, for_rewrite=for_rewrite)
        return Checkpoint(f.path, f.format, f.root, f.size_bytes, f.unsafe_globals, f.zip, f.safetensors)
    from ddpdoctor.ckpt import dcp, sharded

    if dcp.is_dcp_dir(directory):
        d = dcp.open_dcp(directory)
        return Checkpoint(directory, FORMAT_DCP, dcp.tree(d), sum(d.files.values()) + (directory / dcp.METADATA)
                          .stat().st_size, dcp=d)
    if sharded.is_shard_set(directory):
        shards = sharded.open_shards(directory, trust=trust, for_rewrite=for_rewrite)
        return Checkpoint(shards.directory, FORMAT_SHARDED, shards.root, shards.size_bytes, shards=shards)
    f = open_file(path, trust=trust, for_rewrite=for_rewrite)
    return Checkpoint(f.path, f.format, f.root, f.size_bytes, f.unsafe_globals, f.zip, f.safetensors)


# How many names a layout finding's summary shows, and how many its details keep.
_SHOWN, _DETAIL_ITEMS = 5, 20


def _some(items: list[str], n: int = _SHOWN) -> str:
    return ", ".join(items[:n]) + (f", ... ({len(items)} in all)" if len(items) > n else "")


def layout_findings(ckpt: Checkpoint, details: dict[str, Any], *,
                    absent_model_keys: list[str] | None = None) -> list[Finding]:
    """A folder's own problems, as findings (``details`` added to each): data files or shards that are missing
    or cut short, index entries that point nowhere, shards the index does not name. Empty for a single file.

    One place for ``ckpt inspect``, ``ckpt diff`` and the ``state_dict`` check: a missing rank file fails
    ``dcp.load`` however well the keys fit, so ``diff`` reports it as ``inspect`` does.
    ``absent_model_keys`` (from ``diff``): a model's keys in no shard present of a set without an index,
    named under the missing shard that must hold them rather than blamed on the architecture.
    """
    found: list[Finding] = []

    def finding(status: str, kind: str, summary: str, remedy: str, **more: Any) -> None:
        found.append(Finding(CHECK_ID, status, summary, remedy=remedy, details={**details, "kind": kind, **more}))

    if ckpt.dcp is not None:
        d = ckpt.dcp
        if d.missing_files:
            gone = set(d.missing_files)
            keys = [e.fqn for e in d.entries.values() if any(c.file in gone for c in e.chunks)]
            finding(FAIL, "missing_data_files",
                    f"data file(s) named by .metadata are missing: {_some(d.missing_files)}; dcp.load fails on the "
                    f"{len(keys)} key(s) stored there: {_some(keys)}",
                    "copy every rank's __<rank>_<n>.distcp file with the .metadata (they are written by each rank "
                    "to its own path; a per-node local disk loses the other nodes' files)",
                    files=d.missing_files, keys=keys[:_DETAIL_ITEMS], key_count=len(keys))
        if d.short_files:
            finding(FAIL, "short_data_files",
                    f"data file(s) end before the data .metadata places in them: {_some(d.short_files)} "
                    "(truncated copy)", "copy the checkpoint again, or use an earlier one", files=d.short_files)
    if ckpt.shards is None:
        return found
    sh = ckpt.shards
    if sh.missing:
        keys = [str(p[0]) for p in sh.unavailable()]
        if keys:
            held = f"loading fails on the {len(keys)} key(s) the index places there: {_some(keys)}"
        elif absent_model_keys:
            keys = absent_model_keys
            held = f"the model's {len(keys)} key(s) found in no shard present must be there: {_some(keys)}"
        else:
            held = "loading fails on the keys stored there (without an index nothing says which)"
        finding(FAIL, "missing_shards", f"shard file(s) missing: {_some(sh.missing)}; {held}",
                "download or copy the missing shard(s) again", files=sh.missing, keys=keys[:_DETAIL_ITEMS],
                key_count=len(keys))
    if sh.index_absent:
        absent = [f"{e['key']} (in {e['file']})" for e in sh.index_absent]
        finding(FAIL, "index_points_nowhere",
                f"{len(absent)} index entr{'y points' if len(absent) == 1 else 'ies point'} at tensors "
                f"the shard does not hold: {_some(absent, 3)}",
                "the index and the shards come from different saves: take both from the same one")
    if sh.duplicates:
        finding(FAIL, "duplicate_keys", f"key(s) stored in more than one shard: {_some(sh.duplicates, 3)}",
                "the shards come from different saves: take them all from the same one")
    if sh.extra:
        finding(WARN, "extra_shards", f"shard file(s) not in the index: {_some(sh.extra)} (left over from "
                "another save?); loading ignores them", "delete them, or use the index they belong to")
    if sh.unindexed:
        keys = [e["key"] for e in sh.unindexed]
        finding(WARN, "unindexed_tensors", f"{len(keys)} tensor(s) in the shards are not in the index: "
                f"{_some(keys, 3)}; loading through the index never reads them", "regenerate the index from the shards")
    return found
