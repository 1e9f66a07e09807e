"""The check engine behind ``ddpdoctor check``: what a check is, how every rank runs them, one report.

- :mod:`~ddpdoctor.check.api`: :class:`Check` (a pure unit returning findings), :class:`CheckContext`,
  :class:`CheckOptions`, and the helpers checks use to merge findings across ranks.
- :mod:`~ddpdoctor.check.runner`: one rank's run (join the control plane, rendezvous, initialise the process
  group under test, run each check under a deadline, post findings; rank 0 collects and names the silent).
- :mod:`~ddpdoctor.check.report`: the merged findings as one table or the JSON contract (pure functions).
- :mod:`~ddpdoctor.check.causes`: one cause, one finding: which finding explains which (``caused_by``).

The checks themselves live in :mod:`ddpdoctor.checks`, one file each.
"""

from __future__ import annotations

from ddpdoctor.check.api import Check, CheckContext, CheckOptions, all_findings, collapse
from ddpdoctor.check.causes import COLLECTIVE_FAILED, RULES, Rule, fold
from ddpdoctor.check.model import Report
from ddpdoctor.check.report import render_table
from ddpdoctor.check.runner import RankRun, RunConfig, run_rank

__all__ = ["COLLECTIVE_FAILED", "RULES", "Check", "CheckContext", "CheckOptions", "RankRun", "Report", "Rule",
           "RunConfig", "all_findings", "collapse", "fold", "render_table", "run_rank"]
