"""Which parameters get no gradient, which model outputs feed no loss, and is the model the same on every rank.

DDP's reducer waits, every iteration, for a gradient of every parameter that requires one; a parameter
that gets none makes the *next* iteration fail with "Expected to have finished reduction in the prior
iteration before starting a new one" (or hang when ranks disagree). ``find_unused_parameters=True`` fixes
that by walking the autograd graph every step, which costs time on every step, so users should only pay
for it when the model needs it. This module finds out by running the model: forward and backward on a deep
copy, counting with ``register_post_accumulate_grad_hook`` how often each parameter's gradient is
accumulated per backward (the same event DDP's reducer hooks), so the caller's model, its gradients, its
buffers, its train/eval mode and the RNG state are left exactly as they were.

Behaviour of DDP that the recommendations rely on (checked with torch 2.13 on gloo; see the unused section of README.md):
a parameter never used by ``forward`` works with ``static_graph=True`` or ``find_unused_parameters=True``;
a parameter used on some steps (or some ranks) needs ``find_unused_parameters=True``; a parameter that only
feeds an output left out of the loss needs ``find_unused_parameters=True`` (``static_graph=True`` fails,
because DDP expects every parameter reachable from the outputs); a parameter accumulated twice in one
backward (reentrant checkpointing) raises "Expected to mark a variable ready only once" unless
``static_graph=True`` (https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html).
"""

from __future__ import annotations

import copy
import inspect
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from dataclasses import field as dc_field
from typing import TYPE_CHECKING, Any

from ddpdoctor.errors import DoctorError
from ddpdoctor.modelspec import user_error
from ddpdoctor.ranks import rank_phrase

if TYPE_CHECKING:
    import torch

ALWAYS = "always"
NEVER = "never"
SOMETIMES = "sometimes"

DEFAULT_STEPS_CALLABLE = 4

LossFn = Callable[[Any, Any], Any]


@dataclass
class ParamUse:
    """How one trainable parameter was used over the analysed steps."""

    name: str
    module: str  # dotted name of the module that owns it ("" is the model itself)
    module_type: str
    shape: list[int]
    numel: int
    used_steps: int
    steps: int
    # Most gradient accumulations seen in one backward: >1 breaks DDP's "mark variable ready only once".
    max_accumulations: int

    @property
    def usage(self) -> str:
        if self.used_steps == 0:
            return NEVER
        return ALWAYS if self.used_steps == self.steps else SOMETIMES


@dataclass
class DeadOutput:
    """A model output whose autograd graph does not reach the loss."""

    path: str  # where it is in the return value: output[1], output['aux']
    shape: list[int]
    dtype: str
    # Trainable parameters that feed this output and not the loss.
    params: list[str]


@dataclass
class Recommendation:
    """The DDP constructor flags this model needs, and why."""

    find_unused_parameters: bool
    static_graph: bool
    reasons: list[str]
    # True when the caller said find_unused_parameters=True is set but the model does not need it.
    find_unused_costs_for_nothing: bool = False


@dataclass
class UnusedReport:
    """The result of :func:`find_unused_parameters`; ``render()`` for people, ``to_json()`` for tools."""

    steps: int
    loss: str  # how the loss was computed
    params: list[ParamUse]
    dead_outputs: list[DeadOutput]
    recommendation: Recommendation
    frozen_params: int = 0  # parameters with requires_grad=False, not analysed
    ddp_find_unused_parameters: bool | None = None

    def names(self, usage: str) -> list[str]:
        """Dotted names of the parameters with this usage (``always``/``never``/``sometimes``)."""
        return [p.name for p in self.params if p.usage == usage]

    @property
    def always_used(self) -> list[str]:
        return self.names(ALWAYS)

    @property
    def never_used(self) -> list[str]:
        return self.names(NEVER)

    @property
    def sometimes_used(self) -> list[str]:
        return self.names(SOMETIMES)

    @property
    def accumulated_twice(self) -> list[str]:
        """Parameters whose gradient was accumulated more than once in one backward."""
        return [p.name for p in self.params if p.max_accumulations > 1]

    @property
    def harmful_dead_outputs(self) -> list[DeadOutput]:
        """Dead outputs that alone feed some parameters (those never get a gradient)."""
        return [d for d in self.dead_outputs if d.params]

    @property
    def has_problem(self) -> bool:
        """Something that breaks DDP with default flags: a dead output that only wastes compute is not."""
        return bool(self.never_used or self.sometimes_used or self.harmful_dead_outputs
                    or self.accumulated_twice)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "loss": self.loss,
            "has_problem": self.has_problem,
            "always_used": self.always_used,
            "never_used": self.never_used,
            "sometimes_used": self.sometimes_used,
            "accumulated_twice": self.accumulated_twice,
            "frozen_params": self.frozen_params,
            "params": [dict(asdict(p), usage=p.usage) for p in self.params],
            "dead_outputs": [asdict(d) for d in self.dead_outputs],
            "recommendation": asdict(self.recommendation),
            "ddp_find_unused_parameters": self.ddp_find_unused_parameters,
        }

    def render(self) -> str:
        """A few lines a person reads: what is wrong, which parameters, which flags."""
        lines = [f"analysed {len(self.params)} trainable parameters over {self.steps} step(s); loss: {self.loss}"]
        if self.frozen_params:
            lines.append(f"({self.frozen_params} frozen parameters with requires_grad=False ignored)")
        groups = [
            (NEVER, "never used (remove them, or set requires_grad=False)"),
            (SOMETIMES, "used on some steps only (depends on the input: needs find_unused_parameters=True)"),
        ]
        by_name = {p.name: p for p in self.params}
        feeds_dead = {n: d.path for d in self.dead_outputs for n in d.params}
        for usage, title in groups:
            names = self.names(usage)
            if names:
                lines.append(f"{len(names)} {title}:")
                for n in names:
                    p = by_name[n]
                    owner = p.module or "<model>"
                    lines.append(f"  {n}  [{owner}: {p.module_type}]  shape {tuple(p.shape)}"
                                 f"  used {p.used_steps}/{p.steps} steps"
                                 + (f"  (only feeds {feeds_dead[n]})" if n in feeds_dead else ""))
        twice = self.accumulated_twice
        if twice:
            lines.append(f"{len(twice)} with a gradient accumulated more than once per backward "
                         "(reentrant checkpointing or reuse across backward passes: "
                         "'Expected to mark a variable ready only once'):")
            lines.extend(f"  {n}  x{by_name[n].max_accumulations}" for n in twice)
        for d in self.dead_outputs:
            feeds = f"; only it uses {', '.join(d.params)}" if d.params else ""
            lines.append(f"output {d.path} {tuple(d.shape)} does not contribute to the loss{feeds}")
        if not self.has_problem:
            lines.append(f"all {len(self.params)} trainable parameters got a gradient on every step")
        rec = self.recommendation
        lines.append(f"recommended: DistributedDataParallel(model, find_unused_parameters="
                     f"{rec.find_unused_parameters}, static_graph={rec.static_graph})")
        lines.extend(f"  - {r}" for r in rec.reasons)
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Leaving the caller's world untouched


@contextmanager
def _preserved_rng() -> Iterator[None]:
    """Dropout in the analysed forward must not shift the caller's random streams."""
    import torch

    py_state = random.getstate()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    np_state = None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # numpy is optional
        np = None  # type: ignore[assignment]
    try:
        yield
    finally:
        random.setstate(py_state)
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        if np is not None and np_state is not None:
            np.random.set_state(np_state)


def _unwrap(model: Any) -> tuple[Any, bool | None]:
    """The plain module inside DDP / torch.compile wrappers, and DDP's find_unused_parameters if wrapped."""
    flag: bool | None = None
    for _ in range(4):
        if hasattr(model, "find_unused_parameters") and hasattr(model, "module"):  # DistributedDataParallel
            flag = bool(model.find_unused_parameters)
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            break
    return model, flag


def _model_for_analysis(model: torch.nn.Module, copy_model: bool) -> torch.nn.Module:
    """The model (a deep copy unless ``copy_model`` is False) in train mode with no gradients, as DDP sees it."""
    clone = model
    if copy_model:
        try:
            clone = copy.deepcopy(model)
        except Exception as exc:
            raise DoctorError(f"cannot deep-copy the model to analyse it safely: {type(exc).__name__}: {exc}; "
                              "pass copy_model=False if it may be changed") from None
    clone.train()
    for p in clone.parameters():
        p.grad = None
    return clone


# --------------------------------------------------------------------------------------------------
# Batches, forward and loss


def _call_with_declared(fn: Callable[..., Any], **available: Any) -> Any:
    """Call ``fn`` with the keyword arguments it declares among ``available`` (step, rank, world_size)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn()
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn(**available)
    return fn(**{k: v for k, v in available.items() if k in sig.parameters})


def _batches(batch_or_batches: Any, steps: int | None) -> tuple[Callable[[int], Any], int]:
    """(step -> batch, number of steps). A list is several batches; a callable is called per step."""
    if isinstance(batch_or_batches, list):
        if not batch_or_batches:
            raise DoctorError("batch_or_batches is an empty list: give at least one batch")
        items = batch_or_batches
        return (lambda i: items[i % len(items)]), steps or len(items)
    if callable(batch_or_batches) and not _is_tensor(batch_or_batches):
        fn = batch_or_batches
        return (lambda i: call_user("the batch function", fn, step=i)), steps or DEFAULT_STEPS_CALLABLE
    return (lambda _i: batch_or_batches), steps or 1


def random_batches(shape: Sequence[int], model: Any, seed: int = 0) -> Callable[[int], torch.Tensor]:
    """step -> a random normal batch of ``shape`` on the model's device and float dtype (seeded per step)."""
    import torch

    first = next((p for p in _unwrap(model)[0].parameters() if p.is_floating_point()), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None else torch.float32

    def batch(step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed + step)
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    return batch


def batch_source(model: Any, batch_spec: str | None, input_shape: Sequence[int] | None, rank: int = 0,
                 world_size: int = 1) -> Callable[[int], Any]:
    """step -> batch for ``--batch MODULE:FN`` or ``--input-shape`` (the ``unused`` command and check share it).

    The batch function is called with those of step, rank, world_size it declares; random batches differ
    per rank, like DistributedSampler shards.
    """
    if batch_spec:
        from ddpdoctor.modelspec import load_factory

        fn = load_factory(batch_spec)
        return lambda step: call_user(f"--batch {batch_spec!r}", fn, step=step, rank=rank, world_size=world_size)
    if input_shape:
        return random_batches(input_shape, model, seed=1000 * rank)
    raise DoctorError("give the model an input: --batch MODULE:FN or --input-shape (e.g. 4,16)")


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _forward(model: torch.nn.Module, batch: Any) -> Any:
    """A tensor goes in as model(t), a tuple as model(*t), a dict as model(**d)."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, tuple):
        return model(*batch)
    return model(batch)


def _flatten_outputs(out: Any, path: str = "output") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in the return value with where it is, depth first (tuples, lists, dicts, dataclasses)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [(path, out)]
    found: list[tuple[str, torch.Tensor]] = []
    if isinstance(out, Mapping):
        for key, value in out.items():
            found.extend(_flatten_outputs(value, f"{path}[{key!r}]"))
    elif isinstance(out, (tuple, list)):
        for i, value in enumerate(out):
            found.extend(_flatten_outputs(value, f"{path}[{i}]"))
    elif hasattr(out, "__dataclass_fields__"):
        for key in out.__dataclass_fields__:
            found.extend(_flatten_outputs(getattr(out, key), f"{path}.{key}"))
    return found


def _default_loss(outputs: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, str]:
    """The first floating output that requires grad, summed: what ``logits, _ = model(x)`` trains on."""
    for path, tensor in outputs:
        if tensor.is_floating_point() and tensor.requires_grad:
            return tensor.float().sum(), f"sum of {path} (the first output that requires grad)"
    raise DoctorError("no output of the model requires grad: nothing to backpropagate "
                      "(are all parameters frozen, or is the forward under torch.no_grad()?)")


def _graph(root: Any) -> tuple[set[int], set[int]]:
    """(ids of autograd nodes, ids of leaf tensors) reachable from ``root``'s grad_fn."""
    nodes: set[int] = set()
    leaves: set[int] = set()
    stack = [root.grad_fn] if root.grad_fn is not None else []
    keep = []  # hold the nodes so their ids stay unique while we walk
    while stack:
        node = stack.pop()
        if node is None or id(node) in nodes:
            continue
        nodes.add(id(node))
        keep.append(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad holds its leaf tensor
        if variable is not None:
            leaves.add(id(variable))
        stack.extend(nxt for nxt, _ in node.next_functions)
    return nodes, leaves


def call_user(what: str, fn: Callable[..., Any], **available: Any) -> Any:
    """Call user code (a batch function) with the keyword arguments it declares; errors become one line."""
    try:
        return _call_with_declared(fn, **available)
    except DoctorError:
        raise
    except Exception as exc:
        raise user_error(what, exc) from None


# --------------------------------------------------------------------------------------------------
# The analysis


def find_unused_parameters(
    model: Any,
    batch_or_batches: Any,
    loss_fn: LossFn | None = None,
    steps: int | None = None,
    *,
    ddp_find_unused_parameters: bool | None = None,
    copy_model: bool = True,
) -> UnusedReport:
    """Run forward+backward on a copy of ``model`` and classify every parameter that requires grad.

    ``batch_or_batches``: one batch, a ``list`` of batches (used in turn), or a callable ``fn(step)``
    returning the batch for a step. A tensor batch is passed as ``model(t)``, a tuple as ``model(*t)``, a
    dict as ``model(**d)``. ``loss_fn(output, batch)`` returns the scalar loss; by default the loss is the
    sum of the first floating output that requires grad (``logits, _ = model(x)``), and every other output
    whose graph does not reach the loss is reported as dead. ``steps`` defaults to the number of batches
    (1 for a single batch, 4 for a callable). A DDP- or torch.compile-wrapped model is unwrapped; with
    DDP, its ``find_unused_parameters`` setting is read so the report can say when it costs for nothing
    (or pass ``ddp_find_unused_parameters``). ``copy_model=False`` runs the model itself (train mode,
    gradients left behind) instead of a deep copy: for a model built only to be analysed.
    """
    import torch

    model, wrapped_flag = _unwrap(model)
    if not isinstance(model, torch.nn.Module):
        raise DoctorError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if ddp_find_unused_parameters is None:
        ddp_find_unused_parameters = wrapped_flag
    batch_at, n_steps = _batches(batch_or_batches, steps)
    if n_steps < 1:
        raise DoctorError(f"steps must be at least 1, got: {n_steps}")

    with _preserved_rng():
        clone = _model_for_analysis(model, copy_model)
        modules = dict(clone.named_modules())
        named = [(n, p) for n, p in clone.named_parameters() if p.requires_grad]
        frozen = sum(1 for _, p in clone.named_parameters() if not p.requires_grad)
        used_steps = dict.fromkeys((n for n, _ in named), 0)
        max_acc = dict.fromkeys((n for n, _ in named), 0)
        dead: dict[str, DeadOutput] = {}
        loss_text = "loss_fn(output, batch)"
        for step in range(n_steps):
            counts = dict.fromkeys((n for n, _ in named), 0)
            handles = [p.register_post_accumulate_grad_hook(_counter(counts, n)) for n, p in named]
            try:
                loss, outputs, text = _one_step(clone, batch_at(step), loss_fn, step)
                if loss_fn is None:
                    loss_text = text
                _find_dead_outputs(loss, outputs, named, dead)
                loss.backward()
            finally:
                for h in handles:
                    h.remove()
            for n, c in counts.items():
                used_steps[n] += int(c > 0)
                max_acc[n] = max(max_acc[n], c)
            for _, p in named:
                p.grad = None
    params = []
    for n, p in named:
        owner = n.rpartition(".")[0]
        params.append(ParamUse(name=n, module=owner, module_type=type(modules[owner]).__name__,
                               shape=list(p.shape), numel=p.numel(), used_steps=used_steps[n],
                               steps=n_steps, max_accumulations=max_acc[n]))
    report = UnusedReport(steps=n_steps, loss=loss_text, params=params,
                          dead_outputs=sorted(dead.values(), key=lambda d: d.path),
                          recommendation=Recommendation(False, False, []), frozen_params=frozen,
                          ddp_find_unused_parameters=ddp_find_unused_parameters)
    report.recommendation = recommend(report)
    return report


def _counter(counts: dict[str, int], name: str) -> Callable[[Any], None]:
    def hook(_param: Any) -> None:
        counts[name] += 1

    return hook


def _one_step(model: torch.nn.Module, batch: Any, loss_fn: LossFn | None,
              step: int) -> tuple[torch.Tensor, list[tuple[str, torch.Tensor]], str]:
    """Forward and loss for one step; the user's exceptions become one-line DoctorErrors."""
    import torch

    try:
        out = _forward(model, batch)
    except DoctorError:
        raise
    except Exception as exc:
        raise user_error(f"the model's forward on the batch of step {step}", exc) from None
    outputs = _flatten_outputs(out)
    if loss_fn is None:
        loss, text = _default_loss(outputs)
    else:
        try:
            loss = loss_fn(out, batch)
        except Exception as exc:
            raise user_error("loss_fn(output, batch)", exc) from None
        text = "loss_fn(output, batch)"
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        raise DoctorError(f"the loss must be a tensor that requires grad, got: {type(loss).__name__}"
                          f"{'' if not isinstance(loss, torch.Tensor) else ' with requires_grad=False'}")
    if loss.numel() != 1:
        loss = loss.sum()
    return loss, outputs, text


def _find_dead_outputs(loss: torch.Tensor, outputs: list[tuple[str, torch.Tensor]],
                       named: Sequence[tuple[str, torch.Tensor]], dead: dict[str, DeadOutput]) -> None:
    """Record outputs whose autograd graph never reaches the loss (DDP waits for their parameters)."""
    loss_nodes, loss_leaves = _graph(loss)
    ids = {id(p): n for n, p in named}
    for path, tensor in outputs:
        if not tensor.requires_grad or path in dead:
            continue
        if tensor.grad_fn is None:
            if id(tensor) in loss_leaves:  # a parameter returned as is and used by the loss
                continue
        elif id(tensor.grad_fn) in loss_nodes:
            continue
        _, leaves = _graph(tensor)
        if tensor.grad_fn is None:
            leaves = {id(tensor)}
        only_here = [ids[i] for i in leaves - loss_leaves if i in ids]
        dead[path] = DeadOutput(path=path, shape=list(tensor.shape), dtype=str(tensor.dtype).replace("torch.", ""),
                                params=sorted(only_here))


def recommend(report: UnusedReport) -> Recommendation:
    """DDP flags for what the analysis found (behaviour verified per case; see the module docstring)."""
    never = set(report.never_used)
    dead_params = {n for d in report.dead_outputs for n in d.params}
    reasons: list[str] = []
    find_unused = False
    static = False
    if report.sometimes_used:
        find_unused = True
        reasons.append(f"{len(report.sometimes_used)} parameter(s) are used on some steps only: "
                       "find_unused_parameters=True is required and static_graph=True would fail "
                       "('Your training graph has changed in this iteration')")
    if dead_params & never:
        find_unused = True
        reasons.append("parameters that only feed outputs left out of the loss need "
                       "find_unused_parameters=True (static_graph=True fails on them); better: use those "
                       "outputs in the loss or stop returning them")
    if never - dead_params:
        if not find_unused:
            static = True
        reasons.append(f"{len(never - dead_params)} parameter(s) are never used: remove them or set "
                       "requires_grad=False; until then "
                       + ("find_unused_parameters=True covers them" if find_unused else
                          "static_graph=True (no per-step graph walk) or find_unused_parameters=True works"))
    if report.accumulated_twice:
        if find_unused:
            reasons.append("gradients accumulated twice per backward (reentrant checkpointing) cannot work "
                           "with find_unused_parameters=True: use torch.utils.checkpoint(..., "
                           "use_reentrant=False)")
        else:
            static = True
            reasons.append("gradients accumulated twice per backward (reentrant checkpointing): "
                           "static_graph=True supports it, or use checkpoint(..., use_reentrant=False)")
    if not reasons:
        reasons.append("every trainable parameter got a gradient on every step: keep the default "
                       "find_unused_parameters=False")
    costs_for_nothing = report.ddp_find_unused_parameters is True and not find_unused
    if costs_for_nothing:
        reasons.append("find_unused_parameters=True is set but not needed: it walks the autograd graph "
                       "on every step for nothing; turn it off")
    return Recommendation(find_unused_parameters=find_unused, static_graph=static, reasons=reasons,
                          find_unused_costs_for_nothing=costs_for_nothing)


# --------------------------------------------------------------------------------------------------
# Model consistency across ranks


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

    model, _ = _unwrap(model)
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
