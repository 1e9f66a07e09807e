"""How the perf scripts run ddpdoctor: the way a user's installed copy runs, not the test suite's way."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cli_command() -> list[str]:
    """``ddpdoctor`` as users type it: the console script next to this interpreter (else ``python -m``)."""
    script = Path(sys.executable).with_name("ddpdoctor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ddpdoctor"]


def user_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without PYTHONDONTWRITEBYTECODE.

    ``pip install .`` compiles ddpdoctor's bytecode at install time; a checkout installed in editable
    mode caches it on first import, unless this variable (set on some CI machines) forbids it. Then every
    run compiles ddpdoctor from source again, which adds ~30 ms to each command's start-up that no
    installed copy pays. Run the measured command once before timing it, so the cache exists.
    """
    env = dict(os.environ if env is None else env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def wall_times(cmd: list[str], repeat: int, ok: tuple[int, ...] = (0,),
               env: dict[str, str] | None = None) -> list[float]:
    """Wall times of ``repeat`` runs of ``cmd`` (each within 300 s); a run that exits with a code not in
    ``ok`` stops the script, as its timing would mean nothing."""
    import subprocess
    import time

    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=user_env(env), timeout=300)
        times.append(time.perf_counter() - start)
        if res.returncode not in ok:
            raise SystemExit(f"{cmd} failed ({res.returncode}): {res.stderr[-500:]}")
    return times
