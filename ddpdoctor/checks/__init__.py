"""The registry of checks: a plain explicit tuple, in the order they run.

Every file in this folder defines ``CHECK``; ``tests/checks/test_registry.py`` asserts each one is listed here
and ids are unique. Order matters: cheap local checks first, then the ones that need the process group,
rank-0-only checks last (so the other ranks do not wait in a collective while rank 0 reads a file).
"""

from __future__ import annotations

from ddpdoctor.check import Check

from . import (
    bandwidth,
    barrier,
    connectivity,
    env,
    gpu,
    memory_bandwidth,
    pcie_bandwidth,
    port,
    state_dict,
    unused_params,
)

ALL_CHECKS: tuple[Check, ...] = (
    env.CHECK,
    gpu.CHECK,
    port.CHECK,
    barrier.CHECK,
    connectivity.CHECK,
    bandwidth.CHECK,
    pcie_bandwidth.CHECK,
    memory_bandwidth.CHECK,
    unused_params.CHECK,
    state_dict.CHECK,
)

CHECK_IDS: tuple[str, ...] = tuple(check.id for check in ALL_CHECKS)

