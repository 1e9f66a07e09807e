"""Tiny model factories for `ddpdoctor ckpt diff --model` and the state_dict check (tests and docs).

    ddpdoctor ckpt diff ddp.pt --model examples.ckpt_models:make_mlp
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Two linear layers and a BatchNorm (so the state_dict has buffers and ``_metadata`` versions)."""

    def __init__(self, width: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.bn = nn.BatchNorm1d(width)
        self.fc2 = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def make_mlp() -> nn.Module:
    """The model the test checkpoints were saved from."""
    torch.manual_seed(0)
    return MLP()


def make_wide_mlp() -> nn.Module:
    """Same layers, other sizes: a checkpoint of make_mlp does not fit it (shape mismatches)."""
    return MLP(width=16, classes=4)


def make_broken() -> nn.Module:
    """A factory that fails, to show how a user's exception is reported."""
    raise ValueError("num_classes must be set in the config")


def make_not_a_model() -> dict[str, int]:
    """Returns something that is not an nn.Module."""
    return {"width": 8}


def make_mlp_numpy_init() -> nn.Module:
    """Initialises through numpy, which a meta-device build cannot do: diff falls back to a real build."""
    model = MLP()
    model.fc1.weight.data.numpy()[:] = 0.5
    return model


class Block(nn.Module):
    """One layer of a small transformer-like stack: what FSDP and activation checkpointing wrap one by one."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.attn(x))


class Stack(nn.Module):
    """``layers.N`` blocks and a head: keys like ``layers.1.attn.weight``, as in real LLM checkpoints."""

    def __init__(self, depth: int = 3, width: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def make_stack() -> nn.Module:
    """The layered model the FSDP / activation-checkpointing / sharded examples were saved from."""
    torch.manual_seed(0)
    return Stack()
