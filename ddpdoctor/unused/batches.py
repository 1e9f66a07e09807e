"""Batches, forward and loss: where the analysed steps' inputs come from (a user's function, a list, a random
tensor of a given shape), one forward, the outputs as named tensors, and what the autograd graph reaches."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ddpdoctor.errors import DoctorError, typed_error
from ddpdoctor.modelspec import user_error

if TYPE_CHECKING:
    import torch

from ddpdoctor.unused.isolation import unwrap
from ddpdoctor.unused.report import DEFAULT_STEPS_CALLABLE


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


def batches_from(batch_or_batches: Any, steps: int | None) -> tuple[Callable[[int], Any], int]:
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

    first = next((p for p in unwrap(model)[0].parameters() if p.is_floating_point()), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None else torch.float32

    def batch(step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed + step)
        try:
            return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)
        except (RuntimeError, MemoryError) as exc:  # ddpdoctor makes this batch: no batch function of the user's
            size = "x".join(str(n) for n in shape)
            raise DoctorError(f"--input-shape {size}: cannot make a random batch of that shape "
                              f"({typed_error(exc)[:150]})") from None

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


def forward_once(model: torch.nn.Module, batch: Any) -> Any:
    """A tensor goes in as model(t), a tuple as model(*t), a dict as model(**d)."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, tuple):
        return model(*batch)
    return model(batch)


def flatten_outputs(out: Any, path: str = "output") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in the return value with where it is, depth first (tuples, lists, dicts, dataclasses)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [(path, out)]
    found: list[tuple[str, torch.Tensor]] = []
    if isinstance(out, Mapping):
        for key, value in out.items():
            found.extend(flatten_outputs(value, f"{path}[{key!r}]"))
    elif isinstance(out, (tuple, list)):
        for i, value in enumerate(out):
            found.extend(flatten_outputs(value, f"{path}[{i}]"))
    elif hasattr(out, "__dataclass_fields__"):
        for key in out.__dataclass_fields__:
            found.extend(flatten_outputs(getattr(out, key), f"{path}.{key}"))
    return found


def default_loss(outputs: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, str]:
    """The first floating output that requires grad, summed: what ``logits, _ = model(x)`` trains on."""
    for path, tensor in outputs:
        if tensor.is_floating_point() and tensor.requires_grad:
            return tensor.float().sum(), f"sum of {path} (the first output that requires grad)"
    raise DoctorError("no output of the model requires grad: nothing to backpropagate "
                      "(are all parameters frozen, or is the forward under torch.no_grad()?)")


def autograd_reach(root: Any) -> tuple[set[int], set[int]]:
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
    from ddpdoctor.modelspec import users_prints_to_stderr

    try:
        with users_prints_to_stderr():
            return _call_with_declared(fn, **available)
    except DoctorError:
        raise
    except Exception as exc:
        raise user_error(what, exc) from None
