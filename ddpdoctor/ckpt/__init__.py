"""``ddpdoctor ckpt inspect/strip/diff``: find and remove wrapper prefixes, explain key mismatches.

A state_dict saved from ``DistributedDataParallel`` or ``torch.compile`` carries ``module.`` /
``_orig_mod.`` in every key, and FSDP or activation checkpointing put their wrapper attributes inside
keys; such a checkpoint fails to load into the plain model. This family finds the state_dicts in a
checkpoint file, a ``torch.distributed.checkpoint`` directory (:mod:`~ddpdoctor.ckpt.dcp`) or a Hugging
Face style shard set (:mod:`~ddpdoctor.ckpt.sharded`) and their prefixes (:mod:`~ddpdoctor.ckpt.inspect`), removes them without loading the
tensors (:mod:`~ddpdoctor.ckpt.strip`), and names the rename that makes a checkpoint fit a model
(:mod:`~ddpdoctor.ckpt.diff`, :mod:`~ddpdoctor.ckpt.load`). Nothing from a checkpoint is unpickled in a
way that can run code: see :mod:`~ddpdoctor.ckpt.files` and :mod:`~ddpdoctor.ckpt.unpickler`. Modules are
layered, bottom up: ``model`` (data); ``unpickler``, ``filecopy``, ``zip_rewrite``, ``safetensors_file``,
``locate``, ``prefixes``; ``files`` (one file); ``dcp``, ``sharded`` (folders); ``formats`` (any
checkpoint); the commands ``inspect``, ``strip``, ``diff``, ``load``. Nothing imports upwards.
Findings are :class:`ddpdoctor.findings.Finding` (check id ``state_dict``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddpdoctor.ckpt.diff import build_model_for_shapes, diff_against, render_diff
    from ddpdoctor.ckpt.formats import Checkpoint, open_checkpoint
    from ddpdoctor.ckpt.inspect import inspect_checkpoint, render_inspect
    from ddpdoctor.ckpt.load import load_checkpoint_into
    from ddpdoctor.ckpt.locate import find_state_dicts
    from ddpdoctor.ckpt.model import (
        DiffReport,
        DuplicateKeyError,
        InspectReport,
        LoadReport,
        StateDictLoc,
        StripReport,
        UnsafeCheckpointError,
    )
    from ddpdoctor.ckpt.prefixes import KNOWN_PREFIXES, shell_word, strip_prefix
    from ddpdoctor.ckpt.strip import strip_file

# The API is imported on first use (PEP 562): ``ckpt strip`` of one file then loads neither ``diff``,
# ``inspect`` nor the folder formats, which is start-up time every strip pays (issue 36: at 1 GiB the
# command is the kernel copy plus start-up).
_HOME = {
    "build_model_for_shapes": "diff", "diff_against": "diff", "render_diff": "diff",
    "Checkpoint": "formats", "open_checkpoint": "formats",
    "inspect_checkpoint": "inspect", "render_inspect": "inspect",
    "load_checkpoint_into": "load",
    "find_state_dicts": "locate",
    "DiffReport": "model", "DuplicateKeyError": "model", "InspectReport": "model", "LoadReport": "model",
    "StateDictLoc": "model", "StripReport": "model", "UnsafeCheckpointError": "model",
    "KNOWN_PREFIXES": "prefixes", "shell_word": "prefixes", "strip_prefix": "prefixes",
    "strip_file": "strip",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = ["KNOWN_PREFIXES", "Checkpoint", "DiffReport", "DuplicateKeyError", "InspectReport", "LoadReport",
           "StateDictLoc", "StripReport", "UnsafeCheckpointError", "build_model_for_shapes", "diff_against",
           "find_state_dicts", "inspect_checkpoint", "load_checkpoint_into", "open_checkpoint", "render_diff",
           "render_inspect", "shell_word", "strip_file", "strip_prefix"]
