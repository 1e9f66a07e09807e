"""Fixtures shared by the ckpt tests: the example checkpoints, saved once from real wrappers, and the CLI.

The DCP folders and shard sets are in tests/conftest.py: tests/safety reads the same ones.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, made_by_example


@pytest.fixture(scope="session")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example checkpoints, saved once from real wrappers (a one-process gloo group)."""
    return made_by_example("examples.ckpt_make", tmp_path_factory.mktemp("ckpts"))


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


def tree_digest(path: Path) -> dict[str, str]:
    """Name -> SHA-256 of every file in a directory: a directory input is proved unchanged with it."""
    return {p.name: sha(p) for p in sorted(path.iterdir()) if p.is_file()}
