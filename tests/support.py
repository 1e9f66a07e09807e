"""Shared test helpers: run the real CLI as a subprocess, with a deadline, and find free ports."""

from __future__ import annotations

import fcntl
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port nobody listens on right now, outside the kernel's ephemeral range (like a user would pick:
    a port inside that range makes the `port` check warn, rightly).

    From 20000-29999 rather than torch's customary 500 ports: a job binds its port seconds after it was
    picked (after `import torch`), and with many jobs started side by side (xdist workers, the GPU suite's
    parallel steps) two picks of 500 met: the first H100 run of the GPU suite lost a test to EADDRINUSE.
    """
    from ddpdoctor.ports import free_port as pick

    return pick("127.0.0.1", range(20000, 30000))


# What PyTorch prints when a process group was neither destroyed nor aborted before its destructor ran
# (``~ProcessGroupNCCL``, "WARNING: destroy_process_group() was not called before program exit, which can
# leak resources"): our own ranks must never make it print, failure paths included (issue 35). Gloo's
# destructor is silent, so on CPU this guards the teardown paths; tests/gpu checks it on NCCL.
PG_NOT_DESTROYED = "destroy_process_group() was not called"


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without any launcher variables, so the CLI does not think it is a rank."""
    drop_prefixes = ("TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "GROUP_", "ROLE_")
    drop = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(drop_prefixes)}
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def run_cli(args: Sequence[str], *, timeout: float = 120, env: Mapping[str, str] | None = None,
            input_text: str | None = None, cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ddpdoctor ARGS`` for real; the timeout turns a hang into a test failure."""
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args],
        capture_output=True, text=True, timeout=timeout,
        env=dict(env) if env is not None else clean_env(), input=input_text,
        cwd=str(cwd) if cwd is not None else None,
    )


# End-of-run lines (the explain corpus score, the fuzz input count) travel with a test's report as
# user_properties under these names: with ``-n`` (pytest-xdist) tests run in worker processes, and the report
# is what reaches the process that prints the summary (tests/conftest.py).
SUMMARY_PROPERTY = "ddpdoctor-summary"
# Set for each test by tests/conftest.py, inherited by every process it starts (see its fixture).
TEST_TAG_VARIABLE = "DDPDOCTOR_TESTS_TAG"
FUZZ_PROPERTY = "ddpdoctor-fuzz"


def report_summary(request: pytest.FixtureRequest, title: str, text: str) -> None:
    """Print ``text`` under ``title`` at the end of the run (the last text reported under a title wins)."""
    request.node.user_properties.append((SUMMARY_PROPERTY, {"title": title, "text": text}))


def made_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object],
              deadline_s: float = 900) -> Path:
    """The folder ``name``, filled by ``make(folder)`` once per test run and shared by every pytest-xdist
    worker (a session fixture is otherwise made once per worker: the Flight Recorder jobs, ~60 s, ran twice).

    The first worker makes it under an exclusive lock on a file beside it; the others wait for the lock
    (at most ``deadline_s``) and find it made. A folder left half-made by a failed ``make`` is made again.
    Tests only read it (those that change a file copy the folder first)."""
    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder, done = base / name, base / f"{name}.made"
    with (base / f"{name}.lock").open("w") as lock:
        give_up = time.monotonic() + deadline_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > give_up:
                    raise TimeoutError(f"{folder} was not made by another worker within {deadline_s:g} s") from None
                time.sleep(0.2)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


def made_by_example(module: str, out: Path) -> Path:
    """Run an example that writes real checkpoints into ``out`` (bounded: a stuck save fails the test)."""
    subprocess.run([sys.executable, "-m", module, str(out)], cwd=REPO, env=clean_env(),
                   check=True, timeout=300, capture_output=True)
    return out


def torchrun_cmd() -> list[str]:
    """torchrun from this interpreter's environment (as a module, so no PATH surprises)."""
    return [sys.executable, "-m", "torch.distributed.run"]


def have_netns() -> bool:
    """Network-namespace tests need root and iproute2's `ip`, `tc` and `unshare`."""
    return (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("ip") is not None
            and shutil.which("tc") is not None and shutil.which("unshare") is not None)


def communicate_all(procs: Sequence[subprocess.Popen[str]], timeout: float = 150) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of every process; any still running at the end is killed, never left."""
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def load_checking_offsets(path: Path) -> tuple[Any, Any]:
    """``torch.load`` with ``mmap=True`` and on the meta device, torch's computed offsets asserted.

    With ``calculate_storage_offsets`` torch computes each tensor record's offset from the one before
    (miniz's layout) instead of reading its header, and ``TORCH_SERIALIZATION_DEBUG=1`` makes it assert
    the two agree; ``map_location="meta"`` always computes them. A rewritten zip that breaks torch's
    layout rules fails here, where a plain load would pass (or read the wrong bytes).
    """
    import torch
    from torch.utils.serialization import config

    old_env = os.environ.get("TORCH_SERIALIZATION_DEBUG")
    old_calc = config.load.calculate_storage_offsets
    os.environ["TORCH_SERIALIZATION_DEBUG"] = "1"
    config.load.calculate_storage_offsets = True
    try:
        loaded = torch.load(path, weights_only=True, mmap=True)
        meta = torch.load(path, weights_only=True, map_location="meta")
    finally:
        config.load.calculate_storage_offsets = old_calc
        if old_env is None:
            os.environ.pop("TORCH_SERIALIZATION_DEBUG", None)
        else:
            os.environ["TORCH_SERIALIZATION_DEBUG"] = old_env
    return loaded, meta


# A Python process blocked with known stacks (for the stacks tests), and how to run such targets.
BLOCKED_TARGET = REPO / "tests" / "targets" / "blocked_stacks.py"
TARGET_DEADLINE_S = 60.0


def kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the target's whole session (it may have children) and reap it."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with suppress(ProcessLookupError):
        proc.kill()
    proc.wait(timeout=TARGET_DEADLINE_S)


@contextmanager
def started(cmd: list[str], log: Path, ready: bool = True) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` (stderr to ``log``); with ``ready``, return once it printed the line "ready"."""
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=REPO)
    try:
        if ready:
            wait_ready(proc, log)
        yield proc
    finally:
        kill_session(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def wait_ready(proc: subprocess.Popen[bytes], log: Path) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + TARGET_DEADLINE_S
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"ready\n" not in seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{proc.args!r} never printed ready: {seen!r}\n{log.read_text(errors='replace')}"
            if sel.select(timeout=min(left, 1.0)):
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, f"{proc.args!r} exited ({proc.wait()}):\n{log.read_text(errors='replace')}"
                seen += chunk


def without_root_read(cmd: Sequence[str]) -> list[str]:
    """``cmd`` as a process that permission checks apply to, even when the tests run as root (CI does).

    Root reads a chmod-000 file through CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH; ``setpriv`` drops both from
    the bounding set before exec, which is what an unprivileged user is for file access. Callers skip when
    :func:`can_drop_root_read` is False.
    """
    if os.geteuid() != 0:
        return list(cmd)
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search", *cmd]


def can_drop_root_read() -> bool:
    """Whether :func:`without_root_read` makes permission checks apply (not root, or setpriv is there)."""
    return os.geteuid() != 0 or shutil.which("setpriv") is not None
