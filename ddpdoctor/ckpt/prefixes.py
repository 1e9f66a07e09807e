"""Wrapper prefixes: which ones exist, how keys are renamed, and the ``strip_prefix`` API.

``DistributedDataParallel`` keeps the model as ``self.module`` and ``torch.compile`` as
``OptimizedModule._orig_mod``, so ``wrapper.state_dict()`` prefixes every key with ``module.`` and/or
``_orig_mod.``, in either order. Wrappers applied to inner layers put their attribute in the middle of a
key: FSDP (``FullyShardedDataParallel._fsdp_wrapped_module``, torch/distributed/fsdp/_common_utils.py
``FSDP_WRAPPED_MODULE``; ``_fpw_module`` of the FlattenParamsWrapper in fairscale and torch <= 1.12),
activation checkpointing (``CheckpointWrapper._checkpoint_wrapped_module``,
torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py) and ``torch.compile`` of a submodule
(``layers.3._orig_mod.attn.weight``). Those four underscore names are removed wherever they appear as a
whole segment; ``module.`` only where it starts the key by default, because ``module`` is also a common
attribute name (EMA wrappers, ``self.module = ...``) that a model may really have; named explicitly
(``--prefix module.``, a DataParallel around an inner layer) it goes at any depth too. Renaming follows
``torch.nn.modules.utils.consume_prefix_in_state_dict_if_present`` (torch/nn/modules/utils.py), keys and
``_metadata`` module paths alike, but refuses to merge two keys into one, and works on shadow nodes as on
real dicts so ``strip`` never has to load the tensors.
"""

from __future__ import annotations

import shlex
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ddpdoctor.ckpt.locate import mapping_pairs
from ddpdoctor.ckpt.model import DuplicateKeyError
from ddpdoctor.ckpt.unpickler import Reduced
from ddpdoctor.errors import DoctorError

# DistributedDataParallel.module, torch.compile's OptimizedModule._orig_mod, FSDP's _fsdp_wrapped_module (and
# the legacy FlattenParamsWrapper's _fpw_module), activation checkpointing's _checkpoint_wrapped_module.
KNOWN_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_fpw_module.", "_checkpoint_wrapped_module.")
# The wrapper attributes no model names itself: removed at any depth of a key, not only at its start.
ANYWHERE = frozenset({"_orig_mod.", "_fsdp_wrapped_module.", "_fpw_module.", "_checkpoint_wrapped_module."})
PREFIX_ORIGIN = {"module.": "DistributedDataParallel/DataParallel", "_orig_mod.": "torch.compile",
                 "_fsdp_wrapped_module.": "FullyShardedDataParallel",
                 "_fpw_module.": "FSDP FlattenParamsWrapper (fairscale, torch <= 1.12)",
                 "_checkpoint_wrapped_module.": "activation checkpointing (checkpoint_wrapper)"}


def normalize_prefixes(prefixes: Iterable[str] | None) -> tuple[str, ...]:
    if prefixes is None:
        return KNOWN_PREFIXES
    out = []
    for p in prefixes:
        if not p or p == ".":
            raise DoctorError("--prefix must not be empty (e.g. --prefix module.)")
        out.append(p if p.endswith(".") else p + ".")
    return tuple(out)


def strip_one(key: str, prefixes: tuple[str, ...], *, keep_last: bool = True,
              anywhere: bool = True) -> tuple[str, list[str]]:
    """Remove the prefixes from the start of ``key`` as often as they appear, in any order, then the
    :data:`ANYWHERE` wrapper segments among ``prefixes`` at any depth (every named prefix when ``prefixes``
    is not the default :data:`KNOWN_PREFIXES`).

    ``keep_last``: the last segment is the parameter's own name and is never removed (a key is never
    emptied); module paths (``_metadata`` keys) have no such segment.
    """
    removed: list[str] = []
    changed = True
    while changed:
        changed = False
        for p in prefixes:
            if key.startswith(p) and len(key) > len(p):
                key = key[len(p):]
                removed.append(p)
                changed = True
    # By default only the wrappers no model uses as a real attribute go at any depth; a prefix the user
    # names (``--prefix module.``) is removed at any depth: they said that segment is a wrapper.
    named = prefixes != KNOWN_PREFIXES
    inner = [p for p in prefixes if p in ANYWHERE or named] if anywhere else []
    if inner and any(f".{p}" in f".{key}." for p in inner):
        parts = key.split(".")
        kept = []
        for i, part in enumerate(parts):
            seg = part + "."
            if seg in inner and not (keep_last and i == len(parts) - 1):
                removed.append(seg)
            else:
                kept.append(part)
        key = ".".join(kept)
    return key, removed


def wrapper_segments(key: str) -> list[tuple[str, int, bool]]:
    """Every known wrapper segment in ``key``: (segment, position (0 = first), in the leading run or not).

    ``module.`` counts only in the run of wrapper segments that starts the key (where DDP puts it).
    """
    parts = key.split(".")[:-1]
    found = []
    leading = True
    for i, part in enumerate(parts):
        seg = part + "."
        if leading and seg in KNOWN_PREFIXES:
            found.append((seg, i, True))
            continue
        leading = False
        if seg in ANYWHERE:
            found.append((seg, i, False))
    return found


def plan_renames(keys: Iterable[str], prefixes: Iterable[str] | None = None, *, where: str = "the state_dict",
                 add: str = "") -> tuple[dict[str, str], dict[str, int]]:
    """old -> new name for every key that changes, and how many keys carried each prefix.

    Raises :class:`DuplicateKeyError` if two keys would end up with the same name.
    """
    plist = normalize_prefixes(prefixes)
    renames: dict[str, str] = {}
    counts: dict[str, int] = {}
    owner: dict[str, str] = {}
    for key in keys:
        new, removed = strip_one(key, plist)
        new = add + new
        for p in dict.fromkeys(removed):  # in the order found, so output does not depend on the hash seed
            counts[p] = counts.get(p, 0) + 1
        if new in owner:
            raise DuplicateKeyError(
                f"renaming would create duplicate key {new!r} in {where}: both {owner[new]!r} and {key!r} map to "
                "it (the checkpoint mixes wrapped and unwrapped weights); keep one copy of each key in Python "
                "and save again")
        owner[new] = key
        if new != key:
            renames[key] = new
    return renames, counts


def _rename_metadata_key(key: str, prefixes: tuple[str, ...], add: str) -> str:
    """Module paths in ``_metadata`` have no trailing dot: ``module`` -> '', ``module.fc`` -> ``fc``.

    Same rule as ``consume_prefix_in_state_dict_if_present`` (torch/nn/modules/utils.py); inner wrapper
    segments go as in the keys (``layers.0._fsdp_wrapped_module`` -> ``layers.0``).
    """
    changed = True
    while changed and key:
        changed = False
        for p in prefixes:
            if key == p[:-1]:
                key, changed = "", True
            elif key.startswith(p):
                key, changed = key[len(p):], True
    if key:
        key = strip_one(key, prefixes, keep_last=False)[0]
    if add:
        key = add[:-1] if not key else add + key
    return key


def _renamed_pairs(pairs: list[tuple[Any, Any]], rename: Any) -> list[tuple[Any, Any]]:
    """Pairs with keys renamed; on a collision the later entry wins, at the earlier one's position."""
    out: dict[Any, Any] = {}
    try:
        for k, v in pairs:
            out[rename(k) if isinstance(k, str) else k] = v
    except TypeError:  # an unhashable key in a shadow OrderedDict: not module paths, leave it alone
        return pairs
    return list(out.items())


def _set_pairs(node: Any, pairs: list[tuple[Any, Any]]) -> None:
    if isinstance(node, dict):
        node.clear()
        node.update(pairs)
    elif isinstance(node, Reduced):
        node.dictitems = pairs


def rename_node(node: Any, renames: dict[str, str], prefixes: tuple[str, ...], add: str) -> None:
    """Rename a state_dict node in place (shadow or real), ``_metadata`` included."""
    pairs = mapping_pairs(node) or []
    _set_pairs(node, [(renames.get(k, k), v) for k, v in pairs])

    def fix_meta(meta: Any) -> None:
        meta_pairs = mapping_pairs(meta)
        if meta_pairs is not None:
            _set_pairs(meta, _renamed_pairs(meta_pairs, lambda k: _rename_metadata_key(k, prefixes, add)))

    if isinstance(node, Reduced):
        for state in node.states:
            for k, v in mapping_pairs(state) or []:
                if k == "_metadata":
                    fix_meta(v)
    elif hasattr(node, "_metadata"):
        fix_meta(node._metadata)


def strip_prefix(state_dict: Mapping[str, Any], prefixes: Iterable[str] | None = None) -> OrderedDict[str, Any]:
    """A copy of ``state_dict`` with wrapper prefixes removed from the keys (and from ``_metadata``).

    ``prefixes`` defaults to every wrapper in :data:`KNOWN_PREFIXES`, removed wherever they start a key, in
    any order and combination; the FSDP, activation-checkpointing and ``torch.compile`` segments also in
    the middle of a key. Tensors are not copied. Raises
    :class:`DuplicateKeyError` (a ``ValueError``) if two keys would collide.
    """
    plist = normalize_prefixes(prefixes)
    renames, _ = plan_renames(state_dict.keys(), plist)
    out: OrderedDict[str, Any] = OrderedDict((renames.get(k, k), v) for k, v in state_dict.items())
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        new_meta = OrderedDict(_renamed_pairs(list(meta.items()), lambda k: _rename_metadata_key(k, plist, "")))
        out._metadata = new_meta  # type: ignore[attr-defined]
    return out


def used_prefixes(keys: Iterable[str]) -> list[str]:
    """The known wrapper prefixes these keys carry, in the order they first appear."""
    used: list[str] = []
    for k in keys:
        for p in strip_one(k, KNOWN_PREFIXES)[1]:
            if p not in used:
                used.append(p)
    return used


def shell_word(value: str | Path) -> str:
    """A path or prefix as a remedy's command line must spell it to run when pasted: quoted for the shell
    (spaces, quotes, `$`), and a relative path that starts with "-" behind "./" so the command does not take it
    for an option (`ckpt inspect "my ckpt.pt"` suggested `ddpdoctor ckpt strip my ckpt.pt -o ...`)."""
    text = str(value)
    return shlex.quote("./" + text if text.startswith("-") and isinstance(value, Path) else text)


def stripped_name(path: Path) -> str:
    """Where the remedies suggest writing the stripped copy: ``ddp.pt`` -> ``ddp.stripped.pt``."""
    return str(path.with_name(f"{path.stem}.stripped{path.suffix}"))
