"""`stacks` and `stacks merge` under hostile input (issue 20): real FIFOs, crafted `--json` files and
registrations, and a real SIGTERM/SIGKILL while real py-spy runs. Every case here hung, exited 3 or left
py-spy behind before the fix; now each is one line and exit 2 (or no process left), fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from ddpdoctor.cli import main
from tests.support import REPO, clean_env, run_cli, started

# A hang in the code under test is a TimeoutExpired here, i.e. a test failure, not a stuck CI job.
HANG_S = 30


def _node(**process: Any) -> dict[str, Any]:
    """A `ddpdoctor stacks --json` document of one process (docs/stacks.md, "JSON output")."""
    proc = {"pid": 4242, "host": "node-a", "rank": 0, "local_rank": 0, "world_size": 2, "local_world_size": 2,
            "job": "j", "cmdline": "python train.py", "error": None,
            "threads": [{"thread_id": 1, "name": "MainThread", "main": True,
                         "frames": [{"function": "main", "file": "/w/train.py", "line": 5}]}]}
    proc.update(process)
    return {"tool": "ddpdoctor", "version": "0.1.0", "host": "node-a", "source": "py-spy", "processes": [proc]}


def _one_line_exit_2(res: subprocess.CompletedProcess[str], text: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr[-2000:])
    assert res.stderr.count("\n") == 1 and text in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_merge_of_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "node0.json"
    os.mkfifo(fifo)  # nobody ever writes to it: opening it for reading would block forever
    res = run_cli(["stacks", "merge", str(fifo)], timeout=HANG_S)
    _one_line_exit_2(res, "not a regular file")
    assert res.stdout == "" and stat.S_ISFIFO(os.stat(fifo).st_mode)  # no report; the FIFO is left as it was


@pytest.mark.parametrize("world", ["10000000", "1e7", "2000000"])
def test_merge_of_an_absurd_world_size_is_refused_at_once(tmp_path: Path, world: str) -> None:
    """A single-node file whose world size is ten million made the merge list every missing rank."""
    node = tmp_path / "node0.json"
    node.write_text(json.dumps(_node(world_size=7, local_world_size=7)).replace("7", world))
    res = run_cli(["stacks", "merge", str(node)], timeout=HANG_S)
    _one_line_exit_2(res, "world_size")
    assert res.stdout == "", res.stdout[:500]  # no report listing ten million missing ranks


@pytest.mark.parametrize(("field", "raw", "said"), [
    ("pid", "Infinity", "Infinity"),
    ("pid", "1e400", "1e400"),
    ("pid", "9" * 5000, "5000 digits"),
    ("pid", "1.5", "pid is 1.5"),
    ("pid", "-4", "pid is -4"),
    ("rank", '"0"', "rank is '0'"),
    ("rank", "-3", "rank is -3"),
    ("rank", "true", "rank is True"),
    ("local_rank", "2.0", "local_rank is 2.0"),
    ("thread_id", "1e400", "1e400"),
    ("line", "[1]", "line is [1]"),
])
def test_merge_of_bad_numbers_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 field: str, raw: str, said: str) -> None:
    text = json.dumps(_node())
    old = {"pid": '"pid": 4242', "rank": '"rank": 0', "local_rank": '"local_rank": 0',
           "thread_id": '"thread_id": 1', "line": '"line": 5'}[field]
    assert old in text
    node = tmp_path / "node0.json"
    node.write_text(text.replace(old, f'"{field}": {raw}'))
    assert main(["stacks", "merge", str(node)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and str(node) in err, err


def test_signal_mode_skips_a_fifo_and_a_registration_with_an_absurd_world_size(tmp_path: Path) -> None:
    """A FIFO among the registrations blocked the reader; a registration edited to say world size 10**7
    made the report list ten million missing ranks. Both are skipped as not ours to signal."""
    stack_dir = tmp_path / "stacks"
    stack_dir.mkdir()
    os.mkfifo(stack_dir / "rank0-pid1.json")
    code = ("import sys, time, ddpdoctor; ddpdoctor.install_stack_dumps(directory=sys.argv[1]); "
            "print('ready', flush=True); time.sleep(600)")
    with started([sys.executable, "-c", code, str(stack_dir)], tmp_path / "target.log") as target:
        [reg] = stack_dir.glob(f"rank*-pid{target.pid}.json")
        meta = json.loads(reg.read_text())
        meta.update(world_size=10**7, local_world_size=10**7, rank=0)
        reg.write_text(json.dumps(meta))
        res = run_cli(["stacks", "--signal", "--stack-dir", str(stack_dir), "--timeout", "2"], timeout=HANG_S)
        assert target.poll() is None, "the target was signalled although its registration is not trusted"
    _one_line_exit_2(res, "no live process registered")


def _py_spy_children(pid: int) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(pid).children() if c.name() == "py-spy"]
    except psutil.Error:
        return []


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # killed; only its reaper (init) has not run yet
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_py_spy_dies_with_a_killed_stacks(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM: `stacks` kills and reaps its py-spy before it exits (exit 143). SIGKILL (no handler can
    run): the kernel kills py-spy (PR_SET_PDEATHSIG). The py-spy caught running is frozen with SIGSTOP
    first, so it cannot finish on its own and hide a leak: before the fix it stayed behind every time."""
    # 200 sleeping threads: py-spy takes ~0.1 s to read them, time enough to see it running.
    code = ("import threading, time\n"
            "for _ in range(200): threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
            "print('ready', flush=True); time.sleep(600)")
    with started([sys.executable, "-c", code], tmp_path / "target.log") as target:
        caught: list[psutil.Process] = []
        for _attempt in range(10):  # py-spy may finish before we see it: try again, a bounded number of times
            stacks = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "stacks", "--pid", str(target.pid),
                                       "--timeout", "60"], env=clean_env(), cwd=REPO,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                deadline = time.monotonic() + HANG_S
                while not caught and stacks.poll() is None and time.monotonic() < deadline:
                    caught = _py_spy_children(stacks.pid)
                for child in caught:
                    child.send_signal(signal.SIGSTOP)
                if caught:
                    stacks.send_signal(sig)
                _out, err = stacks.communicate(timeout=HANG_S)
            finally:
                if stacks.poll() is None:
                    stacks.kill()
                    stacks.wait(timeout=HANG_S)
            if caught:
                break
        assert caught, "never saw py-spy running under `ddpdoctor stacks`"
        try:
            deadline = time.monotonic() + 10
            while not all(_gone(c) for c in caught) and time.monotonic() < deadline:
                time.sleep(0.02)
            left = [c.pid for c in caught if not _gone(c)]
            assert not left, f"py-spy {left} outlived `ddpdoctor stacks` killed by {sig.name}"
        finally:
            for child in caught:
                with contextlib.suppress(psutil.Error):
                    child.kill()
    if sig == signal.SIGTERM:
        assert stacks.returncode == 143 and "Traceback" not in err, (stacks.returncode, err)
        assert err.count("\n") == 1 and "SIGTERM" in err, err
    else:
        assert stacks.returncode == -signal.SIGKILL
