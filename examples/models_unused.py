"""Models that trip DDP's unused-parameter and model-consistency checks, for ``ddpdoctor unused`` / ``check``.

Each factory takes no arguments and returns a ``torch.nn.Module`` (the ``--model MODULE:FACTORY``
contract); ``batch`` is a ``--batch MODULE:FN`` function. Every model takes a ``[N, 16]`` float batch.

    ddpdoctor unused examples/models_unused.py:dead_branch --input-shape 4,16
    ddpdoctor check --only unused_params --model examples/models_unused.py:rank_dependent \\
        --batch examples/models_unused.py:batch --nproc 2

What each one does under DDP with the default ``find_unused_parameters=False``:

- ``healthy``: nothing; every parameter gets a gradient every step.
- ``dead_branch``: ``aux_head`` is built but never called; the second iteration raises "Expected to have
  finished reduction in the prior iteration before starting a new one".
- ``data_dependent``: ``pos_head`` or ``neg_head`` depending on the sign of the batch mean; fails on the
  first step where one branch is skipped.
- ``rank_dependent``: odd ranks run ``extra``; even ranks never do. DDP errors, or hangs when the ranks
  disagree on what is ready.
- ``unused_output``: returns ``(logits, aux)`` and the training loop computes the loss from ``logits``
  only (``logits, _ = model(x)``): ``aux_head`` never gets a gradient.
- ``reentrant_reuse``: ``shared`` is used inside a reentrant activation checkpoint and again outside it:
  "Expected to mark a variable ready only once" unless ``static_graph=True``.
- ``seeded_per_rank`` / ``width_per_rank``: the model differs across ranks (weights from a per-rank
  seed; a hidden width that depends on the rank: "DDP expects same model across all ranks").
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

IN_FEATURES = 16
HIDDEN = 32
OUT_FEATURES = 4


def _rank() -> int:
    """This process's rank: from the process group when there is one, else from torchrun's RANK."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return int(os.environ.get("RANK", "0"))


class Healthy(nn.Module):
    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU())
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, OUT_FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(x)))


class DeadBranch(Healthy):
    def __init__(self) -> None:
        super().__init__()
        self.aux_head = nn.Linear(HIDDEN, OUT_FEATURES)  # left over from an experiment; never called


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(IN_FEATURES, HIDDEN)
        self.pos_head = nn.Linear(HIDDEN, OUT_FEATURES)
        self.neg_head = nn.Linear(HIDDEN, OUT_FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.encoder(x))
        # Python control flow on data: which head runs changes from batch to batch.
        return self.pos_head(h) if float(x.mean()) > 0 else self.neg_head(h)


class RankDependent(Healthy):
    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.encoder(x))
        if _rank() % 2 == 1:
            h = torch.relu(self.extra(h))
        return self.head(h)


class UnusedOutput(Healthy):
    def __init__(self) -> None:
        super().__init__()
        self.aux_head = nn.Linear(HIDDEN, OUT_FEATURES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        h = self.norm(self.encoder(x))
        return self.head(h), self.aux_head(h)


class ReentrantReuse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(IN_FEATURES, IN_FEATURES)
        self.head = nn.Linear(IN_FEATURES, OUT_FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The reentrant checkpoint recomputes `shared` inside its own backward pass, so the
        # gradient of `shared` is accumulated twice per iteration (pytorch/pytorch#43259).
        h = checkpoint(self.shared, x.requires_grad_(), use_reentrant=True)
        return self.head(self.shared(torch.relu(h)))


def healthy() -> nn.Module:
    return Healthy()


def dead_branch() -> nn.Module:
    return DeadBranch()


def data_dependent() -> nn.Module:
    return DataDependent()


def rank_dependent() -> nn.Module:
    return RankDependent()


def unused_output() -> nn.Module:
    return UnusedOutput()


def reentrant_reuse() -> nn.Module:
    return ReentrantReuse()


def seeded_per_rank() -> nn.Module:
    """The classic slip: ``torch.manual_seed(rank)`` before building the model."""
    torch.manual_seed(_rank())
    return Healthy()


def width_per_rank() -> nn.Module:
    """A config that differs per rank (hidden width 32 on rank 0, 40 on rank 1, ...)."""
    return Healthy(hidden=HIDDEN + 8 * _rank())


def batch(step: int = 0, rank: int = 0) -> torch.Tensor:
    """A different ``[4, 16]`` batch per step and per rank, like a DistributedSampler shard."""
    gen = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, IN_FEATURES, generator=gen)


def alternating_batch(step: int = 0) -> torch.Tensor:
    """Positive batch mean on even steps, negative on odd ones: ``data_dependent`` uses both heads."""
    gen = torch.Generator().manual_seed(step)
    x = torch.rand(4, IN_FEATURES, generator=gen) + 0.1
    return x if step % 2 == 0 else -x
