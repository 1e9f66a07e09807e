"""``ckpt strip``: write a copy of the checkpoint with wrapper prefixes removed from its state_dict keys.

Only the names change. For a torch zip the shadow pickle is renamed and written back, and the rest of the
file is copied by the kernel (:mod:`ddpdoctor.ckpt.zip_rewrite`); for safetensors only the JSON header is
rewritten (:mod:`ddpdoctor.ckpt.safetensors_file`); legacy pickles are converted to the zip format with
``torch.save``. The input is never written, and the output appears under its name only when complete
(:func:`ddpdoctor.fileio.atomic_output`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from ddpdoctor import fileio
from ddpdoctor.ckpt import dcp, filecopy, safetensors_file, sharded, unpickler, zip_rewrite
from ddpdoctor.ckpt.formats import open_checkpoint
from ddpdoctor.ckpt.locate import find_state_dicts, mapping_pairs
from ddpdoctor.ckpt.model import FORMAT_LEGACY, Checkpoint, StripReport
from ddpdoctor.ckpt.prefixes import normalize_prefixes, plan_renames, rename_node
from ddpdoctor.errors import DoctorError


def strip_file(path: str | Path, output: str | Path | None, *, prefixes: Iterable[str] | None = None,
               key: str | None = None, in_place: bool = False, trust: bool = False) -> StripReport:
    """Write a copy of the checkpoint with wrapper prefixes removed; atomic, never touches the input.

    The input is opened first, so every bad-input error comes before any output file exists. A DCP
    directory becomes a DCP directory, or one ``torch.save`` file when OUT ends in .pt/.pth/.bin; a shard
    set becomes a shard set with the same sharding.
    """
    ckpt = open_checkpoint(path, trust=trust, for_rewrite=True)
    if ckpt.dcp is not None or ckpt.shards is not None:
        return _strip_directory(ckpt, output, normalize_prefixes(prefixes), key, in_place, trust)
    if output is None:
        if not in_place:
            raise DoctorError("give the output file with -o OUT (or --in-place to replace the input)")
        output = ckpt.path
    out = Path(output)
    filecopy.check_output(ckpt.path, out, in_place)
    plist = normalize_prefixes(prefixes)
    summary, _, all_renames, total = _plan(ckpt, plist, key)
    if total == 0 and out.exists() and os.path.samefile(out, ckpt.path):
        # --in-place with nothing to strip: leave the file (and its mtime) alone.
        return StripReport(str(ckpt.path), str(out), ckpt.format, summary, 0, written=False)
    # An output that will be fsynced is pushed to disk as it is copied, so the fsync waits for little.
    replacing = fileio.replaces_existing(out)
    try:
        with fileio.atomic_output(out, mode_from=ckpt.path) as fh:
            _write_renamed(ckpt, fh, all_renames, replacing)
    except OSError as exc:
        raise filecopy.write_error(out, exc) from None
    return StripReport(str(ckpt.path), str(out), ckpt.format, summary, total,
                       converted_from_legacy=ckpt.format == FORMAT_LEGACY)


def _plan(ckpt: Checkpoint, plist: tuple[str, ...], key: str | None
          ) -> tuple[list[dict[str, Any]], dict[tuple[Any, ...], tuple[Any, ...]], dict[str, str], int]:
    """Rename every state_dict in the tree; (summary, old -> new key path, old -> new key, renamed count)."""
    locs = find_state_dicts(ckpt.root, key)
    if not locs:
        raise DoctorError(f"{ckpt.path}: no state_dict found (no mapping of names to tensors); "
                          "name it with --key")
    summary = []
    path_map: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    all_renames: dict[str, str] = {}  # safetensors and shard sets: one flat location
    total = 0
    for loc in locs:
        renames, counts = plan_renames((k for k, _ in mapping_pairs(loc.node) or []), plist,
                                       where=repr(loc.name))
        rename_node(loc.node, renames, plist, "")
        summary.append({"location": loc.name, "renamed_keys": len(renames),
                        "prefixes": [{"prefix": p, "keys": n} for p, n in counts.items()]})
        all_renames.update(renames)
        path_map.update({(*loc.path, old): (*loc.path, new) for old, new in renames.items()})
        total += len(renames)
    return summary, path_map, all_renames, total


def _write_renamed(ckpt: Checkpoint, fh: BinaryIO, renames: dict[str, str], replacing: bool) -> None:
    """One file with its (already renamed) tree: zip and safetensors rewritten, legacy saved by torch."""
    if ckpt.zip is not None:
        new_pickle = unpickler.dumps_or_refuse(ckpt.root, ckpt.path)
        unpickler.loads(new_pickle, trust=True)  # cheap self-check before anything is renamed
        zip_rewrite.rewrite(ckpt.zip, fh, new_pickle, start_writeback=replacing)
    elif ckpt.safetensors is not None:
        safetensors_file.rewrite(ckpt.safetensors, fh, renames, start_writeback=replacing)
    else:
        import torch

        torch.save(ckpt.root, fh)


_SINGLE_FILE = (".pt", ".pth", ".bin", ".ckpt")


def _strip_directory(ckpt: Checkpoint, output: str | Path | None, plist: tuple[str, ...], key: str | None,
                     in_place: bool, trust: bool) -> StripReport:
    """A DCP directory or a shard set: the output is a new directory (or, from DCP, one torch file)."""
    kind = "a torch.distributed.checkpoint directory" if ckpt.dcp is not None else "a shard set"
    if in_place or output is None:
        raise DoctorError(f"{ckpt.path} is {kind}: give a new output with -o (--in-place is for single files)")
    out = Path(output)
    as_file = ckpt.dcp is not None and out.suffix in _SINGLE_FILE
    if as_file:
        fileio.validate_output_path("-o", out)
    elif out.suffix in _SINGLE_FILE:
        raise DoctorError(f"{ckpt.path} is a shard set: strip writes a new shard set; give a directory with -o")
    if out.exists() and ckpt.path.exists() and os.path.samefile(out, ckpt.path):
        raise DoctorError(f"output {out} is the input; choose another -o path")
    if ckpt.shards is not None:
        sharded.check_complete(ckpt.shards)
        key = None  # one flat state_dict across the shards
    elif ckpt.dcp is not None:
        dcp.check_complete(ckpt.dcp)
    summary, path_map, all_renames, total = _plan(ckpt, plist, key)
    if ckpt.dcp is not None:
        if as_file:
            dcp.write_torch_file(ckpt.dcp, out, path_map, trust=trust)
        else:
            dcp.write_dcp_dir(ckpt.dcp, out, path_map)
    else:
        assert ckpt.shards is not None
        _write_shards(ckpt.shards, out, plist, all_renames)
    return StripReport(str(ckpt.path), str(out), ckpt.format, summary, total)


def _write_shards(shards: sharded.ShardSet, out: Path, plist: tuple[str, ...], renames: dict[str, str]) -> None:
    try:
        with filecopy.atomic_dir(out, mode_from=shards.directory) as tmp:
            for shard in shards.shards:
                mine = {k: renames[k] for k in shard.keys if k in renames}
                rename_node(shard.node, mine, plist, "")
                with (tmp / shard.name).open("xb") as fh:
                    _write_renamed(shard.ckpt, fh, mine, False)
            if shards.index_name is not None:
                (tmp / shards.index_name).write_bytes(sharded.new_index(shards, renames))
            sharded.copy_other_files(shards, tmp)
    except OSError as exc:
        raise filecopy.write_error(out, exc) from None
