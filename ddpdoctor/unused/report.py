"""What the analysis reports: how each parameter was used, the outputs no loss reads, and the DDP flags
that follow from them (the data, its text and its JSON)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass



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
