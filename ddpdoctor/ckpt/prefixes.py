"""Wrapper prefixes: which ones exist, how keys are renamed, and the ``strip_prefix`` API.

``DistributedDataParallel`` keeps the model as ``self.module`` and ``torch.compile`` as
``OptimizedModule._orig_mod``, so ``wrapper.state_dict()`` prefixes every key with ``module.`` and/or
``_orig_mod.``, in either order. Renaming follows
``torch.nn.modules.utils.consume_prefix_in_state_dict_if_present`` (torch/nn/modules/utils.py), keys and
``_metadata`` module paths alike, but refuses to merge two keys into one, and works on shadow nodes as on
real dicts so ``strip`` never has to load the tensors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ddpdoctor.ckpt.locate import mapping_pairs
from ddpdoctor.ckpt.model import DuplicateKeyError
from ddpdoctor.ckpt.unpickler import Reduced
from ddpdoctor.errors import DoctorError

# DistributedDataParallel.module and torch.compile's OptimizedModule._orig_mod.
KNOWN_PREFIXES = ("module.", "_orig_mod.")
PREFIX_ORIGIN = {"module.": "DistributedDataParallel/DataParallel", "_orig_mod.": "torch.compile"}


def normalize_prefixes(prefixes: Iterable[str] | None) -> tuple[str, ...]:
    if prefixes is None:
        return KNOWN_PREFIXES
    out = []
    for p in prefixes:
        if not p or p == ".":
            raise DoctorError("--prefix must not be empty (e.g. --prefix module.)")
        out.append(p if p.endswith(".") else p + ".")
    return tuple(out)


def strip_one(key: str, prefixes: tuple[str, ...]) -> tuple[str, list[str]]:
    """Remove the prefixes from the start of ``key`` as often as they appear, in any order."""
    removed: list[str] = []
    changed = True
    while changed:
        changed = False
        for p in prefixes:
            if key.startswith(p) and len(key) > len(p):
                key = key[len(p):]
                removed.append(p)
                changed = True
    return key, removed


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

    Same rule as ``consume_prefix_in_state_dict_if_present`` (torch/nn/modules/utils.py).
    """
    changed = True
    while changed and key:
        changed = False
        for p in prefixes:
            if key == p[:-1]:
                key, changed = "", True
            elif key.startswith(p):
                key, changed = key[len(p):], True
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

    ``prefixes`` defaults to ``module.`` (DDP/DataParallel) and ``_orig_mod.`` (torch.compile), removed
    wherever they start a key, in any order and combination. Tensors are not copied. Raises
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


def stripped_name(path: Path) -> str:
    """Where the remedies suggest writing the stripped copy: ``ddp.pt`` -> ``ddp.stripped.pt``."""
    return str(path.with_name(f"{path.stem}.stripped{path.suffix}"))
