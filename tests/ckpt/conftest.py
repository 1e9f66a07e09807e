"""Fixtures shared by the ckpt tests: the example checkpoints, saved once from real wrappers, and the CLI."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, clean_env


def _made_by(module: str, out: Path) -> Path:
    """Run an example that writes real checkpoints into ``out`` (bounded: a stuck save fails the test)."""
    subprocess.run([sys.executable, "-m", module, str(out)], cwd=REPO, env=clean_env(),
                   check=True, timeout=300, capture_output=True)
    return out


@pytest.fixture(scope="session")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example checkpoints, saved once from real wrappers (a one-process gloo group)."""
    return _made_by("examples.ckpt_make", tmp_path_factory.mktemp("ckpts"))


@pytest.fixture(name="cli")
def cli_fixture(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run ``ddpdoctor ARGS`` in-process through ``cli.main`` (the console entry point).

    Same code path as the installed command, without paying torch's import per call; the tests marked
    "subprocess" below run the real ``python -m ddpdoctor``.
    """
    from ddpdoctor.cli import main

    monkeypatch.chdir(REPO)

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = main(args)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def sha(path: Path) -> str:
    """The file's SHA-256: inputs are compared before and after to prove they were never written."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def dcp_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DCP directories written by a real 2-rank gloo DDP job (examples/ckpt_make_dcp.py, via mp.spawn)."""
    return _made_by("examples.ckpt_make_dcp", tmp_path_factory.mktemp("dcp"))


@pytest.fixture(scope="session")
def shard_sets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shard sets written by safetensors.torch.save_file and torch.save (examples/ckpt_make_shards.py)."""
    return _made_by("examples.ckpt_make_shards", tmp_path_factory.mktemp("shards"))


def tree_digest(path: Path) -> dict[str, str]:
    """Name -> SHA-256 of every file in a directory: a directory input is proved unchanged with it."""
    return {p.name: sha(p) for p in sorted(path.iterdir()) if p.is_file()}
