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
