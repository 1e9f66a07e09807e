"""Prints the real-log corpus score (tests/explain/test_real_logs.py) at the end of every pytest run."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    from tests.explain.test_real_logs import SUMMARY_KEY

    summary = config.stash.get(SUMMARY_KEY, None)
    if summary:
        terminalreporter.write_sep("-", "ddpdoctor explain on real logs")
        terminalreporter.write_line(summary)
