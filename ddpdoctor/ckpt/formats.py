"""Opening any checkpoint without running it: a file, a DCP folder or a shard set, and its object tree.

Files are :mod:`ddpdoctor.ckpt.files`' job; the two folder layouts are ``torch.distributed.checkpoint``
(:mod:`ddpdoctor.ckpt.dcp`) and Hugging Face style shard sets (:mod:`ddpdoctor.ckpt.sharded`, whose shards
are files). This module sits on top of all three, so that none of them needs it (no import circle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ddpdoctor.ckpt.files import FileCheckpoint, open_file
from ddpdoctor.ckpt.model import FORMAT_DCP, FORMAT_SHARDED
from ddpdoctor.errors import DoctorError

if TYPE_CHECKING:
    from ddpdoctor.ckpt import dcp, sharded


@dataclass
class Checkpoint(FileCheckpoint):
    """Any opened checkpoint: a file's fields, and for a folder its layout (a DCP folder or a shard set)."""

    dcp: dcp.DcpDir | None = None
    shards: sharded.ShardSet | None = None


def open_checkpoint(path: str | Path, *, trust: bool = False, for_rewrite: bool = False) -> Checkpoint:
    """Open a checkpoint for inspection or rewriting; never runs code from it unless ``trust`` and ``for_rewrite``.

    A folder on the way that this user may not enter or list is one line: ``pathlib``'s ``exists()`` and
    ``is_dir()`` raise ``PermissionError`` there rather than answer False.
    """
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
