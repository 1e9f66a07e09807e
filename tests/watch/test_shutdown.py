"""`watch` ends a job the way torchrun does (issue 27): SIGTERM to the ranks, a grace period
(``--shutdown-timeout``, 30 s by default), then SIGKILL, and the report says which ranks needed SIGKILL.

The ranks are real: a script whose SIGTERM handler saves a 30 MB checkpoint over about 3 s (what a
training script does on a scheduler's preemption notice). Under the old 1.5 s grace it was cut at about
half; now the file must be complete, byte for byte.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import clean_env
from tests.watch.test_watch import leftovers

pytestmark = pytest.mark.slow

CHUNKS, CHUNK = 30, 1_000_000

SAVER = f"""\
import os, signal, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
target = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"ckpt_rank{{rank}}.bin")


def save_and_exit(signum, frame):
    # A checkpoint written in the SIGTERM handler, {CHUNKS} MB in about 3 s, then renamed into place.
    with open(target + ".partial", "wb") as handle:
        for i in range({CHUNKS}):
            handle.write(bytes([i]) * {CHUNK})
            handle.flush()
            time.sleep(0.1)
    os.replace(target + ".partial", target)
    sys.exit(0)


signal.signal(signal.SIGTERM, save_and_exit)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _start(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    cmd = [sys.executable, "-m", "ddpdoctor", "watch", "--nproc", "2", "--hang-timeout", "600", *options, str(script)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                            cwd=tmp_path)
    ready: set[str] = set()
    deadline = time.monotonic() + 180
    assert proc.stdout is not None
    while len(ready) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.strip().endswith("ready"):
            ready.add(line.split(":", 1)[0])
    if ready != {"[rank0]", "[rank1]"}:
        proc.kill()
        raise AssertionError(f"the ranks never said ready ({ready}); stderr:\n{proc.communicate(timeout=30)[1][-3000:]}")
    return proc


def _stop(proc: subprocess.Popen[str]) -> str:
    import signal

    proc.send_signal(signal.SIGTERM)
    try:
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return err


def _complete(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) == CHUNKS * CHUNK and all(data[i * CHUNK] == i and data[(i + 1) * CHUNK - 1] == i
                                               for i in range(CHUNKS))


def test_sigterm_gives_each_rank_the_grace_to_finish_saving(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    err = _stop(proc)
    assert proc.returncode == 143, err[-2000:]
    assert "watch interrupted (SIGTERM): SIGTERM to every rank; every process ended within the 30 s grace" in err
    for rank in (0, 1):
        assert _complete(tmp_path / f"ckpt_rank{rank}.bin"), f"rank {rank}'s checkpoint is not complete"
        assert not (tmp_path / f"ckpt_rank{rank}.bin.partial").exists()
    assert leftovers("saver.py") == []


def test_a_grace_shorter_than_the_save_ends_in_sigkill_and_says_which_ranks(tmp_path: Path) -> None:
    proc = _start(tmp_path, "--shutdown-timeout", "1")
    started = time.monotonic()
    err = _stop(proc)
    assert proc.returncode == 143, err[-2000:]
    assert "ranks 0-1 still ran after the 1 s grace (--shutdown-timeout) and needed SIGKILL" in err
    assert time.monotonic() - started < 30  # not the 3 s of saving times anything: SIGKILL cut it
    for rank in (0, 1):
        assert not (tmp_path / f"ckpt_rank{rank}.bin").exists()
        assert (tmp_path / f"ckpt_rank{rank}.bin.partial").stat().st_size < CHUNKS * CHUNK
    assert leftovers("saver.py") == []


def test_the_grace_comes_from_torchelastic_shutdown_timeout_as_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    env = clean_env({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "1"})
    proc = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "watch", "--nproc", "1", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and "ready" not in proc.stdout.readline():
        pass
    err = _stop(proc)
    assert "rank 0 still ran after the 1 s grace (--shutdown-timeout) and needed SIGKILL" in err, err[-2000:]


def test_a_verdict_ends_the_job_with_the_same_grace(tmp_path: Path) -> None:
    """No progress for --hang-timeout (the ranks only sleep): the verdict's teardown gives the handlers
    their grace as well, and the report says nobody needed SIGKILL."""
    import json

    from tests.support import run_cli
    from tests.watch.test_watch import HANG_TIMEOUT

    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    proc = run_cli(["watch", "--nproc", "2", "--hang-timeout", str(HANG_TIMEOUT), "--json", str(tmp_path / "w.json"),
                    "--evidence", str(tmp_path / "evidence"), str(script)], timeout=240, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = json.loads((tmp_path / "w.json").read_text())
    assert data["status"] == "hang" and data["stall"] is True
    assert data["teardown"]["sigkill_ranks"] == [] and data["teardown"]["grace_s"] == 30
    assert data["teardown"]["waited_s"] >= 2.5  # the handlers' 3 s of saving ran
    assert "needed SIGKILL" not in proc.stderr
    for rank in (0, 1):
        assert _complete(tmp_path / f"ckpt_rank{rank}.bin"), f"rank {rank}'s checkpoint is not complete"
    assert leftovers("saver.py") == []
