"""One real, healthy self-launched ``check`` shared by the runtime tests that read it from outside.

Its process group is formed and used (barrier, connectivity), and the user's view is recorded as it
happens: when Enter was pressed, when the report's first line arrived, and everything printed. The header's
clock (test_progress) and "no PyTorch warning" (test_device) are two readings of the same run, so the suite
pays for one self-launch, not two.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from tests.support import clean_env


@dataclass(frozen=True)
class HealthyRun:
    returncode: int
    header: str  # the report's first line
    printed_after_s: float  # how long after Enter the header reached the user
    stdout: str  # the whole report, header included
    stderr: str


@pytest.fixture(scope="session")
def healthy_check(tmp_path_factory: pytest.TempPathFactory) -> HealthyRun:
    err_path = tmp_path_factory.mktemp("healthy_check") / "stderr.txt"
    began = time.time()
    with err_path.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "check", "--nproc", "2", "--only",
                                 "barrier,connectivity", "--timeout", "120"], env=clean_env(), stdout=subprocess.PIPE,
                                stderr=err, text=True)
    assert proc.stdout is not None
    deadline = threading.Timer(240, proc.kill)  # a hang fails the tests, never the suite
    deadline.start()
    try:
        header = proc.stdout.readline()
        printed = time.time() - began
        rest = proc.stdout.read()  # (communicate() would lose what readline buffered)
        proc.wait()
    finally:
        deadline.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return HealthyRun(proc.returncode, header, printed, header + rest, err_path.read_text())
