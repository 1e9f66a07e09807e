"""``ddpdoctor ras``: ask NCCL's RAS service (NCCL >= 2.24) which ranks are dead, unresponsive or behind.

NCCL starts a RAS thread in every process; each listens on ``NCCL_RAS_ADDR`` (default ``localhost:28028``)
for a text protocol (``CLIENT PROTOCOL 2``, ``TIMEOUT n``, ``SET FORMAT json`` from NCCL 2.28.7,
``STATUS``/``VERBOSE STATUS``) and answers with the whole job's view, gathered over its own TCP network,
so it still answers while NCCL's collectives are hung. Source: NVIDIA/nccl ``src/ras/client.cc``,
``src/ras/client_support.cc`` and ``docs/userguide/source/troubleshooting/ras.rst``.

- :mod:`~ddpdoctor.ras.client`: the protocol, every socket operation under one deadline.
- :mod:`~ddpdoctor.ras.parse`: its JSON and text status outputs as one :class:`RasStatus`.
- :mod:`~ddpdoctor.ras.verdict`: dead/unresponsive ranks mapped to global ranks, per-communicator
  operation counts, as text and JSON.
"""

from __future__ import annotations

from ddpdoctor.ras.client import (
                                  DEFAULT_ADDR,
                                  NotRas,
                                  RasError,
                                  RasReply,
                                  RasTimeout,
                                  RasUnavailable,
                                  RasUnresolvable,
                                  parse_addr,
                                  query,
                                  ras_addr_from_env,
)
from ddpdoctor.ras.parse import RasStatus, parse_json, parse_reply, parse_text
from ddpdoctor.ras.verdict import PROBLEM, RasVerdict, ask, judge, probe, render_text, to_json

__all__ = [
                                  "DEFAULT_ADDR",
                                  "PROBLEM",
                                  "NotRas",
                                  "RasError",
                                  "RasReply",
                                  "RasStatus",
                                  "RasTimeout",
                                  "RasUnavailable",
                                  "RasUnresolvable",
                                  "RasVerdict",
                                  "ask",
                                  "judge",
                                  "parse_addr",
                                  "parse_json",
                                  "parse_reply",
                                  "parse_text",
                                  "probe",
                                  "query",
                                  "ras_addr_from_env",
                                  "render_text",
                                  "to_json",
]
