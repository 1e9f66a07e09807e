"""The stack-dump registry is private: another user's planted files are never trusted (issue 27, item 6).

Reproduced for real: an ordinary user (uid 1234, a forked child that called ``setuid``) pre-creates the
folder root's ranks and ``stacks --signal`` would use, with a registration aiming SIGUSR1 at a root process
of their choosing and symlinks aiming a rank's dump at a root-owned file. A pid whose owner or start time
does not match its registration, or whose registration has no start time, is never signalled. The shared
temp folder is a fresh sticky 1777 folder per test (``TMPDIR``), never the machine's /tmp.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.safety.conftest import OTHER_UID, as_user
from tests.support import REPO, clean_env, run_cli

ATTACKER = OTHER_UID
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="planting as another user needs root")

# A rank that registers for stack dumps when told to (after the test planted what it plants), then sleeps.
_RANK = """
import sys, time, ddpdoctor
from ddpdoctor.errors import DoctorError
sys.stdin.readline()
try:
    print("registered", ddpdoctor.install_stack_dumps(), flush=True)
except DoctorError as exc:
    print("refused", exc, flush=True)
time.sleep(600)
"""


def _env(shared_tmp: Path, **extra: str) -> dict[str, str]:
    env = clean_env({"TMPDIR": str(shared_tmp), **extra})
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("DDPDOCTOR_STACK_DIR", None)
    env.update(extra)
    return env


@pytest.fixture
def root_sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """The root process the attacker wants signalled (the issue's `sleep 600`, killed by SIGUSR1)."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def _registration(pid: int, stack_file: str) -> dict[str, object]:
    return {"pid": pid, "signal": int(signal.SIGUSR1), "rank": 0, "world_size": 1, "stack_file": stack_file,
            "create_time": psutil.Process(pid).create_time(), "host": "node", "cmdline": "train.py"}


def test_a_registry_folder_planted_by_another_user_is_refused_and_nothing_is_signalled(
        shared_tmp: Path, root_sleeper: subprocess.Popen[bytes]) -> None:
    planted = shared_tmp / "ddpdoctor-stacks-0"
    aimed = json.dumps(_registration(root_sleeper.pid, str(planted / "x.txt")))  # its true start time, even

    def plant() -> None:
        planted.mkdir(mode=0o777)
        planted.chmod(0o777)
        (planted / f"rank0-pid{root_sleeper.pid}.json").write_text(aimed)

    assert as_user(ATTACKER, plant) == 0, "the attacker's planting failed"
    res = run_cli(["stacks", "--signal", "--timeout", "2"], env=_env(shared_tmp), cwd=REPO, timeout=120)
    assert res.returncode == 2, res.stderr
    assert f"belongs to uid {ATTACKER}" in res.stderr and "planted" in res.stderr
    assert res.stderr.count("\n") == 1
    time.sleep(0.2)
    assert root_sleeper.poll() is None, "the planted registration got a root process signalled"


def test_a_registry_folder_of_ours_that_others_can_write_is_refused(shared_tmp: Path) -> None:
    folder = shared_tmp / "ddpdoctor-stacks-0"
    folder.mkdir()
    folder.chmod(0o733)
    res = run_cli(["stacks", "--signal", "--timeout", "2"], env=_env(shared_tmp), cwd=REPO, timeout=120)
    assert res.returncode == 2 and "mode 0733" in res.stderr and "chmod 700" in res.stderr, res.stderr


def _start_rank(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _RANK], cwd=REPO, env=env, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _register(rank: subprocess.Popen[str]) -> str:
    assert rank.stdin is not None and rank.stdout is not None
    rank.stdin.write("go\n")
    rank.stdin.flush()
    return rank.stdout.readline()


def _stop(rank: subprocess.Popen[str]) -> None:
    rank.kill()
    rank.communicate(timeout=60)


def test_planted_symlinks_never_make_a_root_rank_append_to_a_file_of_the_attackers_choosing(
        shared_tmp: Path, tmp_path: Path) -> None:
    victim = tmp_path / "root_owned.conf"
    victim.write_text("root's configuration\n")
    planted = shared_tmp / "ddpdoctor-stacks-0"
    rank = _start_rank(_env(shared_tmp))
    try:
        def plant() -> None:
            planted.mkdir(mode=0o777)
            planted.chmod(0o777)
            (planted / f"rankx-pid{rank.pid}.txt").symlink_to(victim)  # no RANK: "x"

        assert as_user(ATTACKER, plant) == 0, "the attacker's planting failed"
        said = _register(rank)
    finally:
        _stop(rank)
    assert said.startswith("refused") and f"belongs to uid {ATTACKER}" in said, said
    assert victim.read_text() == "root's configuration\n"
    # In our own private folder, a link under the name (left by anyone) is not followed either.
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    rank = _start_rank(_env(shared_tmp, DDPDOCTOR_STACK_DIR=str(own)))
    try:
        (own / f"rankx-pid{rank.pid}.txt").symlink_to(victim)
        said = _register(rank)
    finally:
        _stop(rank)
    assert said.startswith("refused") and "never followed" in said, said
    assert victim.read_text() == "root's configuration\n"


def test_the_default_registry_is_private_and_another_users_runtime_dir_is_not_used(shared_tmp: Path,
                                                                                     tmp_path: Path) -> None:
    """`sudo -E` keeps the user's XDG_RUNTIME_DIR: root must not put its registry where that user can swap it."""
    theirs = tmp_path / "run-user-1234"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, ATTACKER, ATTACKER)
    rank = _start_rank(_env(shared_tmp, XDG_RUNTIME_DIR=str(theirs)))
    try:
        said = _register(rank)
    finally:
        _stop(rank)
    assert said.startswith("registered"), said
    folder = shared_tmp / "ddpdoctor-stacks-0"
    assert Path(said.split()[1]).parent == folder and list(theirs.iterdir()) == []
    st = folder.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    # Our own runtime dir (0700, ours) is preferred, and `stacks --signal` finds the rank there.
    mine = tmp_path / "run-user-0"
    mine.mkdir(mode=0o700)
    env = _env(shared_tmp, XDG_RUNTIME_DIR=str(mine))
    rank = _start_rank(env)
    try:
        said = _register(rank)
        assert Path(said.split()[1]).parent == mine / "ddpdoctor-stacks", said
        assert (mine / "ddpdoctor-stacks").stat().st_mode & 0o777 == 0o700
        res = run_cli(["stacks", "--signal", "--pid", str(rank.pid), "--timeout", "20"], env=env, cwd=REPO,
                      timeout=120)
        assert res.returncode in (0, 1) and "(stacks by signal)" in res.stdout, res.stderr
        assert "time.sleep(600)" in res.stdout or "<module>" in res.stdout
        assert rank.poll() is None
    finally:
        _stop(rank)


def test_a_pid_is_signalled_only_when_owner_and_start_time_match(shared_tmp: Path, tmp_path: Path) -> None:
    """A registration for another user's process, for a reused pid, or without a start time: no signal."""
    folder = tmp_path / "reg"
    folder.mkdir(mode=0o700)
    theirs = subprocess.Popen(["sleep", "600"], user=ATTACKER, group=ATTACKER)
    mine = subprocess.Popen(["sleep", "600"])
    try:
        (folder / f"rank0-pid{theirs.pid}.json").write_text(json.dumps(_registration(theirs.pid, "x")))
        reused = _registration(mine.pid, "x")
        reused["create_time"] = float(reused["create_time"]) - 3600  # registered by an older process
        (folder / f"rank1-pid{mine.pid}.json").write_text(json.dumps(reused))
        res = run_cli(["stacks", "--signal", "--stack-dir", str(folder), "--timeout", "2"], env=_env(shared_tmp),
                      cwd=REPO, timeout=120)
        assert res.returncode == 2 and "no live process registered" in res.stderr, res.stderr
        no_start = _registration(mine.pid, "x")
        no_start["create_time"] = None  # what a rank without psutil wrote
        (folder / f"rank1-pid{mine.pid}.json").write_text(json.dumps(no_start))
        res = run_cli(["stacks", "--signal", "--stack-dir", str(folder), "--timeout", "2", "--json", "-"],
                      env=_env(shared_tmp), cwd=REPO, timeout=120)
        doc = json.loads(res.stdout)
        [proc] = doc["processes"]
        assert proc["pid"] == mine.pid and "not signalled" in proc["error"], proc
        time.sleep(0.2)
        assert theirs.poll() is None and mine.poll() is None, "a process was signalled"
    finally:
        for proc in (theirs, mine):
            proc.kill()
            proc.wait()
