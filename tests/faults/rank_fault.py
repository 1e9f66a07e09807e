"""A torchrun entry point that runs `ddpdoctor check` on every rank but injects a real fault on one.

Usage: torchrun ... tests/faults/rank_fault.py FAULT FAULT_RANK -- <ddpdoctor check args>

FAULT is one of:
  sleep            the rank never starts the doctor: it sleeps (as a rank stuck in data loading would)
  kill-in-check    the rank joins, enters the connectivity check, reaches its first collective, then is
                   killed with SIGKILL by its own hand (a real SIGKILL, as the OOM killer would deliver)
  env:NAME=VALUE   the rank runs with a different value of one environment variable
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time


def main() -> None:
    fault, fault_rank = sys.argv[1], int(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1:]
    mine = int(os.environ["RANK"]) == fault_rank
    if mine and fault == "sleep":
        time.sleep(600)
        return
    if mine and fault.startswith("env:"):
        name, _, value = fault[4:].partition("=")
        os.environ[name] = value
    if mine and fault == "kill-in-check":
        import ddpdoctor.checks as registry
        from ddpdoctor.check import CheckContext

        def die_inside(ctx: CheckContext) -> list:  # type: ignore[type-arg]
            import torch.distributed as dist

            dist.barrier()  # the peers now wait in the real connectivity check's collectives
            os.kill(os.getpid(), signal.SIGKILL)
            return []

        registry.ALL_CHECKS = tuple(
            dataclasses.replace(c, run=die_inside) if c.id == "connectivity" else c for c in registry.ALL_CHECKS)
    from ddpdoctor.cli import main as cli_main

    sys.exit(cli_main(args))


if __name__ == "__main__":
    main()
