"""``ddpdoctor ckpt inspect/strip/diff``: find and remove wrapper prefixes, explain key mismatches.

Nothing from a checkpoint is unpickled in a way that can run code: pickles are replayed into a shadow
graph (:mod:`~ddpdoctor.ckpt.unpickler`), torch zip files are rewritten record by record
(:mod:`~ddpdoctor.ckpt.zip_rewrite`), safetensors headers are rewritten in place of the data
(:mod:`~ddpdoctor.ckpt.safetensors_file`), byte ranges are copied by the kernel and outputs written
atomically (:mod:`~ddpdoctor.ckpt.filecopy`).
"""

from __future__ import annotations

from ddpdoctor.ckpt.core import (
    KNOWN_PREFIXES,
    Checkpoint,
    LoadReport,
    StateDictLoc,
    StripReport,
    build_model_for_shapes,
    diff_against,
    find_state_dicts,
    inspect_checkpoint,
    load_checkpoint_into,
    open_checkpoint,
    render_diff,
    render_inspect,
    strip_file,
    strip_prefix,
)

__all__ = ["KNOWN_PREFIXES", "Checkpoint", "LoadReport", "StateDictLoc", "StripReport", "build_model_for_shapes",
           "diff_against", "find_state_dicts", "inspect_checkpoint", "load_checkpoint_into", "open_checkpoint",
           "render_diff", "render_inspect", "strip_file", "strip_prefix"]
