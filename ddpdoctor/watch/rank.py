"""The entry of a self-launched watched process: ``python -m ddpdoctor.watch.rank script.py args...``.

A rank runs the script through :func:`~ddpdoctor.watch.script.run_script`; with ``DDPDOCTOR_WATCH_MODE=spawn``
the process is the launcher of a script that starts its own ranks (:mod:`~ddpdoctor.watch.spawned`). Nothing
imports this module: run as ``__main__`` it must not have been imported before (runpy warns, and its
names would exist twice). The in-rank layers below it: recorder <- watchdog <- script <- spawned.
"""

from __future__ import annotations

import os
import sys

from ddpdoctor.watch.channel import ADDR_ENV
from ddpdoctor.watch.script import run_script
from ddpdoctor.watch.spawned import run_launcher
from ddpdoctor.watch.watchdog import EXIT_ON_LOST_ENV, MODE_ENV


def main() -> None:
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
