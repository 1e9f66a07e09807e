"""``ddpdoctor.load_checkpoint_into``: load a checkpoint into a model, fixing wrapper prefixes either way.

The Python side of ``ckpt diff``: the same search for the state_dict and the best rename, then a real
``model.load_state_dict``. Unlike the commands it needs the tensors, so it goes through ``torch.load``
(``weights_only=True`` unless trusted, zip files memory-mapped) or ``safetensors.torch.load_file``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor.ckpt import filecopy, safetensors_file
from ddpdoctor.ckpt.diff import diff_against
from ddpdoctor.ckpt.files import check_within_limits, detect_format, torch_load
from ddpdoctor.ckpt.formats import Checkpoint
from ddpdoctor.ckpt.locate import find_state_dicts, mapping_pairs
from ddpdoctor.ckpt.model import FORMAT_SAFETENSORS, FORMAT_ZIP, LoadReport
from ddpdoctor.ckpt.prefixes import plan_renames, rename_node
from ddpdoctor.errors import DoctorError

if TYPE_CHECKING:
    from torch import nn


def load_checkpoint_into(model: nn.Module, path: str | Path, *, key: str | None = None, strict: bool = True,
                         trust: bool = False) -> LoadReport:
    """Load a checkpoint's state_dict into ``model``, fixing ``module.``/``_orig_mod.`` prefixes either way.

    Finds the state_dict (or uses ``key``, e.g. ``"model"``), picks the rename that fits ``model`` best
    (strip wrapper prefixes, or add the model's own wrapper prefix), and calls
    ``model.load_state_dict(..., strict=strict)``. Loads with ``weights_only=True`` unless ``trust``; zip
    checkpoints are memory-mapped. Raises :class:`DoctorError` when the keys or shapes cannot be made to
    fit with ``strict=True``.
    """
    p = filecopy.check_input(path)
    fmt = detect_format(p)
    if fmt == FORMAT_SAFETENSORS:
        safetensors_file.open_safetensors(p)  # validate the header first: a clear error, not a Rust panic
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise DoctorError("loading .safetensors needs the safetensors package: "
                              "pip install 'ddpdoctor[safetensors]' (inspect and strip do not)") from None

        root: Any = load_file(str(p), device="cpu")
    else:
        check_within_limits(p, fmt)  # torch.load has no limits of its own (a memo bomb hangs it in C)
        root = torch_load(p, trust=trust, mmap=fmt == FORMAT_ZIP)
    ckpt = Checkpoint(p, fmt, root, p.stat().st_size)
    rep = diff_against(ckpt, model, key)
    loc = next(loc for loc in find_state_dicts(root, key) if loc.name == rep.location)
    fix = rep.fix
    strip = tuple(fix["strip_prefixes"]) if fix else ()
    add = fix["add_prefix"] if fix else ""
    if strict and not rep.loads_as_is and not (fix and fix["loads_strict_after"]):
        raise DoctorError(f"cannot load {p} into the model with strict=True: {rep.finding.summary}")
    fixed = loc.node  # loaded for this call only: renamed in place, _metadata included, as strip does
    renames, _ = plan_renames((str(k) for k, _ in mapping_pairs(fixed) or []), strip, add=add)
    rename_node(fixed, renames, strip, add)
    result = model.load_state_dict(fixed, strict=strict)
    return LoadReport(str(p), fmt, loc.name, list(strip), add, len(renames),
                      len(fixed) - len(result.unexpected_keys), list(result.missing_keys),
                      list(result.unexpected_keys))
