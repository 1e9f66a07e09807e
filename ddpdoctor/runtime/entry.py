"""The start of every multi-rank command: run here as one rank of a launched job, or self-launch.

``check`` and ``bench`` share it (``watch`` shares :func:`validate_launch_options`): under
torchrun/srun/mpirun this process is a rank (it runs ``run_here`` and leaves with ``os._exit``, because a
thread abandoned inside a C++ collective, or gloo's teardown waiting on a peer that already left, must not
keep it alive); with no launcher it starts ``nproc`` local ranks running the same command line (``argv``)
and returns rank 0's exit code. No CLI here: the command passes its own arguments in and turns the code
into its exit.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable

from ddpdoctor.errors import DoctorError
from ddpdoctor.runtime.launcher import LaunchInfo
from ddpdoctor.runtime.selflaunch import LaunchLogs

BACKENDS = ("auto", "gloo", "nccl")
MAX_TIMEOUT_S = 86400


def validate_launch_options(nproc: int | None, backend: str = "auto", master_port: int | None = None,
                            timeout: float | None = None) -> None:
    """The options every multi-rank command takes (those it has); DoctorError (exit 2) for a bad one."""
    if nproc is not None and nproc < 1:
        raise DoctorError(f"--nproc must be at least 1, got: {nproc}")
    if nproc is not None and nproc > 1 and not _launched():
        # Before anything starts: past the machine's limits forks fail midway or the OOM killer strikes.
        # Under a launcher --nproc is ignored (the launcher decides), and a self-launched rank must not
        # refuse what its launcher accepted because its siblings now take some of the memory.
        from ddpdoctor.runtime.capacity import nproc_refusal

        refusal = nproc_refusal(nproc)
        if refusal is not None:
            raise DoctorError(refusal)
    if backend not in BACKENDS:
        raise DoctorError(f"--backend must be one of {', '.join(BACKENDS)}, got: {backend!r}")
    if master_port is not None and not 0 < master_port < 65536:
        raise DoctorError(f"--master-port must be in 1-65535, got: {master_port}")
    if timeout is not None and (not (timeout > 0 and math.isfinite(timeout)) or timeout > MAX_TIMEOUT_S):
        raise DoctorError(f"--timeout must be a positive number of seconds up to {MAX_TIMEOUT_S}, got: {timeout:g}")


def _launched() -> bool:
    from ddpdoctor.runtime import launcher

    try:
        return launcher.detect().is_launched
    except DoctorError:  # a malformed launcher environment is reported by the command itself
        return True


def resolve_master_addr(info: LaunchInfo, timeout_s: float) -> None:
    """DoctorError (one line) when MASTER_ADDR does not resolve here, before any store is created.

    Otherwise c10d's TCPStore retries the lookup until its timeout and ends in dozens of C++ frames
    saying "timed out". getaddrinfo can block on a slow resolver, so it runs with a deadline.
    """
    import socket

    from ddpdoctor.runtime.deadline import run_with_deadline

    addr, host = info.master_addr, socket.gethostname()
    seconds = min(timeout_s, 30.0)
    outcome = run_with_deadline(lambda: socket.getaddrinfo(addr, info.master_port, type=socket.SOCK_STREAM),
                                seconds, "ddpdoctor-resolve")
    if outcome.timed_out:
        raise DoctorError(f"MASTER_ADDR {addr!r} did not resolve within {seconds:g} s on {host} (the name "
                          "service does not answer); use rank 0's IP address, or fix DNS / /etc/hosts")
    if isinstance(outcome.error, (OSError, UnicodeError, ValueError)):
        raise DoctorError(f"MASTER_ADDR {addr!r} does not resolve on {host} ({outcome.error}); set it to rank "
                          "0's host name or IP address as this node can resolve it")
    if outcome.error is not None:
        raise outcome.error


def run_here_or_self_launch(run_here: Callable[[LaunchInfo], int], *, argv: list[str], nproc: int | None,
                            backend: str, master_port: int | None, timeout: float,
                            logs: LaunchLogs | None = None) -> int:
    """Rank 0's exit code after self-launch; under a launcher this process leaves with its rank's code."""
    from ddpdoctor.runtime import launcher

    info = launcher.detect()
    if info.is_launched:
        if info.rank == 0 and info.launcher != "local":
            ignored = [flag for flag, given in (("--nproc", nproc is not None), ("--master-port", master_port is not None),
                                                ("--log-dir/--redirects/--tee/--local-ranks-filter",
                                                 logs is not None and not logs.default)) if given]
            if ignored:
                print(f"ddpdoctor: note: {', '.join(ignored)} apply to self-launch only; running as one rank of "
                      f"the {info.launcher} job (world size {info.world_size}), whose launcher decides",
                      file=sys.stderr)
        resolve_master_addr(info, timeout)
        code = run_here(info)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    from ddpdoctor.runtime.backend import require_usable_backend
    from ddpdoctor.runtime.selflaunch import default_nproc, self_launch

    require_usable_backend(backend)  # before starting any rank: every one of them would fail the same way
    if master_port is None and os.environ.get("MASTER_PORT"):
        master_port = info.master_port  # validated by the launcher detection
    return self_launch(argv, nproc or default_nproc(), master_port, timeout, logs)
