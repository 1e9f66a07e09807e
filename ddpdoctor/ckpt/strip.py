"""``ckpt strip``: write a copy of the checkpoint with wrapper prefixes removed from its state_dict keys.

Only the names change. For a torch zip the shadow pickle is renamed and written back, and the rest of the
file is copied by the kernel (:mod:`ddpdoctor.ckpt.zip_rewrite`); for safetensors only the JSON header is
rewritten (:mod:`ddpdoctor.ckpt.safetensors_file`); legacy pickles are converted to the zip format with
``torch.save``. The input is never written, and the output appears under its name only when complete
(:func:`ddpdoctor.outputs.atomic_output`, under the output policy).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ddpdoctor import outputs
from ddpdoctor.ckpt import safetensors_file, unpickler, zip_rewrite
from ddpdoctor.ckpt.files import FileCheckpoint
from ddpdoctor.ckpt.formats import Checkpoint, open_checkpoint
from ddpdoctor.ckpt.locate import find_state_dicts, mapping_pairs
from ddpdoctor.ckpt.model import FORMAT_LEGACY, Phases, StripReport
from ddpdoctor.ckpt.prefixes import normalize_prefixes, plan_renames, rename_node
from ddpdoctor.errors import DoctorError

if TYPE_CHECKING:
    from ddpdoctor.ckpt import sharded


def strip_file(path: str | Path, output: str | Path | None, *, prefixes: Iterable[str] | None = None,
               key: str | None = None, in_place: bool = False, trust: bool = False,
               plan: outputs.Plan | None = None) -> StripReport:
    """Write a copy of the checkpoint with wrapper prefixes removed; atomic, never touches the input.

    The input is opened first, so every bad-input error comes before any output file exists; the output
    is then checked against the output policy (``plan``: the run's other outputs, e.g. ``--json``), before
    anything is written. A DCP directory becomes a DCP directory, or one ``torch.save`` file when OUT ends
    in a name of ``outputs.TORCH_FILE``; a shard set becomes a shard set with the same sharding and every other file.
    """
    phases = Phases()
    plan = plan if plan is not None else outputs.Plan("ckpt strip")
    plan.reads("PATH", path)
    ckpt = open_checkpoint(path, trust=trust, for_rewrite=True)
    phases.lap("open")
    if ckpt.dcp is not None or ckpt.shards is not None:
        return _strip_directory(ckpt, output, normalize_prefixes(prefixes), key, in_place, trust, plan, phases)
    target = _file_target(ckpt, Path(path), output, in_place, plan)
    plist = normalize_prefixes(prefixes)
    summary, _, all_renames, total = _plan(ckpt, plist, key)
    shown = str(output if output is not None else path)
    phases.lap("plan")
    if total == 0 and target.in_place:
        # --in-place with nothing to strip: leave the file (and its mtime) alone.
        return StripReport(str(ckpt.path), shown, ckpt.format, summary, 0, written=False, phases_s=phases.seconds)
    # An output that will be fsynced is pushed to disk as it is copied, so the fsync waits for little.
    replacing = outputs.replaces_existing(target)
    try:
        with outputs.atomic_output(target, phases.seconds) as fh:
            phases.lap("prepare")
            _write_renamed(ckpt, fh, all_renames, replacing, phases)
    except OSError as exc:
        raise outputs.write_error(shown, exc) from None
    return StripReport(str(ckpt.path), shown, ckpt.format, summary, total,
                       converted_from_legacy=ckpt.format == FORMAT_LEGACY, phases_s=phases.seconds)


def _file_target(ckpt: Checkpoint, given: Path, output: str | Path | None, in_place: bool,
                 plan: outputs.Plan) -> outputs.Target:
    """The single-file output, checked: -o names a new file of the input's format, --in-place the input."""
    if output is not None and os.path.exists(output) and os.path.samefile(output, ckpt.path):
        if not in_place:
            raise DoctorError(f"-o {str(output)!r} is the input checkpoint; pass --in-place to replace it, or "
                              "choose another -o path")
        output = None
    if in_place:
        if output is not None:
            raise DoctorError(f"--in-place replaces {given} itself; -o {str(output)!r} names another file: "
                              "give one of the two")
        return plan.in_place("--in-place", given, outputs.TORCH_FILE)
    if output is None:
        raise DoctorError("give the output file with -o OUT (or --in-place to replace the input)")
    kind = outputs.SAFETENSORS if ckpt.safetensors is not None else outputs.TORCH_FILE
    target = plan.file("-o", output, kind, like=ckpt.path)
    assert target is not None
    return target


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


def _write_renamed(ckpt: FileCheckpoint, fh: BinaryIO, renames: dict[str, str], replacing: bool,
                   phases: Phases) -> None:
    """One file with its (already renamed) tree: zip and safetensors rewritten, legacy saved by torch."""
    if ckpt.zip is not None:
        new_pickle = unpickler.dumps_or_refuse(ckpt.root, ckpt.path)
        unpickler.loads(new_pickle, trust=True)  # cheap self-check before anything is renamed
        phases.lap("pickle")
        zip_rewrite.rewrite(ckpt.zip, fh, new_pickle, start_writeback=replacing)
    elif ckpt.safetensors is not None:
        safetensors_file.rewrite(ckpt.safetensors, fh, renames, start_writeback=replacing)
    else:
        import torch

        torch.save(ckpt.root, fh)
    phases.lap("copy")


def _strip_directory(ckpt: Checkpoint, output: str | Path | None, plist: tuple[str, ...], key: str | None,
                     in_place: bool, trust: bool, plan: outputs.Plan, phases: Phases) -> StripReport:
    """A DCP directory or a shard set: the output is a new directory (or, from DCP, one torch file)."""
    from ddpdoctor.ckpt import dcp, sharded  # only folders need them: not imported for one file

    kind = "a torch.distributed.checkpoint directory" if ckpt.dcp is not None else "a shard set"
    if in_place or output is None:
        raise DoctorError(f"{ckpt.path} is {kind}: give a new output with -o (--in-place is for single files)")
    name = str(output)
    as_file = ckpt.dcp is not None and outputs.fits(name, outputs.TORCH_FILE)
    if ckpt.dcp is not None and outputs.fits(name, outputs.SAFETENSORS):
        raise DoctorError(f"-o {name!r}: from {kind} strip writes a new DCP directory, or one torch.save file "
                          f"({'/'.join(outputs.TORCH_FILE.extensions)}); not safetensors")
    if ckpt.shards is not None and outputs.has_file_extension(name):
        raise DoctorError(f"-o {name!r}: {ckpt.path} is a shard set: strip writes a new shard set; give a new "
                          "directory name (no file extension) with -o")
    if as_file:
        assert ckpt.dcp is not None
        target = plan.file("-o", output, outputs.TORCH_FILE, like=ckpt.dcp.path / dcp.METADATA)
    else:
        # The new folder is at most as open as the input folder (a private checkpoint stays private).
        folder = ckpt.dcp.path if ckpt.dcp is not None else ckpt.shards.directory if ckpt.shards else ckpt.path
        target = plan.folder("-o", output, outputs.CHECKPOINT_FOLDER, like=folder)
    assert target is not None
    if ckpt.shards is not None:
        sharded.check_complete(ckpt.shards)
        sharded.carried_entries(ckpt.shards)  # before any work: what cannot be carried is refused
        key = None  # one flat state_dict across the shards
    elif ckpt.dcp is not None:
        dcp.check_complete(ckpt.dcp)
    summary, path_map, all_renames, total = _plan(ckpt, plist, key)
    phases.lap("plan")
    # One phase for the whole write ("copy": the new metadata or pickles, the kernel copies, the rename).
    if ckpt.dcp is not None:
        if as_file:
            dcp.write_torch_file(ckpt.dcp, target, path_map, trust=trust)
        else:
            dcp.write_dcp_dir(ckpt.dcp, target, path_map)
    else:
        assert ckpt.shards is not None
        _write_shards(ckpt.shards, target, plist, all_renames)
    phases.lap("copy")
    return StripReport(str(ckpt.path), name, ckpt.format, summary, total, phases_s=phases.seconds)


def _write_shards(shards: sharded.ShardSet, target: outputs.Target, plist: tuple[str, ...],
                  renames: dict[str, str]) -> None:
    from ddpdoctor.ckpt import sharded

    try:
        with outputs.atomic_folder(target) as tmp:
            for shard in shards.shards:
                mine = {k: renames[k] for k in shard.keys if k in renames}
                rename_node(shard.node, mine, plist, "")
                with outputs.create_in(tmp, shard.name, like=shards.directory / shard.name) as fh:
                    _write_renamed(shard.ckpt, fh, mine, False, Phases())
            if shards.index_name is not None:
                with outputs.create_in(tmp, shards.index_name, like=shards.directory / shards.index_name) as fh:
                    fh.write(sharded.new_index(shards, renames))
            sharded.copy_other_files(shards, tmp)
    except OSError as exc:
        raise outputs.write_error(target.given, exc) from None
