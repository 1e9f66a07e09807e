"""Output files: atomic always, fsynced when the rename replaces a file (the one case where data can be lost).

The policy itself (what may be replaced, aliases, modes, partial files) is tested in tests/safety/.

os.fsync is wrapped to record which files it was called on (the real fsync still runs): a power loss
cannot be produced here, and what was fsynced is the only thing that decides what survives one.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ddpdoctor import outputs
from ddpdoctor.ckpt import strip_file
from ddpdoctor.errors import DoctorError
from tests.support import clean_env


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Paths (or directories) fsynced while the test runs, in order."""
    calls: list[str] = []
    real = os.fsync

    def recording_fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        calls.append("dir:" + target if stat.S_ISDIR(os.fstat(fd).st_mode) else target)
        real(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    yield calls


def test_a_new_file_is_renamed_into_place_without_fsync(tmp_path: Path, fsynced: list[str]) -> None:
    target = tmp_path / "report.json"
    outputs.write_json(target, {"status": "pass"}, "check")
    assert target.read_text() == '{\n  "tool": "ddpdoctor",\n  "command": "check",\n  "status": "pass"\n}\n'
    assert fsynced == []
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_replacing_a_file_fsyncs_the_data_then_the_directory(tmp_path: Path, fsynced: list[str]) -> None:
    target = tmp_path / "report.json"
    outputs.write_json(target, {"status": "pass"}, "check")
    outputs.write_json(target, {"status": "fail"}, "check")
    assert '"fail"' in target.read_text()
    assert len(fsynced) == 2
    assert Path(fsynced[0]).name.endswith(outputs.PARTIAL_SUFFIX)  # the temp file, before the rename
    assert fsynced[1] == f"dir:{tmp_path}"


def test_strip_in_place_makes_the_replaced_checkpoint_durable(tmp_path: Path, fsynced: list[str]) -> None:
    """--in-place replaces the user's only copy: it must be on disk before the old one is gone."""
    path = tmp_path / "ddp.pt"
    torch.save({"module.w": torch.arange(6.0)}, path)
    strip_file(path, None, in_place=True)
    assert list(torch.load(path, weights_only=True)) == ["w"]
    assert [Path(p).name.endswith(outputs.PARTIAL_SUFFIX) for p in fsynced] == [True, False]


def test_a_failed_write_leaves_neither_target_nor_temp_file(tmp_path: Path) -> None:
    target = outputs.resolve("-o", tmp_path / "out.bin", outputs.TORCH_FILE)
    with pytest.raises(RuntimeError), outputs.atomic_output(target) as fh:
        fh.write(b"half")
        raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_a_json_report_that_cannot_be_written_is_one_line_exit_2(tmp_path: Path) -> None:
    """A file-size limit (as a full disk or a quota would) stops the write for real: no traceback, no file."""
    target = tmp_path / "env.json"
    probe = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))\n"
        "from ddpdoctor.cli import main\n"
        f"sys.exit(main(['env', '--no-torch', '--json', {str(target)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env=clean_env())
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "cannot write" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == [], "neither the report nor a temp file is left behind"


def test_an_output_that_became_a_fifo_after_the_check_is_not_replaced(tmp_path: Path) -> None:
    # The plan runs before the work; a FIFO created under the name meanwhile must survive.
    target = outputs.resolve("--json", tmp_path / "report.json", outputs.JSON, command="env")
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    with pytest.raises(DoctorError, match="not a regular file"), outputs.atomic_output(target) as fh:
        fh.write(b"{}")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
