"""Real inputs for the data-safety tests, and what "unchanged" means for a user's folder.

Inputs are made by the real writers once per session: a checkpoint by ``torch.save``, a Flight Recorder
dump by PyTorch itself (a one-rank gloo job, ``_dump_fr_trace``), a stacks document by ``ddpdoctor stacks``
with py-spy on a real blocked process. Each test copies them into a fresh workspace.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from examples.ckpt_models import make_mlp
from tests.support import BLOCKED_TARGET, REPO, clean_env, run_cli, started

# A one-rank gloo job that records one all_reduce and writes PyTorch's own dump of it.
_FR_JOB = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
from ddpdoctor.fr.dump import write_dump
write_dump(sys.argv[1], 0)
dist.destroy_process_group()
"""

# Another user, for the ownership and planting cases (they need root to act as it; no such account is needed).
OTHER_UID = 1234

MODEL_PY = f"""import sys
sys.path.insert(0, {str(REPO)!r})
from examples.ckpt_models import make_mlp


def make():
    return make_mlp()
"""


@pytest.fixture(scope="session")
def originals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every kind of input a command reads, made by the tools that really write them."""
    base = tmp_path_factory.mktemp("originals")
    torch.save({"epoch": 3, "net": {f"module.{k}": v for k, v in make_mlp().state_dict().items()}}, base / "ddp.pt")
    (base / "train.log").write_text("[rank1]: torch.distributed.DistBackendError: NCCL error in: "
                                    "ProcessGroupNCCL.cpp:1970, unhandled system error\n")
    (base / "model.py").write_text(MODEL_PY)
    (base / "script.py").write_text("print('the watched script ran')\n")
    (base / "dumps").mkdir()
    env = clean_env({"TORCH_FR_BUFFER_SIZE": "2000"})
    subprocess.run([sys.executable, "-c", _FR_JOB, str(base / "dumps"), str(base / "store")], cwd=REPO, env=env,
                   check=True, timeout=180, capture_output=True)
    (base / "store").unlink(missing_ok=True)
    assert (base / "dumps" / "nccl_trace_rank_0").is_file()
    with started([sys.executable, str(BLOCKED_TARGET)], base / "target.log") as proc:
        res = run_cli(["stacks", "--pid", str(proc.pid), "--json", str(base / "node.json")], timeout=120)
    assert res.returncode == 0, res.stderr
    (base / "target.log").unlink()
    yield base


@pytest.fixture
def workspace(originals: Path, tmp_path: Path) -> Path:
    """A user's folder: the inputs, and files of the user's own that no command may touch."""
    ws = tmp_path / "ws"
    shutil.copytree(originals, ws, symlinks=True)
    (ws / "reg").mkdir(mode=0o700)  # a stack-dump folder with one (stale) registration
    (ws / "reg" / "rank0-pid1.json").write_text('{"pid": 1, "signal": 10, "stack_file": "x"}\n')
    (ws / "user.json").write_text('{"mine": true}\n')
    torch.save({"x": torch.ones(2)}, ws / "user.pt")
    _plain_png(ws / "user.png")
    (ws / "module.py").write_text("def f():\n    return 1\n")
    (ws / "userdir").mkdir()
    (ws / "userdir" / "keep.txt").write_text("mine\n")
    return ws


def _plain_png(path: Path) -> None:
    """A PNG the user made (no ddpdoctor mark in it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [1, 0])
    fig.savefig(path, format="png")
    plt.close(fig)


def snapshot(folder: Path) -> dict[str, Any]:
    """Everything a user would notice about each entry: bytes (SHA-256), link target, owner, group, mode,
    mtime and inode (a replaced file is a new inode even with the same bytes)."""
    found: dict[str, Any] = {}
    for path in sorted([folder, *folder.rglob("*")]):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            what: Any = ("link", os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            what = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            what = ("dir" if stat.S_ISDIR(st.st_mode) else "other",)
        mtime = None if stat.S_ISDIR(st.st_mode) else st.st_mtime_ns  # a folder's mtime moves with any entry
        found[str(path.relative_to(folder))] = (what, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), mtime,
                                                st.st_ino)
    return found


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A world-writable sticky folder outside pytest's private temp dir, as /tmp is (other users need it)."""
    folder = Path(tempfile.mkdtemp(prefix="ddpdoctor-shared-tmp-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_user(uid: int, action: Callable[[], int | None]) -> int:
    """Run ``action()`` in a forked child that has become ``uid`` (real and effective, no groups); the
    child's exit code: what ``action`` returned (None: 0), 3 if it raised. Only modules already imported
    may be used there: the interpreter's own folder may be closed to ``uid``."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            code = int(action() or 0)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def no_ranks_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard, not a stand-in: the slip must be refused before ranks would start, so starting them fails
    the test (no process is started). The launcher variables of the test's own environment are dropped."""
    import ddpdoctor.runtime.entry as entry
    import ddpdoctor.watch as watch

    def started(*_args: Any, **_kwargs: Any) -> int:
        raise AssertionError("ranks would have started: the slip was not refused before any work")

    monkeypatch.setattr(entry, "run_here_or_self_launch", started)
    monkeypatch.setattr(watch, "supervise", started)
    monkeypatch.setattr(watch, "run_under_launcher", started)
    kept = clean_env()
    for name in [n for n in os.environ if n not in kept]:
        monkeypatch.delenv(name)


def run_main(argv: list[str], cwd: Path | None, monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``ddpdoctor ARGV`` in-process through the console entry point (the installed command's code path),
    in ``cwd`` (default: the repository), stdin not a terminal; (exit code, stderr)."""
    from ddpdoctor.cli import main

    capsys.readouterr()
    monkeypatch.chdir(cwd or REPO)
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # noqa: SIM115 - closed by pytest's teardown
    code = main(argv)
    return code, capsys.readouterr().err
