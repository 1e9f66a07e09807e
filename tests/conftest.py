"""Markers that skip cleanly where the hardware or privileges do not exist, and the real checkpoints more
than one test folder reads (made once per session: a fixture imported into another folder's module would
be a second fixture, made a second time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import have_netns, made_by_example


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/fuzz/conftest.py: pytest takes options only from the first conftest it loads.
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="tests/fuzz: run many more generated inputs per test (deep local runs; see "
                     "docs/testing.md). DDPDOCTOR_FUZZ_EXAMPLES=N sets the examples per test directly.")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = None
    for item in items:
        if "requires_cuda" in item.keywords:
            if cuda is None:
                cuda = _cuda_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU (none on this machine)"))
        if "requires_netns" in item.keywords and not have_netns():
            item.add_marker(pytest.mark.skip(reason="needs root and iproute2 (ip, tc) for network namespaces"))


@pytest.fixture(scope="session")
def dcp_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DCP directories written by a real 2-rank gloo DDP job (examples/ckpt_make_dcp.py, via mp.spawn)."""
    return made_by_example("examples.ckpt_make_dcp", tmp_path_factory.mktemp("dcp"))


@pytest.fixture(scope="session")
def shard_sets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shard sets written by safetensors.torch.save_file and torch.save (examples/ckpt_make_shards.py)."""
    return made_by_example("examples.ckpt_make_shards", tmp_path_factory.mktemp("shards"))
