"""``ddpdoctor watch``: run an unmodified training script on N ranks, record its collectives, explain a hang.

- :mod:`~ddpdoctor.watch.supervisor`: self-launch and watch the ranks, or the rank-0 aggregator under torchrun.
- :mod:`~ddpdoctor.watch.rank`: one watched rank (``python -m ddpdoctor.watch.rank script.py args``): the entry.
- :mod:`~ddpdoctor.watch.watchdog`: the thread in every watched process that reports to the supervisor.
- :mod:`~ddpdoctor.watch.script`: running the user's script as ``__main__`` (a rank's whole life) and how it ended.
- :mod:`~ddpdoctor.watch.recorder`: wraps ``torch.distributed``'s collectives and records each call.
- :mod:`~ddpdoctor.watch.channel`: the side channel (JSON lines over TCP) the ranks report on.
- :mod:`~ddpdoctor.watch.aggregate`: the supervisor's picture: progress, mismatches, hangs, first divergence.
- :mod:`~ddpdoctor.watch.state`: what it knows of each rank and of each process not bound to a rank yet.
- :mod:`~ddpdoctor.watch.claims`: contradicting ``init_process_group`` claims, and the straggler every rank waits for.
- :mod:`~ddpdoctor.watch.verdict`: which failure it was, by evidence: a host lost, a link cut, a crash, a desync
  (and a cut-off host's own verdict); ranks grouped by host.
- :mod:`~ddpdoctor.watch.progress`: in each rank, what completed and what is still in flight (the hang clock).
- :mod:`~ddpdoctor.watch.waits`: where a rank waits at a hang, in words (collective, GPU, DataLoader, lock, I/O, own code).
- :mod:`~ddpdoctor.watch.output`: the ranks' stdout/stderr as whole, prefixed lines; torchrun's log options.
- :mod:`~ddpdoctor.watch.reaper`: the job's processes, and its torchrun-style shutdown.
- :mod:`~ddpdoctor.watch.config`: the options of one watched run.
- :mod:`~ddpdoctor.watch.pitfalls`: training-loop pitfalls (no DistributedSampler, no ``set_epoch``, ...).
- :mod:`~ddpdoctor.watch.report`: the outcome as text.
- :mod:`~ddpdoctor.watch.spawned`: scripts that start their own ranks (mp.spawn): recognised, run once, every
  process watched.
- :mod:`~ddpdoctor.watch.evidence`: the evidence bundle of a failed run (stacks, histories, Flight Recorder
  dumps ``flight_recorder/fr_rank_<N>``, env, verdict).
"""

from __future__ import annotations

from ddpdoctor.watch.config import MIN_HANG_TIMEOUT_S, WatchConfig, shutdown_timeout_s
from ddpdoctor.watch.evidence import validate as validate_evidence
from ddpdoctor.watch.output import OutputOptions, parse_ranks_filter, parse_std
from ddpdoctor.watch.spawned import spawn_sites
from ddpdoctor.watch.supervisor import check_script, run_under_launcher, supervise

__all__ = [
    "MIN_HANG_TIMEOUT_S",
    "OutputOptions",
    "WatchConfig",
    "check_script",
    "parse_ranks_filter",
    "parse_std",
    "run_under_launcher",
    "shutdown_timeout_s",
    "spawn_sites",
    "supervise",
    "validate_evidence",
]
