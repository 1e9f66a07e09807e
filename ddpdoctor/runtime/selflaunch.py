"""Self-launch: start ``--nproc`` local ranks through PyTorch's elastic launcher (torchrun's engine).

Each rank runs ``python -m ddpdoctor <same arguments>`` and finds itself under torchrun's environment.
The port is checked first, so a busy MASTER_PORT is one clear line instead of a PyTorch traceback. Rank 0
writes its report and exit code to a result file; ranks exit 0 so the launcher stays quiet, and this
process exits with rank 0's code (1 when a problem was found).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import uuid
from typing import Any

from ddpdoctor.errors import EXIT_BUG, EXIT_PROBLEM, DoctorError
from ddpdoctor.outputs import write_json
from ddpdoctor.ports import busy_port_message, free_port, port_is_free

SELF_LAUNCHED_ENV = "DDPDOCTOR_SELF_LAUNCHED"
RESULT_FILE_ENV = "DDPDOCTOR_RESULT_FILE"


def write_result_file(code: int, report: dict[str, Any] | None = None) -> None:
    """The self-launch protocol: rank 0 leaves its exit code (and report) where ``self_launch`` reads it."""
    path = os.environ.get(RESULT_FILE_ENV)
    if path:
        write_json(path, {"exit_code": code, **({"report": report} if report is not None else {})},
                   "result", flag="result file")


def default_nproc() -> int:
    """One rank per visible GPU, or 2 on a machine without GPUs (enough to exercise a process group)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def _children() -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process().children(recursive=True)}


def _stop_new_children(before: set[int]) -> int:
    """Kill every descendant that was not there before the launch (the ranks); how many there were."""
    import psutil

    me = psutil.Process()
    new = [child for child in me.children(recursive=True) if child.pid not in before]
    for child in new:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(new, timeout=5)
    return len(new)


def choose_port(requested: int | None) -> int:
    """The user's port if free (DoctorError with the holder if not), else a free one."""
    if requested is None:
        return free_port("127.0.0.1")
    if not port_is_free(requested):
        raise DoctorError(busy_port_message(requested), exit_code=EXIT_PROBLEM)
    return requested


def self_launch(argv: list[str], nproc: int, master_port: int | None, rdzv_timeout_s: float) -> int:
    """Run ``python -m ddpdoctor ARGV`` on ``nproc`` local ranks; rank 0's exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    port = choose_port(master_port)
    # The launcher narrates its work at WARNING level ("Sending process ... closing signal"): noise here.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    fd, result_file = tempfile.mkstemp(prefix="ddpdoctor-result-", suffix=".json")
    os.close(fd)
    os.unlink(result_file)
    saved = {k: os.environ.get(k) for k in (RESULT_FILE_ENV, SELF_LAUNCHED_ENV)}
    os.environ[RESULT_FILE_ENV] = result_file
    os.environ[SELF_LAUNCHED_ENV] = "1"
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"ddpdoctor-{uuid.uuid4().hex[:12]}",
        rdzv_backend="static", rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_configs={"rank": 0, "timeout": int(max(10, rdzv_timeout_s))},
        max_restarts=0, monitor_interval=0.1, start_method="spawn",
    )
    failure = ""
    killed = ""  # "rank 0 was killed by SIGKILL": ended from outside, which is not a ddpdoctor bug
    before = _children()
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "ddpdoctor", *argv)
    except SignalException as exc:
        # Ctrl-C or a scheduler's SIGTERM: the launcher has already stopped every rank.
        # 128 + the signal, the shell's convention: 130 for Ctrl-C, 143 for a scheduler's SIGTERM.
        print(f"ddpdoctor: interrupted ({exc.sigval.name}); all local ranks stopped", file=sys.stderr)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        failure = "; ".join(f"rank {rank}: exit code {f.exitcode}" + (f" ({f.signal_name()})" if f.exitcode < 0 else "")
                            for rank, f in sorted(exc.failures.items()))
        first_rank, first = exc.get_first_failure()  # the others were stopped by the launcher after it
        if first.exitcode < 0:
            killed = f"rank {first_rank} was killed by {first.signal_name()}"
    except Exception as exc:
        # A fork that fails midway (EAGAIN: process table or RLIMIT_NPROC full; ENOMEM) escapes the
        # elastic launcher before it records the ranks it did start, so nothing would stop them: we do,
        # whatever escaped.
        started = _stop_new_children(before)
        if not isinstance(exc, (OSError, MemoryError)):
            raise
        raise DoctorError(f"could not start {nproc} local ranks ({type(exc).__name__}: {exc}); the "
                          f"{started} process{'es' if started != 1 else ''} already started were stopped. "
                          "Use a smaller --nproc, or free memory/processes on this machine") from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        with open(result_file) as handle:
            result = json.load(handle)
        os.unlink(result_file)
    except (OSError, ValueError):
        if killed:
            # Killed from outside (the OOM killer, a user, a scheduler): the machine's problem, not ours.
            print(f"ddpdoctor: {killed} before rank 0 could report ({failure}); if nobody sent it, look for "
                  "the OOM killer: dmesg | grep -i 'killed process'", file=sys.stderr)
            return EXIT_PROBLEM
        print(f"ddpdoctor: rank 0 ended without a report ({failure or 'no failure reported by the launcher'})",
              file=sys.stderr)
        return EXIT_BUG
    return int(result["exit_code"])
