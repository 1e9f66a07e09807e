"""The real dumps every fr test reads: one gloo job per way of hanging, run once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fr.jobs import finish, start_job
from tests.support import made_once


@pytest.fixture(scope="session")
def fr_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """mode -> folder of dumps. Six jobs, pickle and JSON, run side by side: their time is torchrun's
    start-up and the 5 s hang each, which overlap."""
    plan = {"healthy": ("json", 2), "mismatch": ("pickle", 3), "stall": ("pickle", 3), "skip": ("json", 3),
            "crash": ("pickle", 3), "subgroup": ("pickle", 3)}

    def make(base: Path) -> None:
        jobs = {mode: start_job(base / mode, mode, fmt, nproc) for mode, (fmt, nproc) in plan.items()}
        for proc in jobs.values():
            finish(proc)

    base = made_once(tmp_path_factory, "fr", make)
    return {mode: base / mode for mode in plan}
