"""`ddpdoctor watch` under hostile and absurd input (issue #20): orphans, exit-code wording, garbage on the
side channel, absurd flags.

Everything is real: training scripts written to tmp_path and run by the real CLI as a subprocess, real
sleeper processes that escape into new sessions (``start_new_session=True``, a double-fork daemon), real
bytes on the channel's TCP socket, a real FIFO. Survivors are looked up with psutil by the pid the script
recorded; any found are killed in a ``finally`` so a failing test leaves nothing behind either.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import clean_env, run_cli

pytestmark = pytest.mark.slow

# A child in a new session (as a user's script starts a helper server, a log shipper, ...). Its pid goes to
# a file named after the rank, so the test can look for it after watch is gone.
SLEEPER = """\
import os, subprocess, sys, time
rank = int(os.environ.get("RANK", "0"))
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"sleeper_{rank}.pid")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
with open(out + ".tmp", "w") as handle:
    handle.write(str(child.pid))
os.replace(out + ".tmp", out)
"""

# fork, setsid, fork: the classic daemon; the grandchild's parent (the middle child) exits at once.
DAEMON = """\
import os, time
rank = int(os.environ.get("RANK", "0"))
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"sleeper_{rank}.pid")
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() == 0:
        with open(out + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(out + ".tmp", out)
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.waitpid(middle, 0)
"""


def _pids(folder: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(folder.glob("sleeper_*.pid"))]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _survivors(pids: list[int], wait_s: float = 10.0) -> list[int]:
    """Sleepers still alive after a bounded wait (killing and reaping takes a moment)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


@pytest.fixture()
def sleeper_cleanup(tmp_path: Path) -> Iterator[None]:
    """Whatever the test finds, no sleeper outlives it."""
    yield
    for pid in _pids(tmp_path):
        try:
            proc = psutil.Process(pid)
            if "time.sleep(300)" in " ".join(proc.cmdline()) or proc.ppid() in (1, os.getpid()):
                proc.kill()
        except psutil.Error:
            pass


def _watch(tmp_path: Path, source: str, nproc: int = 2, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(source)
    return run_cli(["watch", "--nproc", str(nproc), "--hang-timeout", "30", "--evidence", str(tmp_path / "evidence"),
                    "--json", str(tmp_path / "w.json"), str(script)], timeout=timeout, cwd=tmp_path)


# One job holds both kinds of escapee: rank 0 starts a child in a new session, rank 1 double-forks a daemon
# (a run that ends well, then one where rank 1 crashes). Each rank goes on once both escapees recorded their
# pids (at most 30 s), so the test always finds both, and the crash comes after both started.
BOTH = ('import os\nif int(os.environ.get("RANK", "0")) == 0:\n' + textwrap.indent(SLEEPER, "    ")
        + "else:\n" + textwrap.indent(DAEMON, "    ") + """\
import time
folder = os.path.dirname(os.path.abspath(__file__))
for _ in range(600):
    if all(os.path.exists(os.path.join(folder, f"sleeper_{r}.pid")) for r in (0, 1)):
        break
    time.sleep(0.05)
""")


@pytest.mark.usefixtures("sleeper_cleanup")
def test_a_new_session_child_and_a_daemon_are_left_running_and_listed_after_a_run_that_ends_well(
        tmp_path: Path) -> None:
    """Issue 27: after a successful run, what the script deliberately detached (an uploader in a session of
    its own, a double-forked daemon) is its business: left running, and named in the report (torchrun does
    not kill it either)."""
    proc = _watch(tmp_path, BOTH)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pids = _pids(tmp_path)
    assert len(pids) == 2, proc.stderr[-2000:]
    assert sorted(_survivors(pids, wait_s=2)) == sorted(pids), "a detached child was killed after a run that ended well"
    for pid in pids:
        assert re.search(rf"left running.*\bpid {pid}\b", proc.stderr, re.S), proc.stderr[-2000:]
    report = json.loads((tmp_path / "w.json").read_text())
    assert sorted(p["pid"] for p in report["teardown"]["left_running"]) == sorted(pids)
    sleeper = int((tmp_path / "sleeper_0.pid").read_text())  # rank 0's child; rank 1's daemon is a fork of the rank
    assert all("time.sleep(300)" in p["cmdline"] for p in report["teardown"]["left_running"] if p["pid"] == sleeper)


@pytest.mark.usefixtures("sleeper_cleanup")
def test_a_new_session_child_and_a_daemon_do_not_outlive_a_rank_crash(tmp_path: Path) -> None:
    proc = _watch(tmp_path, BOTH + "if rank == 1:\n    raise RuntimeError('boom on rank 1')\n")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "rank 1 raised RuntimeError: boom on rank 1" in proc.stderr
    pids = _pids(tmp_path)
    assert len(pids) == 2
    assert _survivors(pids) == [], "a start_new_session child or a double-forked daemon of a failed run outlived watch"


@pytest.mark.usefixtures("sleeper_cleanup")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_new_session_child_does_not_outlive_an_interrupted_watch(tmp_path: Path, sig: signal.Signals) -> None:
    script = tmp_path / "train.py"
    script.write_text(SLEEPER + "time.sleep(300)\n")
    cmd = [sys.executable, "-m", "ddpdoctor", "watch", "--nproc", "2", "--hang-timeout", "600", str(script)]
    watch = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                             cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while len(_pids(tmp_path)) < 2 and time.monotonic() < deadline and watch.poll() is None:
            time.sleep(0.1)
        assert len(_pids(tmp_path)) == 2, "the ranks never started their sleepers"
        watch.send_signal(sig)
        _out, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(timeout=30)
    assert watch.returncode == 128 + sig, err[-2000:]
    assert _survivors(_pids(tmp_path)) == [], f"a start_new_session child outlived a {sig.name}ed watch"


# -- the right words for a rank's failure ------------------------------------------------------------

# Rank 1 fails after the first barrier while rank 0 goes on into a second one, which then breaks (gloo:
# "Connection closed by peer") or, had the peer stayed, would hang: rank 1 is the one to name.
FAIL_ON_RANK1 = """\
import os, signal, sys
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    {how}
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize(("how", "words"), [
    ("sys.exit(3)", "rank 1 exited with code 3"),
    ("sys.exit(2)", "rank 1 exited with code 2"),
    # A plain sys.exit(1): the message's case below asserts the same words, then the message.
    ("os.kill(os.getpid(), signal.SIGKILL)", "rank 1 was killed by signal 9 (SIGKILL)"),
    ("sys.exit('no data in /data/shard1')", "rank 1 exited with code 1: no data in /data/shard1"),
    # An exception ddpdoctor explain knows (the CUDA caching allocator's message, raised by hand on this CPU
    # machine): its cause and fix come under the crash.
    ("raise __import__('torch').OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a "
     "total capacity of 79.15 GiB of which 1.06 GiB is free.')", "rank 1 raised OutOfMemoryError: CUDA out of memory"),
])
def test_a_failing_rank_is_named_first_with_its_exit_and_watch_exits_1(tmp_path: Path, how: str, words: str) -> None:
    report = tmp_path / "watch.json"
    script = tmp_path / "train.py"
    script.write_text(FAIL_ON_RANK1.format(how=how))
    proc = run_cli(["watch", "--nproc", "2", "--hang-timeout", "5", "--json", str(report),
                    "--evidence", str(tmp_path / "evidence"), str(script)], timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    headline = next(line for line in proc.stderr.splitlines() if line.startswith("ddpdoctor watch: "))
    assert words in headline, proc.stderr[-2000:]
    assert "rank 0" not in headline.split(words)[0], headline
    data = json.loads(report.read_text())
    assert data["status"] == "crash" and data["exit_code"] == 1
    assert data["crash_order"][0] == 1
    assert "Traceback" not in proc.stderr.split("ddpdoctor watch: ")[-1]
    if "OutOfMemoryError" in how:
        assert data["known_cause"]["id"] == "cuda-oom"
        assert "what that exception means (ddpdoctor explain: cuda-oom): CUDA out of memory on a rank" in proc.stderr
        assert "fix: Lower the per-rank batch size" in proc.stderr
    else:  # an exit code says nothing explain could add to
        assert data["known_cause"] is None and "what that exception means" not in proc.stderr


def test_every_rank_exiting_3_is_a_failed_run_not_our_bug_code(tmp_path: Path) -> None:
    proc = _watch(tmp_path, "import sys\nsys.exit(3)\n")
    assert proc.returncode == 1, proc.stderr[-2000:]
    headline = next(line for line in proc.stderr.splitlines() if line.startswith("ddpdoctor watch: "))
    # Each rank exits 3 on its own before any collective: neither followed the other.
    assert re.match(r"ddpdoctor watch: CRASH: rank ([01]) exited with code 3 first; rank [01] exited with the same "
                    r"code \(each rank ended so on its own, before any collective: not a consequence of rank \1's "
                    r"exit\)$", headline), headline


# -- garbage on the side channel ----------------------------------------------------------------------

GARBAGE = [
    b"not json at all",
    b'{"t": "beat", "progress": NaN}',
    b'{"t": "hello", "rank": Infinity}',
    b'{"t": "exit", "code": 1e400}',
    b'{"t": "hello", "rank": ' + b"9" * 5000 + b"}",
    b"[" * 100_000 + b"]" * 100_000,
    b'["t", "hello"]',
    b"42",
    b'"hello"',
    b"\xff\xfe\x00garbage",
    b'{"t": "hello", "rank": "zero"}',
    b'{"t": "hello"}',
    b'{"t": "init", "bind": true, "rank": 0, "claim": 7}',
    b'{"t": "rec", "recs": 5}',
    b'{"t": "beat"}',
    b'{"t": "exit", "code": "abc"}',
    b'{"t": "stack", "stack": 3}',
    b'{"t": "rec", "recs": [{"op": 1}]}',
    b"x" * (40 << 20),  # 40 MB without a newline, then one
]

# The script (rank 0) connects to the channel named in its environment and writes every kind of garbage,
# as a hello-less stranger and after claiming to be rank 5 (no such rank) and rank 0 itself.
CHANNEL_GARBAGE = """\
import os, socket, sys
host, port = os.environ["DDPDOCTOR_WATCH_CHANNEL"].rsplit(":", 1)
lines = {lines!r}
for hello in (b"", b'{{"t": "hello", "rank": 5}}\\n', b'{{"t": "hello", "rank": 0, "pid": 1}}\\n'):
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(hello)
        for line in lines:
            sock.sendall(line + b"\\n")
print("GARBAGE SENT", flush=True)
"""


def test_garbage_on_the_channel_is_ignored_and_the_run_is_still_reported(tmp_path: Path) -> None:
    report = tmp_path / "watch.json"
    script = tmp_path / "noisy.py"
    script.write_text(CHANNEL_GARBAGE.format(lines=GARBAGE))
    proc = run_cli(["watch", "--nproc", "1", "--hang-timeout", "30", "--json", str(report), str(script)],
                   timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GARBAGE SENT" in proc.stdout
    assert "Traceback" not in proc.stderr and "bug" not in proc.stderr.lower()
    data = json.loads(report.read_text())
    assert data["status"] == "ok" and [r["state"] for r in data["ranks"]] == ["exited"]
    assert "ignored" in proc.stderr and "malformed" in proc.stderr


def test_the_channel_server_skips_garbage_lines_and_still_hears_the_next_good_one() -> None:
    from ddpdoctor.watch.channel import Server

    server = Server("127.0.0.1", 0)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            for line in GARBAGE[:-1]:
                sock.sendall(line + b"\n")
            sock.sendall(b'{"t": "hello", "rank": 0, "pid": 7, "host": "h"}\n{"t": "beat", "progress": "x"}\n'
                         b'{"t": "exit", "code": 0, "crashed": false, "error": ""}\n')
            events: list[tuple[int, Any]] = []
            deadline = time.monotonic() + 20
            while len(events) < 2 and time.monotonic() < deadline:
                events += server.poll(0.1)
        assert [(rank, msg["t"]) for rank, msg in events[:2]] == [(0, "hello"), (0, "exit")]
        assert server.malformed >= len(GARBAGE) - 1
    finally:
        server.close()


# -- absurd flags: exit 2, one line, nothing started ---------------------------------------------------

def _no_rank_started(marker: str) -> bool:
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "ddpdoctor.watch.rank" in " ".join(proc.info["cmdline"] or []) and marker in " ".join(
                    proc.info["cmdline"] or []):
                return False
        except psutil.Error:
            continue
    return True


@pytest.mark.parametrize("flags", [
    ["--nproc", "0"], ["--nproc", "-1"], ["--nproc", "99999999999999999999999"], ["--nproc", "100000"],
])
def test_absurd_nproc_is_one_line_exit_2(tmp_path: Path, flags: list[str]) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('RAN')\n")
    proc = run_cli(["watch", *flags, str(script)], timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "--nproc" in proc.stderr, proc.stderr
    assert "RAN" not in proc.stdout


def test_a_script_that_is_not_a_readable_file_is_one_line_exit_2(tmp_path: Path) -> None:
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    (tmp_path / "folder.py").mkdir()
    for script, needle in ((str(fifo), "not a regular file"), (str(tmp_path / "folder.py"), "is a directory"),
                           (str(tmp_path / "absent.py"), "script not found")):
        proc = run_cli(["watch", "--nproc", "1", script], timeout=60, cwd=tmp_path)
        assert proc.returncode == 2, (script, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr
    empty = run_cli(["watch"], timeout=60)
    assert empty.returncode == 2 and "Traceback" not in empty.stderr
    assert _no_rank_started(str(tmp_path))
