"""Hugging Face style sharded checkpoints: shard files plus an index, read and stripped shard by shard.

``transformers`` (``PreTrainedModel.save_pretrained``, ``huggingface_hub.split_torch_state_dict_into_shards``)
saves a large state_dict as ``model-00001-of-00003.safetensors``, ... (or ``pytorch_model-00001-of-00003.bin``,
each a ``torch.save`` of a flat state_dict) and an index, ``model.safetensors.index.json`` /
``pytorch_model.bin.index.json``: ``{"metadata": {"total_size": N}, "weight_map": {key: shard file}}``.
Loading reads the index and then each shard, so a shard that is missing, or an index entry whose shard
does not hold that tensor, fails only at load time; here both are named up front. Each shard is opened as
a single checkpoint file (:func:`ddpdoctor.ckpt.files.open_file`: nothing executed, no tensor read), and
stripping rewrites each shard the way ``strip`` rewrites one file, keeping the same sharding.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor import outputs
from ddpdoctor.ckpt import filecopy
from ddpdoctor.ckpt.files import FileCheckpoint, open_file
from ddpdoctor.ckpt.locate import find_state_dicts, mapping_pairs
from ddpdoctor.errors import DoctorError
from ddpdoctor.outputs import PARTIAL_SUFFIX
from ddpdoctor.safejson import UntrustedJSONError, loads_untrusted

INDEX_SUFFIX = ".index.json"
# transformers.utils: SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME; the first is preferred when both exist.
_PREFERRED_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<n>\d{5})-of-(?P<m>\d{5})\.(?P<ext>safetensors|bin|pt|pth)$")
_MAX_INDEX = 200_000_000


def is_shard_set(path: Path) -> bool:
    """An index file, or a directory with an index or ``-0000N-of-0000M`` shard files."""
    if path.is_file():
        return path.name.endswith(INDEX_SUFFIX)
    if not path.is_dir():
        return False
    return any(c.name.endswith(INDEX_SUFFIX) or _SHARD.match(c.name) for c in _files(path))


@dataclass
class Shard:
    """One shard file, opened as a checkpoint, and the keys of its state_dict."""

    name: str
    ckpt: FileCheckpoint
    keys: list[str]
    node: Any


@dataclass
class ShardSet:
    """A shard set: its index (if any), its shards, and what does not add up between them."""

    directory: Path
    index_name: str | None
    index: dict[str, Any] | None
    shards: list[Shard]
    root: dict[str, Any]
    size_bytes: int
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    index_absent: list[dict[str, str]] = field(default_factory=list)
    unindexed: list[dict[str, str]] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    other_indexes: list[str] = field(default_factory=list)

    def unavailable(self) -> list[tuple[Any, ...]]:
        """The key paths (``(key,)``: the set is one flat state_dict) the index places in a missing shard.

        Empty without an index: nothing then says which keys a missing shard held."""
        if self.index is None or not self.missing:
            return []
        gone = set(self.missing)
        return [(k,) for k, f in self.index["weight_map"].items() if f in gone]

    def layout(self) -> dict[str, Any]:
        return {"kind": "sharded", "index": self.index_name,
                "shards": [{"file": s.name, "format": s.ckpt.format, "keys": len(s.keys),
                            "size_bytes": s.ckpt.size_bytes} for s in self.shards],
                "missing_shards": self.missing, "extra_shards": self.extra,
                "index_missing_tensors": self.index_absent, "unindexed_tensors": self.unindexed,
                "duplicate_keys": self.duplicates, "other_index_files": self.other_indexes}


def _files(directory: Path) -> list[Path]:
    """The regular files in a checkpoint folder; one line (exit 2) when the folder cannot be read."""
    try:
        return [c for c in directory.iterdir() if c.is_file()]
    except OSError as exc:
        raise DoctorError(f"cannot read the folder {directory}: {exc.strerror or exc}") from None


def _read_index(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > _MAX_INDEX:
            raise DoctorError(f"{path} is too large for a shard index ({size} bytes)")
        data = loads_untrusted(path.read_bytes())
    except OSError as exc:
        raise DoctorError(f"cannot read the shard index {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, UntrustedJSONError) as exc:
        raise DoctorError(f"{path} is not a valid shard index: the JSON does not parse "
                          f"({type(exc).__name__}: {str(exc)[:200]})") from None
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()):
        raise DoctorError(f"{path} is not a valid shard index: no \"weight_map\" of tensor names to shard files")
    for f in set(wmap.values()):
        if "/" in f or "\\" in f or f in ("", ".", ".."):
            raise DoctorError(f"{path}: shard file name {f!r} points outside the directory")
    return data


def _pick_index(directory: Path) -> tuple[Path | None, list[str]]:
    indexes = sorted(c.name for c in _files(directory) if c.name.endswith(INDEX_SUFFIX))
    if not indexes:
        return None, []
    chosen = next((n for n in _PREFERRED_INDEXES if n in indexes), indexes[0])
    return directory / chosen, [n for n in indexes if n != chosen]


def _index_stem(index_name: str) -> str:
    """``model.safetensors.index.json`` -> ``model``: the stem its shards are named after."""
    base = index_name[: -len(INDEX_SUFFIX)]
    return base.rsplit(".", 1)[0] if "." in base else base


def open_shards(path: Path, *, trust: bool = False, for_rewrite: bool = False) -> ShardSet:
    """Open every shard (index file or directory); inconsistencies are recorded, not raised.

    ``for_rewrite``: as for :func:`~ddpdoctor.ckpt.files.open_file`, trusted legacy ``.bin`` shards
    are then loaded as real objects, since ``torch.save`` converts them (a shadow graph cannot be saved)."""
    index_path: Path | None
    others: list[str] = []
    if path.is_file():
        directory, index_path = path.parent, path
    else:
        directory = path
        index_path, others = _pick_index(directory)
    index = _read_index(index_path) if index_path is not None else None
    present = {c.name for c in _files(directory)}
    pattern_files = [m for n in sorted(present) if (m := _SHARD.match(n))]
    missing: list[str] = []
    extra: list[str] = []
    if index is not None:
        assert index_path is not None
        wmap: dict[str, str] = index["weight_map"]
        names = sorted(set(wmap.values()))
        missing = [n for n in names if n not in present]
        stem = _index_stem(index_path.name)
        exts = {n.rsplit(".", 1)[-1] for n in names}
        extra = [m.string for m in pattern_files if m.group("stem") == stem and m.group("ext") in exts
                 and m.string not in names]
    else:
        if not pattern_files:
            raise DoctorError(f"{path}: no shard index (*.index.json) and no -0000N-of-0000M shard files")
        groups: dict[tuple[str, str, str], list[str]] = {}
        for m in pattern_files:
            groups.setdefault((m.group("stem"), m.group("m"), m.group("ext")), []).append(m.string)
        if len(groups) > 1:
            raise DoctorError(f"{path} holds several shard sets ({', '.join(sorted(k[0] for k in groups))}) and no "
                              "index; give the index file")
        (stem, total, ext), names = next(iter(groups.items()))
        expected = [f"{stem}-{i:05d}-of-{total}.{ext}" for i in range(1, int(total) + 1)]
        missing = [n for n in expected if n not in present]
        extra = [n for n in names if n not in expected]
        names = [n for n in expected if n in present]
        wmap = {}
    shards: list[Shard] = []
    root: dict[str, Any] = {}
    owner: dict[str, str] = {}
    duplicates: list[str] = []
    for name in names:
        if name not in present:
            continue
        ckpt = open_file(directory / name, trust=trust, for_rewrite=for_rewrite)
        locs = find_state_dicts(ckpt.root)
        if len(locs) != 1 or locs[0].path:
            raise DoctorError(f"{directory / name} is not a shard: a shard holds one flat state_dict "
                              f"(found {len(locs)} state_dict(s){' nested' if locs and locs[0].path else ''})")
        pairs = mapping_pairs(locs[0].node) or []
        keys = [k for k, _ in pairs]
        for k, v in pairs:
            if k in owner:
                duplicates.append(k)
            owner[k] = name
            root[k] = v
        shards.append(Shard(name, ckpt, keys, locs[0].node))
    index_absent = [{"key": k, "file": f} for k, f in wmap.items()
                    if f not in missing and owner.get(k) != f and f in {s.name for s in shards}]
    unindexed = [{"key": k, "file": f} for k, f in owner.items() if index is not None and k not in wmap]
    size = sum(s.ckpt.size_bytes for s in shards) + (index_path.stat().st_size if index_path else 0)
    return ShardSet(directory, index_path.name if index_path else None, index, shards, root, size, missing,
                    extra, index_absent, unindexed, duplicates, others)


def check_complete(shards: ShardSet) -> None:
    """DoctorError when stripping would write a shard set that cannot load."""
    if shards.missing:
        raise DoctorError(f"{shards.directory} is incomplete: shard {', '.join(shards.missing)} is missing; "
                          "nothing was written")
    if shards.index_absent:
        first = shards.index_absent[0]
        raise DoctorError(f"{shards.directory}: the index places {first['key']!r} in {first['file']}, which does "
                          f"not hold it ({len(shards.index_absent)} such entries); nothing was written")
    if shards.duplicates:
        raise DoctorError(f"{shards.directory}: {shards.duplicates[0]!r} is in more than one shard; "
                          "nothing was written")


def new_index(shards: ShardSet, renames: dict[str, str]) -> bytes:
    """The index with renamed keys, everything else kept (``metadata.total_size`` and whatever else it has)."""
    assert shards.index is not None
    data = dict(shards.index)
    data["weight_map"] = {renames.get(k, k): v for k, v in shards.index["weight_map"].items()}
    # transformers writes the index with indent=2 and sorted keys.
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def carried_entries(shards: ShardSet) -> list[str]:
    """What a stripped copy carries besides the rewritten shards and index: every other file and folder
    (``config.json``, ``tokenizer/``, ``.gitattributes``...), links followed. DoctorError, listing them,
    when something could not be carried faithfully: another index or shard files the index does not name
    (copied unstripped they would contradict the stripped set), a broken link, a FIFO or device."""
    rewritten = {s.name for s in shards.shards} | ({shards.index_name} - {None})
    try:
        names = sorted(os.listdir(shards.directory))
    except OSError as exc:
        raise DoctorError(f"cannot read the folder {shards.directory}: {exc.strerror or exc}") from None
    carried: list[str] = []
    unstripped: list[str] = []
    odd: list[str] = []
    for name in names:
        if name in rewritten or (name.startswith(".") and name.endswith(PARTIAL_SUFFIX)):
            continue  # what strip rewrites, and what a killed ddpdoctor run left
        if name in shards.other_indexes or _SHARD.match(name):
            unstripped.append(name)
            continue
        try:
            mode = os.stat(shards.directory / name).st_mode
        except OSError:
            odd.append(f"{name} (a broken link)")
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            odd.append(f"{name} (not a file or folder)")
            continue
        carried.append(name)
    # What is copied must be readable: found at the copy, an unreadable config.json read as "could not write OUT".
    filecopy.check_readable(_files_below(shards.directory, carried))
    if unstripped:
        raise DoctorError(f"{shards.directory} also holds {', '.join(unstripped)}, which strip would not rewrite "
                          f"(it strips the set of {shards.index_name or 'the shard files'}): move them out, or "
                          "strip that set from its own index; nothing was written")
    if odd:
        raise DoctorError(f"{shards.directory} holds {', '.join(odd)}, which cannot be copied into the stripped "
                          "set; move it out first; nothing was written")
    return carried


def _files_below(directory: Path, names: list[str]) -> Iterator[Path]:
    """The files ``names`` (files and folders of ``directory``) stand for, folders walked (links inside them not
    followed: a link loop must not make this walk endless; the copy itself reports what it cannot read)."""
    for name in names:
        path = directory / name
        if not path.is_dir():
            yield path
            continue
        for root, _dirs, files in os.walk(path, onerror=_unreadable_folder):
            yield from (Path(root) / f for f in files)


def _unreadable_folder(exc: OSError) -> None:
    raise DoctorError(f"cannot read {exc.filename}: {exc.strerror or exc}")


def copy_other_files(shards: ShardSet, tmp: Path) -> None:
    """Everything :func:`carried_entries` names, copied into the new set (folders with all they hold)."""
    for name in carried_entries(shards):
        outputs.copy_into(shards.directory / name, tmp, name)
