"""A torchrun entry point that runs `ddpdoctor check` on every rank but injects a real fault on one.

Usage: torchrun ... tests/faults/rank_fault.py FAULT FAULT_RANK -- <ddpdoctor check args>

FAULT is one of:
  sleep            the rank never starts the doctor: it sleeps (as a rank stuck in data loading would)
  kill-in-check    the rank joins, enters the connectivity check, reaches its first collective, then is
                   killed with SIGKILL by its own hand (a real SIGKILL, as the OOM killer would deliver)
  env:NAME=VALUE   the rank runs with a different value of one environment variable
  throttle         the rank runs, but only 2 ms of every 10 ms: a helper process stops and continues it
                   with SIGSTOP/SIGCONT, which is what a CFS CPU quota (cgroup v2 ``cpu.max 2000 10000``,
                   ``docker run --cpus 0.2 --cpu-period 10000``) does to a process that wants more. The
                   period is short so that even a 1 MiB exchange of a few ms is cut, as it is by a quota
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time

THROTTLER = """
import os, signal, sys, time
pid, run_s, period_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
try:
    os.nice(-10)  # as root: wake on time even on a loaded machine (else the stops just get longer)
except OSError:
    pass
end = time.monotonic() + 300  # never outlive a test
try:
    while time.monotonic() < end:
        time.sleep(run_s)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(period_s - run_s)
        os.kill(pid, signal.SIGCONT)
except ProcessLookupError:  # the rank is gone: so is the reason to run
    pass
finally:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
"""


def _throttle_me(run_s: float = 0.002, period_s: float = 0.01) -> None:
    """Start the helper that lets this process run ``run_s`` of every ``period_s`` (a real CPU quota's effect)."""
    import subprocess

    subprocess.Popen([sys.executable, "-c", THROTTLER, str(os.getpid()), str(run_s), str(period_s)],
                     start_new_session=False)


def main() -> None:
    fault, fault_rank = sys.argv[1], int(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1:]
    mine = int(os.environ["RANK"]) == fault_rank
    if mine and fault == "sleep":
        time.sleep(600)
        return
    if mine and fault == "throttle":
        _throttle_me()
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
