"""What the user asked ``watch`` for, as one object: the CLI parses the options into it, the supervisor reads it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ddpdoctor.errors import DoctorError
from ddpdoctor.watch.output import OutputOptions
from ddpdoctor.watch.reaper import DEFAULT_GRACE_S, GRACE_ENV

# The shortest --hang-timeout: ten of the ranks' watchdog ticks (watchdog.TICK_S, 0.1 s), the interval at which
# their progress is sent. Below it a hang would be decided on counts a tick or two old.
MIN_HANG_TIMEOUT_S = 1.0


@dataclass
class WatchConfig:
    """One watched run."""

    script: str
    args: list[str]
    nproc: int = 2
    hang_timeout_s: float = 300.0
    json_path: str | None = None
    master_port: int | None = None
    evidence_dir: str | None = None
    spawns: bool = False  # the script starts its own ranks: run it once
    grace_s: float = DEFAULT_GRACE_S  # SIGTERM -> SIGKILL at teardown (torchrun's --shutdown-timeout)
    quiet: bool = False  # only the verdict: no rank output, no live notes
    output: OutputOptions = field(default_factory=OutputOptions)


def shutdown_timeout_s(value: float | None) -> float:
    """``--shutdown-timeout``, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s: torchrun's own order
    (``LaunchConfig.__post_init__`` in torch/distributed/launcher/api.py); negative is refused as there."""
    if value is None:
        raw = os.environ.get(GRACE_ENV)
        if raw is None:
            return DEFAULT_GRACE_S
        try:
            value = float(raw)
        except ValueError:
            raise DoctorError(f"{GRACE_ENV} must be a number of seconds, got: {raw!r}") from None
    if not value >= 0 or value == float("inf"):
        raise DoctorError(f"--shutdown-timeout must be a non-negative number of seconds, got: {value}")
    return float(value)
