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

from ddpdoctor import fileio
from ddpdoctor.ckpt import filecopy, safetensors_file, unpickler, zip_rewrite
from ddpdoctor.ckpt.formats import open_checkpoint
from ddpdoctor.ckpt.locate import find_state_dicts, mapping_pairs
from ddpdoctor.ckpt.model import FORMAT_LEGACY, StripReport
from ddpdoctor.ckpt.prefixes import normalize_prefixes, plan_renames, rename_node
from ddpdoctor.errors import DoctorError


def strip_file(path: str | Path, output: str | Path | None, *, prefixes: Iterable[str] | None = None,
               key: str | None = None, in_place: bool = False, trust: bool = False) -> StripReport:
    """Write a copy of the checkpoint with wrapper prefixes removed; atomic, never touches the input.

    The input is opened first, so every bad-input error comes before any output file exists.
    """
    ckpt = open_checkpoint(path, trust=trust, for_rewrite=True)
    if output is None:
        if not in_place:
            raise DoctorError("give the output file with -o OUT (or --in-place to replace the input)")
        output = ckpt.path
    out = Path(output)
    filecopy.check_output(ckpt.path, out, in_place)
    plist = normalize_prefixes(prefixes)
    locs = find_state_dicts(ckpt.root, key)
    if not locs:
        raise DoctorError(f"{ckpt.path}: no state_dict found (no mapping of names to tensors); "
                          "name it with --key")
    summary = []
    all_renames: dict[str, str] = {}  # safetensors: one flat location, renamed in its header
    total = 0
    for loc in locs:
        renames, counts = plan_renames((k for k, _ in mapping_pairs(loc.node) or []), plist,
                                       where=repr(loc.name))
        rename_node(loc.node, renames, plist, "")
        summary.append({"location": loc.name, "renamed_keys": len(renames),
                        "prefixes": [{"prefix": p, "keys": n} for p, n in counts.items()]})
        all_renames.update(renames)
        total += len(renames)
    if total == 0 and out.exists() and os.path.samefile(out, ckpt.path):
        # --in-place with nothing to strip: leave the file (and its mtime) alone.
        return StripReport(str(ckpt.path), str(out), ckpt.format, summary, 0, written=False)
    # An output that will be fsynced is pushed to disk as it is copied, so the fsync waits for little.
    replacing = fileio.replaces_existing(out)
    try:
        with fileio.atomic_output(out, mode_from=ckpt.path) as fh:
            if ckpt.zip is not None:
                try:
                    new_pickle = unpickler.dumps(ckpt.root)
                except RecursionError:
                    raise DoctorError(f"{ckpt.path}: its pickle nests objects too deeply to rewrite") from None
                unpickler.loads(new_pickle, trust=True)  # cheap self-check before anything is renamed
                zip_rewrite.rewrite(ckpt.zip, fh, new_pickle, start_writeback=replacing)
            elif ckpt.safetensors is not None:
                safetensors_file.rewrite(ckpt.safetensors, fh, all_renames, start_writeback=replacing)
            else:
                import torch

                torch.save(ckpt.root, fh)
    except OSError as exc:
        raise filecopy.write_error(out, exc) from None
    return StripReport(str(ckpt.path), str(out), ckpt.format, summary, total,
                       converted_from_legacy=ckpt.format == FORMAT_LEGACY)
