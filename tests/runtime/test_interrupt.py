"""A self-launched job stopped by a scheduler's SIGTERM (or Ctrl-C) stops its ranks and exits 128 + signal.

SLURM and Kubernetes send SIGTERM before SIGKILL; the shell reports 128 + signal for a killed process,
so scripts around ddpdoctor read 143 as "terminated", 130 as "interrupted", never as a problem found (1).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support import REPO, clean_env, free_port, kill_session


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_self_launched_bench_stopped_by_a_signal_exits_128_plus_it_and_leaves_no_rank(sig: signal.Signals) -> None:
    cmd = [sys.executable, "-m", "ddpdoctor", "bench", "--nproc", "2", "--backend", "gloo", "-b", "1M", "-e", "1M",
           "-n", "100000", "--master-port", str(free_port())]
    proc = subprocess.Popen(cmd, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    ranks: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
                     if "ddpdoctor" in " ".join(p.cmdline())]
            if len(ranks) >= 2:
                break
            time.sleep(0.2)
        assert len(ranks) >= 2, "the ranks never started"
        time.sleep(2)  # into the measurement loop
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_session(proc)  # type: ignore[arg-type]
    assert proc.returncode == 128 + sig, err[-2000:]
    assert f"interrupted ({sig.name}); all local ranks stopped" in err
    _gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive, f"ranks outlived the {sig.name}: {[p.pid for p in alive]}"


@pytest.mark.slow
def test_rank_0_killed_from_outside_is_a_problem_found_not_a_ddpdoctor_bug() -> None:
    """The OOM killer (or a user's kill -9) ends rank 0 before it reports: exit 1 naming the signal, not 3."""
    cmd = [sys.executable, "-m", "ddpdoctor", "check", "--nproc", "2", "--backend", "gloo", "--timeout", "60",
           "--master-port", str(free_port())]
    proc = subprocess.Popen(cmd, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        rank0 = None
        deadline = time.monotonic() + 90
        while rank0 is None and time.monotonic() < deadline and proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if child.environ().get("RANK") == "0" and "ddpdoctor" in " ".join(child.cmdline()):
                        rank0 = child
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            time.sleep(0.05)
        assert rank0 is not None, "rank 0 never started"
        rank0.send_signal(signal.SIGKILL)
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            kill_session(proc)  # type: ignore[arg-type]
    assert proc.returncode == 1, err[-2000:]
    assert "rank 0 was killed by SIGKILL before rank 0 could report" in err, err[-2000:]
    assert "ddpdoctor bug" not in err
