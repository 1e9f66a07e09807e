"""``ckpt inspect``: what is inside a checkpoint, which wrapper prefixes its keys carry, and what to do.

The report (:class:`~ddpdoctor.ckpt.model.InspectReport`) lists the format, tensors and dtypes, every
state_dict with its prefixes, one line per other entry (epoch, optimizer, config), and findings: a prefix
is a warning (the file is fine for a wrapped model), keys mixing wrapped and unwrapped names are a failure
(no rename can fix them). The ``state_dict`` check reports the same findings before training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddpdoctor.ckpt import unpickler
from ddpdoctor.ckpt.formats import Checkpoint, layout_findings
from ddpdoctor.ckpt.locate import find_state_dicts, is_optimizer_state, mapping_pairs, tensor_meta
from ddpdoctor.ckpt.model import (
    CHECK_ID,
    FORMAT_DCP,
    FORMAT_LEGACY,
    FORMAT_SAFETENSORS,
    FORMAT_SHARDED,
    FORMAT_ZIP,
    DuplicateKeyError,
    InspectReport,
    StateDictLoc,
    StoredObject,
    key_text,
)
from ddpdoctor.ckpt.prefixes import (
    KNOWN_PREFIXES,
    PREFIX_ORIGIN,
    plan_renames,
    shell_word,
    strip_one,
    stripped_name,
    wrapper_segments,
)
from ddpdoctor.ckpt.unpickler import Reduced
from ddpdoctor.findings import FAIL, PASS, WARN, Finding
from ddpdoctor.ranks import format_rank_list


def _human(n: int) -> str:
    if n >= 1 << 80:  # only from a damaged or crafted file (sizes are int64): float(n) may overflow
        return f"more than {1 << 80} B"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _summarize(value: Any) -> str:
    """One short line for a non-state_dict entry (epoch, optimizer, config...)."""
    meta = tensor_meta(value)
    if meta is not None:
        return f"tensor {meta.dtype} {list(meta.shape) if meta.shape is not None else '?'}"
    if isinstance(value, StoredObject):
        return f"stored object ({_human(value.size_bytes)} pickle, not read)"
    if value is None or isinstance(value, (bool, int, float)):
        return f"{type(value).__name__}: {value!r}"
    if isinstance(value, str):
        return f"str: {value[:60]!r}"
    pairs = mapping_pairs(value)
    if pairs is not None:
        if is_optimizer_state(pairs):
            entries = {k: v for k, v in pairs if isinstance(k, str)}
            state = mapping_pairs(entries["state"]) or []
            groups = entries["param_groups"]
            n_groups = len(groups) if isinstance(groups, list) else 0
            lr = ""
            if isinstance(groups, list) and groups:
                # A crafted group may have unhashable keys or an integer lr too large for a float.
                first = {k: v for k, v in mapping_pairs(groups[0]) or [] if isinstance(k, str)}
                value = first.get("lr")
                if type(value) is float or (type(value) is int and abs(value) < 1 << 63):
                    lr = f", lr={value:g}"
            return f"optimizer state: {len(state)} parameter states, {n_groups} param group(s){lr}"
        names = ", ".join(key_text(k) for k, _ in pairs[:6]) + (", ..." if len(pairs) > 6 else "")
        return f"mapping with {len(pairs)} keys: {names}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)} items"
    if isinstance(value, Reduced):
        return f"object {value.func_name or '?'}"
    return type(value).__name__


StorageOwners = dict[int, str]  # id of a tensor node -> the shard file it was read from


def _storage_owners(ckpt: Checkpoint) -> StorageOwners:
    """Which shard each tensor of a shard set comes from: a storage's key ("0", "1", ...) is unique within one
    file only, and every .bin shard numbers its storages from 0 (nine tensors in three shards counted as three
    storages, 256 B instead of 576 B: an explorer's find). Empty for a single file."""
    if ckpt.shards is None:
        return {}
    return {id(value): shard.name for shard in ckpt.shards.shards for _, value in mapping_pairs(shard.node) or []}


def _tensor_stats(root: Any, owners: StorageOwners) -> tuple[int, int, dict[str, int]]:
    """(tensor count, bytes of distinct storages, tensors per dtype) over the whole tree."""
    count, storages, dtypes = 0, {}, {}  # type: ignore[var-annotated]

    def visit(node: Any) -> bool:
        nonlocal count
        meta = tensor_meta(node)
        if meta is None:
            return True
        count += 1
        dtypes[meta.dtype or "?"] = dtypes.get(meta.dtype or "?", 0) + 1
        if meta.storage is not None:
            key = (owners.get(id(node), ""), meta.storage)
            storages[key] = max(storages.get(key, 0), meta.storage_bytes)
        return False

    _walk_real_or_shadow(root, visit)
    return count, sum(storages.values()), dict(sorted(dtypes.items()))


def _walk_real_or_shadow(root: Any, visit: Any) -> None:
    def wrapped(node: Any) -> bool:
        if not visit(node):
            return False
        pairs = mapping_pairs(node)
        if pairs is not None and not isinstance(node, (dict, Reduced)):
            for _key, v in pairs:
                _walk_real_or_shadow(v, visit)
            return False
        return True

    unpickler.walk(root, wrapped)


def _state_dict_report(loc: StateDictLoc, owners: StorageOwners) -> dict[str, Any]:
    pairs = mapping_pairs(loc.node) or []
    keys = [k for k, _ in pairs]
    metas = [tensor_meta(v) for _, v in pairs]
    storages: dict[tuple[str, str], int] = {}
    for (_, value), m in zip(pairs, metas, strict=True):
        if m is not None and m.storage is not None:
            key = (owners.get(id(value), ""), m.storage)
            storages[key] = max(storages.get(key, 0), m.storage_bytes)
    counts: dict[str, int] = {}
    examples: dict[str, list[str]] = {}
    # Every wrapper segment, wherever it sits: which, on how many keys, at which positions.
    seg_keys: dict[str, int] = {}
    seg_pos: dict[str, set[int]] = {}
    seg_examples: dict[str, list[str]] = {}
    seg_inner: dict[str, set[int]] = {}
    for key in keys:
        if not isinstance(key, str):
            continue
        _, removed = strip_one(key, KNOWN_PREFIXES, anywhere=False)
        if removed:
            combo = "".join(removed)
            counts[combo] = counts.get(combo, 0) + 1
            examples.setdefault(combo, []).append(key)
        segs = wrapper_segments(key)
        for seg in dict.fromkeys(s for s, _, _ in segs):
            seg_keys[seg] = seg_keys.get(seg, 0) + 1
            if len(seg_examples.setdefault(seg, [])) < 3:
                seg_examples[seg].append(key)
        for seg, pos, leading in segs:
            seg_pos.setdefault(seg, set()).add(pos)
            if not leading:
                seg_inner.setdefault(seg, set()).add(pos)
    return {
        "location": loc.name,
        "path": list(loc.path),
        "keys": len(keys),
        "tensors": sum(1 for m in metas if m is not None),
        "tensor_bytes": sum(storages.values()),
        "prefixes": [{"prefix": p, "keys": n, "examples": examples[p][:3]} for p, n in counts.items()],
        "unprefixed_keys": len(keys) - sum(counts.values()),
        "example_keys": keys[:3],
        "wrappers": [{"segment": seg, "origin": PREFIX_ORIGIN[seg], "keys": n, "positions": sorted(seg_pos[seg]),
                      "inner_positions": sorted(seg_inner.get(seg, ())), "examples": seg_examples[seg]} for seg, n in seg_keys.items()],
    }


def inspect_checkpoint(ckpt: Checkpoint) -> InspectReport:
    """The ``ckpt inspect`` report: format, tensors, state_dicts, prefixes, findings."""
    owners = _storage_owners(ckpt)
    count, nbytes, dtypes = _tensor_stats(ckpt.root, owners)
    if ckpt.safetensors is not None:
        nbytes = ckpt.safetensors.data_size
    locs = find_state_dicts(ckpt.root)
    sds = [_state_dict_report(loc, owners) for loc in locs]
    sd_tops = {loc.path[0] for loc in locs if loc.path}
    others = []
    top = mapping_pairs(ckpt.root)
    if top is not None and () not in [loc.path for loc in locs]:
        others = [{"key": key_text(k), "summary": _summarize(v)} for k, v in top
                  if not (isinstance(k, str) and k in sd_tops)]
    findings: list[Finding] = []

    def finding(status: str, summary: str, remedy: str = "") -> None:
        findings.append(Finding(CHECK_ID, status, summary, remedy=remedy, details={
            "checkpoint": str(ckpt.path), "format": ckpt.format, "tensor_bytes": nbytes}))

    directory = ckpt.dcp is not None or ckpt.shards is not None
    collisions: dict[str, DuplicateKeyError] = {}
    for loc in locs:
        try:
            plan_renames((k for k, _ in mapping_pairs(loc.node) or []), where=repr(loc.name))
        except DuplicateKeyError as exc:
            collisions[loc.name] = exc

    def fix_for(loc: StateDictLoc) -> tuple[str, str]:
        """The strip command for ``loc`` (and its Python twin): ``strip`` without ``--key`` renames every
        state_dict of the file and refuses them all when one cannot be renamed, so then it names this one."""
        key = f" --key {shell_word(loc.name)}" if collisions else ""
        command = f"ddpdoctor ckpt strip {shell_word(ckpt.path)} -o {shell_word(Path(stripped_name(ckpt.path)))}{key}"
        if ckpt.dcp is not None:
            command += f"   (or -o {shell_word(Path(ckpt.path.name + '.pt'))} for one torch.save file)"
        py_key = f", key={loc.name!r}" if collisions else ""
        return command, f"ddpdoctor.load_checkpoint_into(model, {str(ckpt.path)!r}{py_key})"

    for loc, rep in zip(locs, sds, strict=True):
        if loc.name in collisions:
            finding(FAIL, str(collisions[loc.name]).split(";")[0],
                    "the checkpoint mixes wrapped and unwrapped weights: load it in Python, "
                    "keep one copy of each key, and save it again")
            continue
        fix, in_python = fix_for(loc)
        for pre in rep["prefixes"]:
            origin = " and ".join(PREFIX_ORIGIN[p + "."] for p in pre["prefix"].split(".")[:-1]
                                  if p + "." in PREFIX_ORIGIN)
            scope = "all" if pre["keys"] == rep["keys"] else f"{pre['keys']} of"
            finding(WARN,
                    f"{scope} {rep['keys']} keys of {rep['location']} start with {pre['prefix']!r} (saved from a "
                    f"{origin}-wrapped model); load_state_dict on the plain model fails with Missing/Unexpected "
                    "key(s)",
                    fix if directory else f"{fix}   (or in Python: {in_python})")
        inner = [w for w in rep["wrappers"] if w["inner_positions"]]
        if inner:
            # One finding for every wrapper around inner layers: they come together (FSDP + checkpointing).
            parts = ", ".join(f"{w['segment']!r} on {w['keys']} (segment "
                              f"{', '.join(str(p) for p in w['inner_positions'])})" for w in inner)
            origins = " and ".join(dict.fromkeys(w["origin"] for w in inner))
            finding(WARN,
                    f"keys of {rep['location']} carry wrappers inside them: {parts}, e.g. {inner[0]['examples'][0]}; "
                    f"added by {origins} around inner layers; load_state_dict on the plain model fails with "
                    "Missing/Unexpected key(s)",
                    f"{fix}   (removes them at any depth)")
        if not rep["prefixes"] and not rep["wrappers"]:
            finding(PASS, f"{rep['location']}: {rep['keys']} keys, no wrapper prefixes")
    if not locs and isinstance(ckpt.root, Reduced) and top is None:
        finding(WARN, f"the file pickles a whole object ({ckpt.root.func_name or '?'}), not a state_dict",
                "save model.state_dict() instead: whole pickled models break when the code moves or changes")
    elif not locs:
        finding(WARN, "no state_dict found (no mapping of names to tensors within 3 levels)",
                "name it with --key, e.g. --key model/state_dict")
    layout = ckpt.dcp.layout() if ckpt.dcp is not None else ckpt.shards.layout() if ckpt.shards is not None else None
    findings += layout_findings(ckpt, {"checkpoint": str(ckpt.path), "format": ckpt.format, "tensor_bytes": nbytes})
    if ckpt.unsafe_globals:
        finding(WARN, f"needs non-weights-only globals: {', '.join(ckpt.unsafe_globals[:5])}; "
                      "torch.load(weights_only=False) runs code from this file",
                "re-save only tensors and plain containers (e.g. torch.save({'model': model.state_dict()}))")
    return InspectReport(str(ckpt.path), ckpt.format, ckpt.size_bytes, count, nbytes, dtypes, sds, others,
                         ckpt.unsafe_globals, findings, layout)


def render_inspect(rep: InspectReport) -> str:
    """The human-readable ``ckpt inspect`` output."""
    fmt = {FORMAT_ZIP: "torch zip", FORMAT_LEGACY: "legacy torch pickle", FORMAT_SAFETENSORS: "safetensors",
           FORMAT_DCP: "torch.distributed.checkpoint directory", FORMAT_SHARDED: "shard set"}
    dtypes = ", ".join(f"{d} x{n}" for d, n in rep.dtypes.items()) or "none"
    lines = [f"checkpoint  {rep.path}  ({fmt[rep.format]}, {_human(rep.size_bytes)})",
             f"tensors     {rep.tensor_count} ({_human(rep.tensor_bytes)}); dtypes: {dtypes}"]
    lay = rep.layout
    if lay is not None and lay["kind"] == "dcp":
        lines.append(f"layout      {lay['keys']} keys ({lay['tensors']} tensors, {lay['objects']} objects, "
                     f"{lay['sharded_tensors']} sharded over several chunks) in {len(lay['files'])} file(s) "
                     f"from rank(s) {format_rank_list(lay['ranks']) or '?'}; DCP version {lay['version'] or '?'}")
        for f in lay["files"]:
            size = _human(f["size_bytes"]) if f["size_bytes"] is not None else "MISSING"
            lines.append(f"  {f['file']:<16} {size:>10}  {f['entries']} entries")
    elif lay is not None:
        lines.append(f"layout      {len(lay['shards'])} shard(s)"
                     + (f", index {lay['index']}" if lay["index"] else ", no index"))
        for sh in lay["shards"]:
            lines.append(f"  {sh['file']}  {_human(sh['size_bytes'])}  {sh['keys']} keys")
        for name in lay["missing_shards"]:
            lines.append(f"  {name}  MISSING")
    for sd in rep.state_dicts:
        pre = "; ".join(f"{p['prefix']!r} on {p['keys']}/{sd['keys']} keys (e.g. {p['examples'][0]})"
                        for p in sd["prefixes"]) or "no wrapper prefix"
        inner = [w for w in sd.get("wrappers", []) if w["inner_positions"]]
        if inner:
            pre += "; inside keys: " + ", ".join(
                f"{w['segment']!r} on {w['keys']} (segment {', '.join(str(p) for p in w['inner_positions'])})"
                for w in inner)
        lines.append(f"state_dict  {sd['location']}: {sd['keys']} keys, {_human(sd['tensor_bytes'])}; {pre}")
    if rep.other_entries:
        lines.append("other entries:")
        width = max(len(e["key"]) for e in rep.other_entries)
        lines += [f"  {e['key']:<{width}}  {e['summary']}" for e in rep.other_entries]
    lines.append("findings:")
    for f in rep.findings:
        lines.append(f"  {f.status.upper():<5} {f.summary}")
        if f.remedy:
            lines.append(f"        fix: {f.remedy}")
    return "\n".join(lines)
