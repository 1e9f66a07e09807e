"""``ckpt diff``: compare a checkpoint with a model, and find the rename that makes it load.

``load_state_dict(strict=True)`` reports missing and unexpected keys but not why. Here the checkpoint's
keys and shapes (read without the tensors) are compared with what the model expects, then the renames
that fix wrapper mismatches are tried (strip ``module.``/``_orig_mod.`` or a common leading path from the
checkpoint, add the model's own wrapper prefix) and the best one is named. The model is built on the
meta device when its factory allows it, so a large model costs no memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor.ckpt.formats import Checkpoint, layout_findings
from ddpdoctor.ckpt.locate import find_state_dicts, mapping_pairs, state_dict_shapes
from ddpdoctor.ckpt.model import CHECK_ID, DiffReport, DuplicateKeyError, Fix, StateDictLoc
from ddpdoctor.ckpt.prefixes import KNOWN_PREFIXES, plan_renames, shell_word, stripped_name, used_prefixes
from ddpdoctor.errors import DoctorError
from ddpdoctor.findings import FAIL, PASS, Finding

if TYPE_CHECKING:
    from torch import nn

# How many missing/unexpected/mismatched keys a finding's details keep (the report's lists are whole).
_DETAIL_ITEMS = 20


def _common_components(keys: Iterable[str]) -> list[str]:
    """The leading dotted components every key shares (excluding the last component)."""
    common: list[str] | None = None
    for key in keys:
        parts = key.split(".")[:-1]
        if common is None:
            common = parts
        else:
            n = 0
            while n < min(len(common), len(parts)) and common[n] == parts[n]:
                n += 1
            common = common[:n]
        if not common:
            return []
    return common or []


def _apply(keys: list[str], fix: Fix) -> dict[str, str] | None:
    try:
        renames, _ = plan_renames(keys, fix.strip, add=fix.add)
    except DuplicateKeyError:
        return None
    return {k: renames.get(k, k) for k in keys}


def _compare(ckpt_shapes: dict[str, Any], model_shapes: dict[str, Any]) -> dict[str, Any]:
    missing = [k for k in model_shapes if k not in ckpt_shapes]
    unexpected = [k for k in ckpt_shapes if k not in model_shapes]
    mismatched = [{"key": k, "checkpoint_shape": list(ckpt_shapes[k]) if ckpt_shapes[k] is not None else None,
                   "model_shape": list(model_shapes[k])}
                  for k in model_shapes if k in ckpt_shapes and ckpt_shapes[k] is not None
                  and tuple(ckpt_shapes[k]) != tuple(model_shapes[k])]
    return {"missing": missing, "unexpected": unexpected, "shape_mismatches": mismatched,
            "loads_strict": not missing and not unexpected and not mismatched}


def best_fix(ckpt_shapes: dict[str, Any], model_shapes: dict[str, Any]) -> tuple[Fix, dict[str, Any]]:
    """The key rename under which the checkpoint matches the model best, and the comparison after it."""
    keys = list(ckpt_shapes)
    ck_common = _common_components(keys)
    md_common = _common_components(model_shapes)
    candidates = [Fix((), ""), Fix(KNOWN_PREFIXES, "")]
    for i in range(0, min(len(ck_common), 3) + 1):
        for j in range(0, min(len(md_common), 3) + 1):
            strip = (".".join(ck_common[:i]) + ".",) if i else ()
            add = ".".join(md_common[:j]) + "." if j else ""
            candidates.append(Fix(strip, add))
        if md_common:
            candidates.append(Fix(KNOWN_PREFIXES, ".".join(md_common[:1]) + "."))
    best: tuple[tuple[int, int, int], Fix, dict[str, Any]] | None = None
    for fix in candidates:
        mapping = _apply(keys, fix)
        if mapping is None:
            continue
        renamed = {mapping[k]: v for k, v in ckpt_shapes.items()}
        cmp = _compare(renamed, model_shapes)
        matched = len(model_shapes) - len(cmp["missing"]) - len(cmp["shape_mismatches"])
        # The known wrapper prefixes count as one rename: report them by name rather than as one string.
        cost = (1 if fix.strip == KNOWN_PREFIXES else len(fix.strip)) + (1 if fix.add else 0)
        score = (matched, -len(cmp["unexpected"]), -cost)
        if best is None or score > best[0]:
            best = (score, fix, cmp)
    assert best is not None  # the identity candidate never collides
    fix = best[1]
    if fix.strip == KNOWN_PREFIXES:
        # Name only the wrapper prefixes these keys carry, in the order they appear.
        fix = Fix(tuple(used_prefixes(ckpt_shapes)), fix.add)
    return fix, best[2]


def build_model_for_shapes(spec: str) -> nn.Module:
    """The model from ``MODULE:FACTORY``, built on the meta device when the factory allows it.

    Comparing keys and shapes needs no weights; under ``torch.device("meta")`` (a context manager since
    torch 2.0) a 70B-parameter factory costs no memory. A factory that cannot build on meta (it moves
    tensors to a device, uses numpy...) is called again normally.
    """
    from ddpdoctor import modelspec

    return modelspec.build_model(spec, try_meta=True)


def model_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Key -> shape of everything ``model.load_state_dict(strict=True)`` expects."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if hasattr(v, "shape")}


def _shapes_of(ckpt: Checkpoint, loc: StateDictLoc) -> tuple[dict[str, Any], list[str]]:
    """Key -> shape of ``loc``'s keys, the ones the folder names in a missing file included, and those keys.

    A shard the index names but that is missing still holds its keys (shapes unknown): without them the
    keys it held read as "missing: a different architecture" next to the missing shard, two failures with
    two remedies for one cause. A DCP ``.metadata`` names every key whatever files are missing.
    """
    shapes = state_dict_shapes(loc.node)
    depth = len(loc.path)
    unavailable = [str(p[depth]) for p in ckpt.unavailable() if len(p) == depth + 1 and tuple(p[:depth]) == loc.path]
    for k in unavailable:
        shapes.setdefault(k, None)
    return shapes, unavailable


def _without(cmp: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """A comparison with ``keys`` no longer counted as missing."""
    gone = set(keys)
    out = {**cmp, "missing": [k for k in cmp["missing"] if k not in gone]}
    out["loads_strict"] = not out["missing"] and not out["unexpected"] and not out["shape_mismatches"]
    return out


def diff_against(ckpt: Checkpoint, model: nn.Module, key: str | None = None,
                 model_spec: str = "") -> DiffReport:
    """The ``ckpt diff`` report: raw mismatch, the prefix change that makes ``strict=True`` work, and the
    folder's own failures (a missing rank file or shard fails the load however well the keys fit)."""
    mshapes = model_shapes(model)
    locs = find_state_dicts(ckpt.root, key)
    if not locs:
        raise DoctorError(f"{ckpt.path}: no state_dict found (no mapping of names to tensors); name it with --key")
    scored = []
    for loc in locs:
        shapes, unavailable = _shapes_of(ckpt, loc)
        fix, after = best_fix(shapes, mshapes)
        matched = len(mshapes) - len(after["missing"]) - len(after["shape_mismatches"])
        # Most model keys matched, then fewest left over: a state_dict that holds every key twice (wrapped
        # and not) matches as many as a clean copy beside it, and must not be the one compared.
        scored.append(((matched, -len(after["unexpected"])), loc, shapes, unavailable, fix, after))
    scored.sort(key=lambda s: s[0], reverse=True)
    _, loc, shapes, unavailable, fix, after = scored[0]
    raw = _compare(shapes, mshapes)
    presumed: list[str] = []
    if ckpt.shards is not None and ckpt.shards.missing and ckpt.shards.index is None \
            and after["missing"] and not after["unexpected"] and not after["shape_mismatches"]:
        # No index says what the missing shard held; model keys absent from every shard present, and nothing
        # else wrong, are the shard's (a wrong architecture leaves keys over, or shapes off).
        presumed = after["missing"]
        raw, after = _without(raw, presumed), _without(after, presumed)
    layout = [f for f in layout_findings(ckpt, {"checkpoint": str(ckpt.path), "model": model_spec},
                                         absent_model_keys=presumed) if f.status == FAIL]
    by_name = sum(1 for k in unavailable if shapes[k] is None)
    note = (f"the {by_name} key(s) of the missing shard(s) by name only, from the index" if by_name else
            f"the model's {len(presumed)} other key(s) presumed in the missing shard(s)" if presumed else "")
    found: dict[str, Any] | None = None
    if raw["loads_strict"]:
        status, remedy = PASS, ""
        counted = f"{len(shapes)} keys" + (f"; {note}" if note else "")
        summary = (f"{loc.name} loads into the model with strict=True ({counted})" if not layout else
                   f"{loc.name}: keys and shapes fit the model ({counted}); it loads with strict=True once the "
                   "missing file(s) are back")
    elif (fix.strip or fix.add) and after["loads_strict"]:
        found = {"strip_prefixes": list(fix.strip), "add_prefix": fix.add, "description": fix.describe(),
                 "loads_strict_after": True}
        status = FAIL
        summary = (f"{loc.name} does not load as is ({len(raw['missing'])} missing, {len(raw['unexpected'])} "
                   f"unexpected keys); it loads with strict=True after: {fix.describe()}"
                   + (f" ({note})" if note else ""))
        remedy = _fix_remedy(ckpt.path, fix, found["strip_prefixes"],
                             directory=ckpt.dcp is not None or ckpt.shards is not None,
                             key=loc.name if _others_collide(ckpt.root, fix.strip) else None)
        if layout:  # strip refuses an incomplete folder (it would write one that cannot load)
            remedy = f"once the missing file(s) are back: {remedy}"
    else:
        if fix.strip or fix.add:
            found = {"strip_prefixes": list(fix.strip), "add_prefix": fix.add,
                     "description": fix.describe(), "loads_strict_after": False,
                     "remaining_missing": after["missing"], "remaining_unexpected": after["unexpected"],
                     "remaining_shape_mismatches": after["shape_mismatches"]}
        left = after if found else raw
        status = FAIL
        summary = (f"{loc.name} does not match the model: {len(left['missing'])} missing, "
                   f"{len(left['unexpected'])} unexpected, {len(left['shape_mismatches'])} shape mismatches"
                   + (f" (even after: {fix.describe()})" if found else "") + (f" ({note})" if note else ""))
        remedy = ("the checkpoint is for a different architecture or config; check the model factory's "
                  "arguments (sizes, num_classes) match the run that saved it")
    # The finding carries what `ddpdoctor check` shows for it; the lists are cut to keep that report short.
    finding = Finding(CHECK_ID, status, summary, remedy=remedy, details={
        "checkpoint": str(ckpt.path), "model": model_spec, "location": loc.name,
        "checkpoint_keys": len(shapes), "model_keys": len(mshapes), "fix": found,
        "missing": raw["missing"][:_DETAIL_ITEMS], "unexpected": raw["unexpected"][:_DETAIL_ITEMS],
        "shape_mismatches": raw["shape_mismatches"][:_DETAIL_ITEMS]})
    return DiffReport(str(ckpt.path), ckpt.format, model_spec, loc.name, len(shapes), len(mshapes),
                      raw["loads_strict"] and not layout, raw["missing"], raw["unexpected"],
                      raw["shape_mismatches"], found, finding, unavailable_keys=unavailable,
                      layout_findings=layout)


def _others_collide(root: Any, prefixes: tuple[str, ...]) -> bool:
    """Whether ``strip --prefix ...`` without ``--key`` would refuse the file: it renames every state_dict in
    it, and one that mixes wrapped and unwrapped keys (``{"net": {"module.w", "w"}, "ema": ...}``) fails
    them all; the remedy then names the state_dict compared."""
    for other in find_state_dicts(root):
        try:
            plan_renames((k for k, _ in mapping_pairs(other.node) or []), prefixes)
        except DuplicateKeyError:
            return True
    return False


def _fix_remedy(path: Path, fix: Fix, strip: list[str], *, directory: bool = False, key: str | None = None) -> str:
    flags = " ".join(f"--prefix {shell_word(p)}" for p in strip)
    if key is not None:
        flags += f" --key {shell_word(key)}"
    command = f"ddpdoctor ckpt strip {shell_word(path)} -o {shell_word(Path(stripped_name(path)))} {flags}"
    if strip and not fix.add and directory:
        # load_checkpoint_into reads single files: a directory is fixed by writing a stripped copy.
        return command
    if strip and not fix.add:
        return (f"{command}   (or in Python: "
                f"ddpdoctor.load_checkpoint_into(model, {str(path)!r}))")
    if fix.add and not strip:
        return (f"the model is wrapped ({fix.add!r} prefix) but the checkpoint is not: load into the inner "
                f"model (model.module.load_state_dict(...)) or use ddpdoctor.load_checkpoint_into(model, "
                f"{str(path)!r})")
    return f"ddpdoctor.load_checkpoint_into(model, {str(path)!r}) applies: {fix.describe()}"


def render_diff(rep: DiffReport) -> str:
    """The human-readable ``ckpt diff`` output."""
    gone = f" ({len(rep.unavailable_keys)} of them in missing files)" if rep.unavailable_keys else ""
    lines = [f"checkpoint  {rep.path}  state_dict {rep.location}: {rep.checkpoint_keys} keys{gone}",
             f"model       {rep.model}: {rep.model_keys} keys"]

    def some(items: list[Any]) -> str:
        shown = ", ".join(str(i) for i in items[:5])
        return shown + (f", ... ({len(items)} in all)" if len(items) > 5 else "")

    if rep.missing:
        lines.append(f"missing     {some(rep.missing)}")
    if rep.unexpected:
        lines.append(f"unexpected  {some(rep.unexpected)}")
    for m in rep.shape_mismatches[:10]:
        lines.append(f"shape       {m['key']}: checkpoint {m['checkpoint_shape']} vs model {m['model_shape']}")
    if rep.fix and not rep.fix["loads_strict_after"]:
        for m in rep.fix["remaining_shape_mismatches"][:10]:
            lines.append(f"shape       {m['key']}: checkpoint {m['checkpoint_shape']} vs model {m['model_shape']} "
                         f"(after: {rep.fix['description']})")
        lines.append(f"best rename {rep.fix['description']} still leaves "
                     f"{len(rep.fix['remaining_missing'])} missing, "
                     f"{len(rep.fix['remaining_unexpected'])} unexpected, "
                     f"{len(rep.fix['remaining_shape_mismatches'])} shape mismatches")
    for f in rep.findings:
        lines.append(f"{f.status.upper():<5} {f.summary}")
        if f.remedy:
            lines.append(f"      fix: {f.remedy}")
    return "\n".join(lines)
