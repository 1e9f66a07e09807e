"""The check registry is an explicit tuple: every file in checks/ is in it, ids unique and stable."""

from __future__ import annotations

from ddpdoctor.checks import ALL_CHECKS
from tests.support import REPO

DESIGN_IDS = {"env", "port", "connectivity", "barrier", "bandwidth", "gpu", "unused_params", "state_dict",
              "pcie_bandwidth", "memory_bandwidth"}


def test_every_check_file_is_registered_once() -> None:
    files = sorted(p.stem for p in (REPO / "ddpdoctor" / "checks").glob("*.py") if p.stem != "__init__")
    registered = sorted(c.id for c in ALL_CHECKS)
    assert registered == files, "each checks/<id>.py defines CHECK with id <id> and is listed in ALL_CHECKS"
    assert len(set(registered)) == len(registered)


def test_ids_are_the_designs_stable_ids() -> None:
    assert {c.id for c in ALL_CHECKS} <= DESIGN_IDS


def test_rank0_only_checks_run_last() -> None:
    flags = [c.rank0_only for c in ALL_CHECKS]
    assert flags == sorted(flags), "rank-0-only checks must come after the others"
