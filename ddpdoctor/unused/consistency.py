"""Model consistency across ranks: a fingerprint of every parameter and buffer (shape, dtype, a checksum),
gathered and compared, so a rank that built or loaded a different model is named before DDP's own
shape check or a silent divergence."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import TYPE_CHECKING, Any

from ddpdoctor.ranks import rank_phrase

if TYPE_CHECKING:
    pass

from ddpdoctor.unused.isolation import unwrap


@dataclass
class TensorPrint:
    """Identity and a cheap value checksum of one parameter or buffer."""

    name: str
    kind: str  # "param" or "buffer"
    shape: list[int]
    dtype: str
    requires_grad: bool
    # float64 sum and sum of squares: equal weights give equal numbers on the same hardware, and a
    # per-rank seed or a different checkpoint changes both; NaN/inf are kept as strings for JSON.
    sum: float | str
    sum_sq: float | str


def fingerprint(model: Any) -> list[TensorPrint]:
    """Names, shapes, dtypes and checksums of every parameter and buffer (what DDP compares and syncs)."""
    import torch

    model, _ = unwrap(model)
    prints = []
    with torch.no_grad():
        items = [("param", n, t) for n, t in model.named_parameters()]
        items += [("buffer", n, t) for n, t in model.named_buffers()]
        for kind, name, t in items:
            values = (torch.view_as_real(t.detach()) if t.is_complex() else t.detach()).double()
            prints.append(TensorPrint(name=name, kind=kind, shape=list(t.shape),
                                      dtype=str(t.dtype).replace("torch.", ""),
                                      requires_grad=bool(t.requires_grad) if kind == "param" else False,
                                      sum=_json_float(values.sum().item()),
                                      sum_sq=_json_float(values.square().sum().item())))
    return prints


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(a)), abs(float(b)))


@dataclass
class ModelDifference:
    """One way the model differs across ranks, with each value and the ranks that hold it."""

    name: str  # parameter/buffer name, or "<count>" for the number of parameters
    field: str  # present | shape | dtype | requires_grad | values
    values: dict[str, list[int]] = dc_field(default_factory=dict)  # rendered value -> ranks

    def describe(self) -> str:
        parts = "; ".join(f"{value} on {rank_phrase(ranks)}"
                          for value, ranks in self.values.items())
        return f"{self.name}: {self.field} differs: {parts}"


def compare_fingerprints(prints_by_rank: Mapping[int, Sequence[TensorPrint | Mapping[str, Any]]]
                         ) -> list[ModelDifference]:
    """Every difference between ranks' fingerprints, structure first; [] when all ranks agree."""
    tables: dict[int, dict[str, TensorPrint]] = {}
    for rank, prints in prints_by_rank.items():
        tables[rank] = {}
        for p in prints:
            tp = p if isinstance(p, TensorPrint) else TensorPrint(**dict(p))
            tables[rank][f"{tp.kind}:{tp.name}"] = tp
    ranks = sorted(tables)
    diffs: list[ModelDifference] = []
    all_keys = sorted({k for t in tables.values() for k in t})
    for key in all_keys:
        kind, _, name = key.partition(":")
        label = name if kind == "param" else f"{name} (buffer)"
        present = [r for r in ranks if key in tables[r]]
        if len(present) != len(ranks):
            diffs.append(ModelDifference(label, "present", {
                "present": present, "missing": [r for r in ranks if r not in present]}))
            continue
        for attr in ("shape", "dtype", "requires_grad"):
            groups: dict[str, list[int]] = {}
            for r in ranks:
                groups.setdefault(str(getattr(tables[r][key], attr)), []).append(r)
            if len(groups) > 1:
                diffs.append(ModelDifference(label, attr, groups))
        if any(d.name == label for d in diffs):
            continue
        value_groups: list[tuple[TensorPrint, list[int]]] = []
        for r in ranks:
            tp = tables[r][key]
            for ref, members in value_groups:
                if _close(ref.sum, tp.sum) and _close(ref.sum_sq, tp.sum_sq):
                    members.append(r)
                    break
            else:
                value_groups.append((tp, [r]))
        if len(value_groups) > 1:
            diffs.append(ModelDifference(label, "values", {
                f"sum={ref.sum:.6g}" if not isinstance(ref.sum, str) else f"sum={ref.sum}": members
                for ref, members in value_groups}))
    return diffs
