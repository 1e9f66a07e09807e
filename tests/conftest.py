"""Markers that skip cleanly where the hardware or privileges do not exist, and the real checkpoints more
than one test folder reads (made once per session: a fixture imported into another folder's module would
be a second fixture, made a second time)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.debian import prefetch_in_background
from tests.support import (
    FUZZ_PROPERTY,
    SUMMARY_PROPERTY,
    TEST_TAG_VARIABLE,
    have_netns,
    made_by_example,
    made_once,
)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_configure(config: pytest.Config) -> None:
    """Cache the bytecode of ``ddpdoctor`` and ``tests`` before the first test.

    The suite starts a few thousand Python processes (the CLI, every rank of every job), each importing
    ddpdoctor. Where ``PYTHONDONTWRITEBYTECODE`` is set (as on CI's image) nothing would ever be cached, and
    every one of them would compile the modules it imports again: ~50 ms for ``ckpt strip``, more for
    ``watch`` and ``explain``. compileall writes the caches explicitly (Python reads them whatever that
    variable says); on a second run it only compares timestamps."""
    import compileall

    root = Path(__file__).resolve().parent.parent
    for folder in ("ddpdoctor", "tests"):
        compileall.compile_dir(root / folder, quiet=1)
    if not hasattr(config, "workerinput") and _may_need_debian_packages(config):  # once, in the main process
        prefetch_in_background()


def _may_need_debian_packages(config: pytest.Config) -> bool:
    """Whether the tests asked for can need an apt install (Open MPI, Slurm, faketime, nftables): not the GPU suite.

    Its machine has no network, and the prefetch thread (not a daemon, bounded by apt's deadlines) held pytest's
    exit there: on the first H200 run a step whose 5 tests took 6 s ran into its 100 s limit.
    """
    gpu = Path(__file__).resolve().parent / "gpu"
    paths = [Path(str(arg).split("::")[0]).resolve() for arg in config.args]
    return not paths or any(not path.is_relative_to(gpu) for path in paths)


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/fuzz/conftest.py: pytest takes options only from the first conftest it loads.
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="tests/fuzz: run many more generated inputs per test (deep local runs; see "
                     "docs/testing.md). DDPDOCTOR_FUZZ_EXAMPLES=N sets the examples per test directly.")


class _RunSummary:
    """What tests reported for the end of the run (tests.support.report_summary and the fuzz counts), gathered
    from the reports themselves, so that it works the same in one process and with ``-n`` (pytest-xdist)."""

    texts: ClassVar[dict[str, str]] = {}
    fuzz_inputs = 0
    fuzz_codes: ClassVar[dict[int, int]] = {}
    fuzz_mode = ""
    fuzz_examples = 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":  # user_properties are complete once the test's fixtures are torn down
        return
    for name, reported in report.user_properties:
        value: Any = reported  # a dict, as tests.support.report_summary and tests/fuzz/conftest.py put it
        if name == SUMMARY_PROPERTY:
            _RunSummary.texts[value["title"]] = value["text"]
        elif name == FUZZ_PROPERTY:
            _RunSummary.fuzz_inputs += value["inputs"]
            for code, count in value["codes"].items():
                _RunSummary.fuzz_codes[int(code)] = _RunSummary.fuzz_codes.get(int(code), 0) + count
            _RunSummary.fuzz_mode, _RunSummary.fuzz_examples = value["mode"], value["examples"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _RunSummary.fuzz_inputs:
        terminalreporter.write_line(
            f"fuzz: {_RunSummary.fuzz_inputs} inputs run through ddpdoctor ({_RunSummary.fuzz_mode} mode, "
            f"{_RunSummary.fuzz_examples} base examples per test; exit codes {dict(sorted(_RunSummary.fuzz_codes.items()))})")
        out = os.environ.get("DDPDOCTOR_FUZZ_COUNT_FILE")
        if out:
            Path(out).write_text(f"{_RunSummary.fuzz_inputs}\n", encoding="utf-8")
    for title, text in _RunSummary.texts.items():
        terminalreporter.write_sep("-", title)
        terminalreporter.write_line(text)


# The modules whose real jobs take longest, longest first (worker seconds in a `--durations` run of
# 2026-11-27, two workers: watch 250/200/120/90, bench 70, explain's hangs 68, ...). pytest-xdist's loadscope
# hands whole modules to workers in the order they are collected, and collection is alphabetical, which put
# tests/watch/ (~760 s of the ~2100 s) last: a worker could be left alone with a 250 s module at the end.
# Longest first, the many short modules fill in at the end. The order changes no test, only when it runs.
LONGEST_FIRST = (
    "tests/watch/test_watch.py", "tests/watch/test_progress.py", "tests/watch/test_hostile.py",
    "tests/watch/test_spawn.py", "tests/bench/test_bench.py", "tests/explain/test_hangs.py",
    "tests/lab/test_watch_lab.py", "tests/check/test_faults.py",
    "tests/check/test_local.py", "tests/launchers/test_launchers.py", "tests/watch/test_shutdown.py",
    "tests/explain/test_ranking.py", "tests/fr/test_fr_jobs.py", "tests/checks/test_unused_params.py",
    "tests/stacks/test_stacks.py", "tests/runtime/test_progress.py", "tests/check/test_netns.py",
    "tests/fr/test_fr_stacks.py", "tests/watch/test_rendezvous.py",
)


# Modules whose assertions need the cores mostly to themselves (a throttled rank must still stand out from CPU
# contention): handed out last, when the other worker is finishing short tests, not beside the long real jobs
# above (a fresh-clone run had the throttled-rank test read as contention there).
RUN_LAST = ("tests/check/test_noise.py",)


def _module(item: pytest.Item) -> str:
    return Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent.parent).as_posix()


def _run_order(item: pytest.Item) -> int:
    path = _module(item)
    if path in RUN_LAST:
        return len(LONGEST_FIRST) + 1 + RUN_LAST.index(path)
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_run_order)  # stable: within a module, and among the rest, collection order
    cuda = None
    for item in items:
        if "requires_cuda" in item.keywords:
            if cuda is None:
                cuda = _cuda_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU (none on this machine)"))
        if "requires_netns" in item.keywords and not have_netns():
            item.add_marker(pytest.mark.skip(reason="needs root and iproute2 (ip, tc) for network namespaces"))


# Handed out last is not alone: at three workers on CI's two cores, the other workers' last modules still ran
# beside the noise tests, and an 8-rank job on 2 cores read one rank as slow on all its links (a fresh clone,
# 2026-11-28). So each test of the other modules holds a shared lock on one file of this run for its whole
# protocol (setup, call, teardown), and a RUN_LAST test an exclusive one: it starts when no other test runs,
# and none starts while it runs. Every wait has a deadline, after which the test runs anyway (and says so).
MACHINE_LOCK_DEADLINE_S = 900.0


@contextlib.contextmanager
def _machine_share(exclusive: bool) -> Iterator[None]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:  # one process: nothing runs beside it
        yield
        return
    fd = os.open(os.path.join(tempfile.gettempdir(), f"ddpdoctor-tests-{run}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        deadline = time.monotonic() + MACHINE_LOCK_DEADLINE_S
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        while True:
            try:
                fcntl.flock(fd, mode)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    print(f"tests/conftest.py: no {'exclusive' if exclusive else 'shared'} turn in "
                          f"{MACHINE_LOCK_DEADLINE_S:.0f} s: running anyway", file=sys.stderr)
                    break
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _machine_share(exclusive=_module(item) in RUN_LAST):
        yield


@pytest.fixture(autouse=True)
def _tag_the_processes_of_this_test(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process a test starts inherits a tag naming the test (clean_env copies os.environ), so a
    search for processes left behind (tests.watch.test_watch.leftovers) finds this test's, not those of a
    test running beside it in another pytest-xdist worker with the same script."""
    monkeypatch.setenv(TEST_TAG_VARIABLE, f"{os.getpid()}:{request.node.nodeid}")


@pytest.fixture(scope="session")
def dcp_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DCP directories written by a real 2-rank gloo DDP job (examples/ckpt_make_dcp.py, via mp.spawn)."""
    return made_once(tmp_path_factory, "dcp", lambda out: made_by_example("examples.ckpt_make_dcp", out))


@pytest.fixture(scope="session")
def shard_sets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shard sets written by safetensors.torch.save_file and torch.save (examples/ckpt_make_shards.py)."""
    return made_once(tmp_path_factory, "shards", lambda out: made_by_example("examples.ckpt_make_shards", out))
