"""Helpers of the GPU suite: a one-rank launcher environment and the paths of its target programs."""

from __future__ import annotations

from pathlib import Path

from tests.support import clean_env, free_port

TARGETS = Path(__file__).resolve().parent / "targets"


def one_rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """What torchrun gives a single rank (RANK, WORLD_SIZE, MASTER_*), on the first GPU only.

    ``extra`` is applied last: a test that sets ``CUDA_VISIBLE_DEVICES=""`` (no GPU visible) or its own
    launcher variable gets what it asked for (the defaults used to overwrite it, and the no-GPU job saw
    the GPU and succeeded).
    """
    env = clean_env()
    env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": "0"})
    env.update(extra or {})
    return env
