"""The model the fuzz seeds were saved from (make_seeds.py), for `ckpt diff --model tests/fuzz/fuzz_model.py:build`."""

from __future__ import annotations

from typing import Any


def build() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
