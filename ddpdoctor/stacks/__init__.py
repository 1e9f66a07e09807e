"""``ddpdoctor stacks``: every rank's Python stack on this machine, grouped; the rank somewhere else named.

- :mod:`~ddpdoctor.stacks.driver`: the ``stacks`` and ``stacks merge`` commands as functions of their options.
- :mod:`~ddpdoctor.stacks.engine`: find the ranks (torchrun/SLURM environment, through psutil) and read
  their stacks with ``py-spy dump``, one per rank, in parallel.
- :mod:`~ddpdoctor.stacks.procfs`: process liveness and start times (psutil), and what psutil lacks (CapEff).
- :mod:`~ddpdoctor.stacks.ident`: who a process is in a DDP job, from its environment.
- :mod:`~ddpdoctor.stacks.install`: :func:`install_stack_dumps`, the in-process fallback (faulthandler on a signal).
- :mod:`~ddpdoctor.stacks.signal_dumps`: ``--signal``: signal registered ranks and read their dumps.
- :mod:`~ddpdoctor.stacks.model`: processes, threads, frames, where each rank waits, the groups of a job.
- :mod:`~ddpdoctor.stacks.rendezvous`: a job stuck before its first collective: the ranks that never arrived, from the c10d store.
- :mod:`~ddpdoctor.stacks.report`: that as text and JSON, and JSON files read back (`stacks merge`).
"""

from __future__ import annotations

from ddpdoctor.stacks.driver import StacksOptions
from ddpdoctor.stacks.driver import merge as merge_stacks
from ddpdoctor.stacks.driver import run as run_stacks
from ddpdoctor.stacks.engine import discover, dump_all
from ddpdoctor.stacks.install import install_stack_dumps
from ddpdoctor.stacks.rendezvous import StoreView, read_store, store_text

__all__ = [
    "StacksOptions",
    "StoreView",
    "discover",
    "dump_all",
    "install_stack_dumps",
    "merge_stacks",
    "read_store",
    "run_stacks",
    "store_text",
]
