"""The fuzz suite's budget (fast in CI, --fuzz-long locally), the real seed files, and the input count.

See docs/testing.md for how to run it and why it is random (not derandomized) in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.fuzz import harness
from tests.support import BLOCKED_TARGET, FUZZ_PROPERTY, REPO, clean_env, made_once, started

# Base examples per test (each test scales it by its weight). CI: the whole of tests/fuzz in under two
# minutes on two cores; long: >= 100,000 inputs in all (the count is printed at the end of the run).
CI_EXAMPLES = 25
LOCAL_EXAMPLES = 50
LONG_EXAMPLES = 6000


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def pytest_configure(config: pytest.Config) -> None:
    long = bool(config.getoption("--fuzz-long", default=False))
    base = LONG_EXAMPLES if long else CI_EXAMPLES if _in_ci() else LOCAL_EXAMPLES
    env = os.environ.get("DDPDOCTOR_FUZZ_EXAMPLES")
    if env:
        base = int(env)
    harness.BUDGET.examples = base
    if os.environ.get("DDPDOCTOR_FUZZ_SOFT_S"):  # the per-input soft bound (default 20 s)
        harness.BUDGET.soft_s = float(os.environ["DDPDOCTOR_FUZZ_SOFT_S"])
    if os.environ.get("DDPDOCTOR_FUZZ_HARD_S"):  # the watchdog that ends the run (default 60 s)
        harness.BUDGET.hard_s = float(os.environ["DDPDOCTOR_FUZZ_HARD_S"])
    harness.BUDGET.long = long
    # The hard watchdog of harness.time_bound exits the process: its stacks must reach the terminal (or
    # the CI log), not pytest's capture file that dies with the process. pytest keeps the real stderr in
    # its capture manager (a private attribute: if it moves, the stacks go to a file in $TMPDIR).
    try:
        capman = config.pluginmanager.getplugin("capturemanager")
        harness.STALL_FD = int(capman._global_capturing.err.targetfd_save)  # type: ignore[union-attr]
    except Exception:
        harness.STALL_FD = None


def fuzz_settings(weight: float = 1.0, **extra: Any) -> settings:
    """Hypothesis settings for a fuzz test, applied per test (a global profile would change the other
    suites' hypothesis tests when the whole of tests/ runs).

    No example database in CI (nothing to keep; no `.hypothesis` folder written); locally the default one
    (`.hypothesis/`, git-ignored) replays the last failures first. ``print_blob``: a CI failure prints the
    `@reproduce_failure` line that replays it exactly. The deadline is generous (a loaded 2-core CI
    machine); the real bound is :func:`tests.fuzz.harness.time_bound` around every input.
    """
    opts: dict[str, Any] = {
        "max_examples": harness.examples(weight),
        "deadline": timedelta(seconds=15),
        "print_blob": True,
        "suppress_health_check": list(HealthCheck),
    }
    if _in_ci():
        opts["database"] = None
    opts.update(extra)
    return settings(**opts)


@pytest.fixture(autouse=True)
def _count_inputs(request: pytest.FixtureRequest) -> Iterator[None]:
    """What this test ran through ddpdoctor, reported with it: with ``-n`` (pytest-xdist) the tests run in
    worker processes, and only what travels with a test's report reaches the end-of-run line that
    tests/conftest.py prints (and DDPDOCTOR_FUZZ_COUNT_FILE)."""
    inputs, codes = harness.BUDGET.inputs, dict(harness.BUDGET.codes)
    yield
    ran = {str(code): n - codes.get(code, 0) for code, n in harness.BUDGET.codes.items() if n != codes.get(code, 0)}
    mode = "long" if harness.BUDGET.long else "ci" if _in_ci() else "local"
    request.node.user_properties.append((FUZZ_PROPERTY, {
        "inputs": harness.BUDGET.inputs - inputs, "codes": ran, "mode": mode, "examples": harness.BUDGET.examples}))
    harness.CURRENT_INPUT.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real files written by torch.save, safetensors, DCP and PyTorch's Flight Recorder (make_seeds.py)."""
    def make(out: Path) -> None:
        subprocess.run([sys.executable, "-m", "tests.fuzz.make_seeds", str(out)], cwd=REPO, env=clean_env(),
                       check=True, timeout=300, capture_output=True)

    return made_once(tmp_path_factory, "seeds", make)


@pytest.fixture(scope="session")
def stacks_seed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real `ddpdoctor stacks --json` file: py-spy's stacks of a real blocked Python process."""
    folder = tmp_path_factory.mktemp("stacks")
    node = folder / "node.json"
    with started([sys.executable, str(BLOCKED_TARGET)], folder / "target.log") as proc:
        res = harness.run_cli(["stacks", "--pid", str(proc.pid), "--all-threads", "--json", str(node)],
                              soft_s=120)
    assert res.code == 0 and node.is_file(), res.err
    yield node


@pytest.fixture(autouse=True)
def _no_marker_left() -> Iterator[None]:
    harness.MARKER.unlink(missing_ok=True)
    yield
    assert not harness.MARKER.exists(), "a payload ran during this test"
