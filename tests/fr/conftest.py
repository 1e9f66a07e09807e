"""The real dumps every fr test reads: one gloo job per way of hanging, run once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fr.jobs import STALL_HANG_S, finish, read_stalled_job, start_job
from tests.support import made_once


@pytest.fixture(scope="session")
def fr_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """mode -> folder of dumps. Six jobs, pickle and JSON, run side by side: their time is torchrun's
    start-up and the 5 s hang each, which overlap. The stall job hangs STALL_HANG_S (12 s) instead, while ``stacks --json``
    reads its ranks: that reading is ``"stall_stacks"`` (a file beside the folders, read with the same
    dumps by tests/fr/test_fr_stacks.py)."""
    plan = {"healthy": ("json", 2), "mismatch": ("pickle", 3), "stall": ("pickle", 3), "skip": ("json", 3),
            "crash": ("pickle", 3), "subgroup": ("pickle", 3)}

    def make(base: Path) -> None:
        jobs = {mode: start_job(base / mode, mode, fmt, nproc, hang=STALL_HANG_S if mode == "stall" else 5)
                for mode, (fmt, nproc) in plan.items()}
        try:
            try:
                read_stalled_job(jobs["stall"], base / "stall_stacks.json")
            except AssertionError as failed:  # test_fr_stacks.py fails with it; the dumps still serve the others
                (base / "stall_stacks.json").write_text(f"not read: {failed}")
        finally:
            for proc in jobs.values():
                finish(proc)

    base = made_once(tmp_path_factory, "fr", make)
    return {**{mode: base / mode for mode in plan}, "stall_stacks": base / "stall_stacks.json"}
