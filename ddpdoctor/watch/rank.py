"""One watched rank: patch torch.distributed, start the watchdog thread, run the user's script unchanged.

The self-launched ranks start as ``python -m ddpdoctor.watch.rank script.py args...``; under torchrun
``ddpdoctor watch`` calls :func:`run_script` in each rank. The script runs as ``__main__`` with its own
``sys.argv`` and its directory first on ``sys.path``, exactly as ``python script.py`` would run it. A
script that starts its own ranks runs here too, as their launcher (:mod:`~ddpdoctor.watch.spawned`).

This module is the top of the in-rank layers: recorder <- watchdog <- script <- spawned <- rank.
"""

from __future__ import annotations

import os
import sys
import time

from ddpdoctor.watch import pitfalls as pitfall_hooks
from ddpdoctor.watch import recorder as recording
from ddpdoctor.watch.channel import ADDR_ENV
from ddpdoctor.watch.script import enter, execute
from ddpdoctor.watch.spawned import run_launcher
from ddpdoctor.watch.watchdog import EXIT_ON_LOST_ENV, Watchdog, enable_flight_recorder

# "spawn": the script starts its own ranks (mp.spawn, a Process per rank); this process is its launcher.
MODE_ENV = "DDPDOCTOR_WATCH_MODE"


def run_script(script: str, args: list[str], rank: int, world_size: int, address: str,
               exit_on_lost: bool) -> int:
    """Run ``script args`` watched in this process; returns its exit code."""
    enable_flight_recorder()
    recorder = recording.install(rank, world_size)
    pitfalls = pitfall_hooks.install(recorder)
    dog = Watchdog(recorder, pitfalls, address, exit_on_lost)
    recorder.init_hook = dog.on_init
    dog.start()
    enter(script, args)
    code, crashed, error = execute(script)
    dog.finish(code, crashed, error, time.time())
    return code


def main() -> None:
    """Entry of a self-launched rank: ``python -m ddpdoctor.watch.rank script.py args...``."""
    script, args = sys.argv[1], sys.argv[2:]
    if os.environ.get(MODE_ENV) == "spawn":
        code = run_launcher(script, args, os.environ[ADDR_ENV])
    else:
        code = run_script(script, args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                          os.environ[ADDR_ENV], os.environ.get(EXIT_ON_LOST_ENV) == "1")
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
