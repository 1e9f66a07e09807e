"""`bench` sizes that cannot be measured are refused before any rank starts; an allocation that still
fails mid-run is called out of memory, not a network fault (issue 20)."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from ddpdoctor.cli import main
from tests.support import clean_env


@pytest.mark.parametrize(("args", "words"), [
    (["-b", "1", "-e", "1"], "one float is 4 bytes"),  # measured 0 bytes and exited 0
    (["-b", "4", "-e", "4", "--op", "all_gather", "--nproc", "2"], "each of the 2 ranks"),
    (["-b", "1T", "-e", "1T", "--nproc", "2"], "memory available"),  # blamed the network
    (["-b", "4" * 400], "takes a size like"),  # exit 3
    (["-e", "9" * 25], "larger than any machine's memory"),
    (["-b", "1.5"], "whole number of bytes"),
])
def test_unmeasurable_sizes_are_one_line_before_anything_starts(
        args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_allocation_failing_mid_run_is_out_of_memory_not_the_network() -> None:
    # A real allocation failure: the ranks' address space is capped (ulimit -v, which some clusters set),
    # which the up-front check does not predict; 512 MiB buffers then cannot be allocated.
    limit = 2 << 30

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "bench", "--nproc", "2", "-b", "512M", "-e", "512M",
                           "-n", "1", "-w", "0", "--timeout", "30"], capture_output=True, text=True, timeout=180,
                          env=clean_env(), preexec_fn=cap)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "out of memory" in proc.stderr and "smaller -e" in proc.stderr
    assert "peer died" not in proc.stderr and "Traceback" not in proc.stderr
