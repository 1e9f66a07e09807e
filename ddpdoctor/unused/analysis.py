"""The analysis: forward and backward on a copy for a few steps, counting every parameter's gradient
accumulations (the event DDP's reducer hooks), and the DDP flags it recommends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ddpdoctor.errors import DoctorError
from ddpdoctor.modelspec import user_error

if TYPE_CHECKING:
    import torch

from ddpdoctor.unused.batches import autograd_reach, batches_from, default_loss, flatten_outputs, forward_once
from ddpdoctor.unused.isolation import model_for_analysis, preserved_rng, unwrap
from ddpdoctor.unused.report import DeadOutput, LossFn, ParamUse, Recommendation, UnusedReport


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

    model, wrapped_flag = unwrap(model)
    if not isinstance(model, torch.nn.Module):
        raise DoctorError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if ddp_find_unused_parameters is None:
        ddp_find_unused_parameters = wrapped_flag
    batch_at, n_steps = batches_from(batch_or_batches, steps)
    if n_steps < 1:
        raise DoctorError(f"steps must be at least 1, got: {n_steps}")

    with preserved_rng():
        clone = model_for_analysis(model, copy_model)
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
        out = forward_once(model, batch)
    except DoctorError:
        raise
    except Exception as exc:
        raise user_error(f"the model's forward on the batch of step {step}", exc) from None
    outputs = flatten_outputs(out)
    if loss_fn is None:
        loss, text = default_loss(outputs)
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
    loss_nodes, loss_leaves = autograd_reach(loss)
    ids = {id(p): n for n, p in named}
    for path, tensor in outputs:
        if not tensor.requires_grad or path in dead:
            continue
        if tensor.grad_fn is None:
            if id(tensor) in loss_leaves:  # a parameter returned as is and used by the loss
                continue
        elif id(tensor.grad_fn) in loss_nodes:
            continue
        _, leaves = autograd_reach(tensor)
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
