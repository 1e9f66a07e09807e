"""Markers that skip cleanly where the hardware or privileges do not exist."""

from __future__ import annotations

import pytest

from tests.support import have_netns


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
