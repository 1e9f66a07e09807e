"""``ddpdoctor fr``: PyTorch Flight Recorder dumps read safely; which rank diverged, in which collective, where.

- :mod:`~ddpdoctor.fr.load`: find the dump files, the rank from each name, read pickles with an unpickler
  that admits no Python global (nothing in a file runs) and JSON dumps; every dump version from 1.x on.
- :mod:`~ddpdoctor.fr.model`: calls interned once, each rank's history per group as an array (flat memory).
- :mod:`~ddpdoctor.fr.analyze`: per process group, the window every rank still holds, the first
  divergence (a mismatch, different tensors, a rank that never issued a collective, unmatched p2p).
- :mod:`~ddpdoctor.fr.report`: text and JSON. :mod:`~ddpdoctor.fr.driver`: the command.
- :mod:`~ddpdoctor.fr.dump`: inside a rank, write its dump (:func:`write_dump`; the only torch import).

Never imports torch: it runs on a login node after the job is gone.
"""

from __future__ import annotations

from ddpdoctor.fr.driver import FrOptions, diagnose
from ddpdoctor.fr.driver import run as run_fr
from ddpdoctor.fr.dump import ENABLE_ENV, dump_name, write_dump
from ddpdoctor.fr.model import FrReport
from ddpdoctor.fr.report import render_text, to_json

__all__ = ["ENABLE_ENV", "FrOptions", "FrReport", "diagnose", "dump_name", "render_text", "run_fr", "to_json",
           "write_dump"]
