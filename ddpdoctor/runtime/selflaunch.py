"""Self-launch: start ``--nproc`` local ranks through PyTorch's elastic launcher (torchrun's engine).

Each rank runs ``python -m ddpdoctor <same arguments>`` and finds itself under torchrun's environment.
The port is checked first, so a busy MASTER_PORT is one clear line instead of a PyTorch traceback. Rank 0
writes its report and exit code to a result file; ranks exit 0 so the launcher stays quiet, and this
process exits with rank 0's code (1 when a problem was found).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ddpdoctor.errors import EXIT_BUG, EXIT_PROBLEM, DoctorError
from ddpdoctor.outputs import write_json
from ddpdoctor.ports import busy_port_message, free_port, port_is_free

SELF_LAUNCHED_ENV = "DDPDOCTOR_SELF_LAUNCHED"
RESULT_FILE_ENV = "DDPDOCTOR_RESULT_FILE"
# Where the self-launching parent notes that it was interrupted (Ctrl-C, a scheduler's SIGTERM) before the launcher
# forwards the signal to the ranks: rank 0 then reports an interrupted run, not the ranks that the same signal
# stopped as "went silent" (a rank's SIGTERM is otherwise the launcher tearing the job down after a rank died).
INTERRUPT_FILE_ENV = "DDPDOCTOR_INTERRUPT_FILE"


def interrupted_by() -> str | None:
    """The signal that interrupted the self-launching parent of this rank ("SIGTERM"), or None."""
    path = os.environ.get(INTERRUPT_FILE_ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(32).strip() or None
    except OSError:
        return None


@contextlib.contextmanager
def noting_interrupts(path: str) -> Iterator[None]:
    """While the elastic launcher runs here, its signal handler first writes the signal's name to ``path``.

    The launcher installs ``_terminate_process_handler`` when it starts the ranks (PContext.start looks the name
    up in its module then), raises SignalException from it, and only then stops the ranks: the note is on disk
    before any rank gets the signal. Torch's private name: where it is missing, nothing is noted (the report
    then reads as before)."""
    from torch.distributed.elastic.multiprocessing import api

    original = getattr(api, "_terminate_process_handler", None)
    if original is None:
        yield
        return

    def note_then_raise(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError, ValueError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(signal.Signals(signum).name)
        original(signum, frame)

    api._terminate_process_handler = note_then_raise
    try:
        yield
    finally:
        api._terminate_process_handler = original


# torchrun's syntax for -r/--redirects and -t/--tee (torch/distributed/elastic/multiprocessing/api.py, Std):
# one of 0 (none), 1 (stdout), 2 (stderr), 3 (both) for every local rank, or LOCAL_RANK:VALUE pairs.
_STD_VALUE = re.compile(r"^[0123]$")
_STD_MAPPING = re.compile(r"^(\d:[0123],)*(\d:[0123])$")
_STD_HELP = ("0 (none), 1 (stdout), 2 (stderr) or 3 (both), for every local rank or as LOCAL_RANK:VALUE pairs "
             "like 0:3,1:2")


@dataclass(frozen=True)
class LaunchLogs:
    """Where self-launched ranks' output goes: torchrun's ``--log-dir``, ``--redirects``, ``--tee`` and
    ``--local-ranks-filter``, with torchrun's meanings (``torch/distributed/run.py``), handed to the same
    elastic launcher torchrun uses (``DefaultLogsSpecs``).

    - ``log_dir``: base directory; each run writes ``<log_dir>/<run id>_<random>/attempt_0/<local rank>/``
      ``stdout.log``, ``stderr.log`` (and ``error.json``). Created if missing, as torchrun does.
    - ``redirects``: send those streams of those local ranks to the files only.
    - ``tee``: send them to the files and still to the console (each line prefixed ``[default<rank>]:``).
    - ``local_ranks_filter``: only these local ranks' streams reach the console (files keep everything).

    With none of them given, nothing is written anywhere: the launcher is told ``os.devnull``, so no
    ``torchelastic_*`` temporary directory is left behind for every run.
    """

    log_dir: str | None = None
    redirects: str = "0"
    tee: str = "0"
    local_ranks_filter: str = ""

    @property
    def wants_files(self) -> bool:
        return self.log_dir is not None or self.redirects != "0" or self.tee != "0"

    @property
    def default(self) -> bool:
        return not self.wants_files and not self.local_ranks_filter

    def filter_ranks(self) -> set[int] | None:
        if not self.local_ranks_filter:
            return None
        return {int(part) for part in self.local_ranks_filter.split(",")}

    def validate(self, nproc: int | None = None) -> None:
        """DoctorError (exit 2, one line) for a value torchrun would refuse, before any rank starts.

        ``log_dir`` itself is the output policy's to judge (``outputs.LOG_FOLDER``, by the command's plan)."""
        for flag, value in (("--redirects", self.redirects), ("--tee", self.tee)):
            if not (_STD_VALUE.match(value) or _STD_MAPPING.match(value)):
                raise DoctorError(f"{flag} takes {_STD_HELP} (torchrun's syntax), got: {value!r}")
        if self.local_ranks_filter:
            parts = self.local_ranks_filter.split(",")
            if not all(p.strip().isdigit() and len(p.strip()) <= 6 for p in parts):
                raise DoctorError("--local-ranks-filter must be a comma-separated list of local ranks, e.g. "
                                  f"--local-ranks-filter 0,1 (torchrun's syntax), got: {self.local_ranks_filter!r}")
            wanted = {int(p) for p in parts}
            if nproc is not None and not any(r < nproc for r in wanted):
                raise DoctorError(f"--local-ranks-filter {self.local_ranks_filter}: no such local rank among the "
                                  f"{nproc} started (0-{nproc - 1}); nothing would reach the console")


def _logs_config(logs: LaunchLogs, nproc: int) -> tuple[dict[str, Any], str | None]:
    """The LaunchConfig fields for ``logs`` on this torch, and a temporary log directory we created (or None).

    torch >= 2.3 takes a ``logs_specs`` object; older releases had ``log_dir``/``redirects``/``tee`` fields
    and no console filter.
    """
    from torch.distributed.launcher.api import LaunchConfig

    names = {f.name for f in dataclasses.fields(LaunchConfig)}
    created = None
    log_dir = logs.log_dir
    if logs.default:
        log_dir = os.devnull
    elif log_dir is None:
        # torchrun's own fallback for a filter or redirect without --log-dir is a temporary directory.
        log_dir = created = tempfile.mkdtemp(prefix="ddpdoctor-logs-")
    if "logs_specs" in names:
        from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std

        specs = DefaultLogsSpecs(log_dir=log_dir, redirects=Std.from_str(logs.redirects), tee=Std.from_str(logs.tee),
                                 local_ranks_filter=logs.filter_ranks())
        return {"logs_specs": specs}, created
    if logs.local_ranks_filter:
        raise DoctorError("--local-ranks-filter needs torch >= 2.3 (this torch's launcher has no console filter)")
    from torch.distributed.elastic.multiprocessing.api import Std

    fields: dict[str, Any] = {"redirects": Std.from_str(logs.redirects), "tee": Std.from_str(logs.tee)}
    if "log_dir" in names and not logs.default:
        fields["log_dir"] = log_dir
    return fields, created


def _run_log_dirs(base: str, run_id: str) -> list[str]:
    """The run's directories torch created under ``base`` (``<run id>_<random>``)."""
    try:
        return sorted(os.path.join(base, d) for d in os.listdir(base) if d.startswith(f"{run_id}_"))
    except OSError:
        return []


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


def _report_log_dir(logs: LaunchLogs, run_id: str, temporary: str | None) -> None:
    """Say where the ranks' log files are (torchrun only logs it at INFO level); a temporary directory that
    holds nothing the user asked for (a console filter alone) is removed."""
    if logs.default:
        return
    base = logs.log_dir or temporary
    if base is None:
        return
    if not logs.wants_files:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        return
    runs = _run_log_dirs(base, run_id)
    where = runs[-1] if runs else base
    print(f"ddpdoctor: the ranks' logs are in {where}/attempt_0/<local rank>/", file=sys.stderr)


def choose_port(requested: int | None) -> int:
    """The user's port if free (DoctorError with the holder if not), else a free one."""
    if requested is None:
        return free_port("127.0.0.1")
    if not port_is_free(requested):
        raise DoctorError(busy_port_message(requested), exit_code=EXIT_PROBLEM)
    return requested


def self_launch(argv: list[str], nproc: int, master_port: int | None, rdzv_timeout_s: float,
                logs: LaunchLogs | None = None) -> int:
    """Run ``python -m ddpdoctor ARGV`` on ``nproc`` local ranks; rank 0's exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logs = logs or LaunchLogs()
    logs.validate(nproc)
    port = choose_port(master_port)
    # The launcher narrates its work at WARNING level ("Sending process ... closing signal"): noise here.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    fd, result_file = tempfile.mkstemp(prefix="ddpdoctor-result-", suffix=".json")
    os.close(fd)
    os.unlink(result_file)
    saved = {k: os.environ.get(k) for k in (RESULT_FILE_ENV, SELF_LAUNCHED_ENV, INTERRUPT_FILE_ENV)}
    os.environ[RESULT_FILE_ENV] = result_file
    os.environ[SELF_LAUNCHED_ENV] = "1"
    interrupt_file = result_file + ".interrupted"
    os.environ[INTERRUPT_FILE_ENV] = interrupt_file
    run_id = f"ddpdoctor-{uuid.uuid4().hex[:12]}"
    log_fields, temporary_log_dir = _logs_config(logs, nproc)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=run_id,
        # role "default": torchrun's, so --tee prefixes lines "[default0]:" as torchrun does.
        rdzv_backend="static", rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_configs={"rank": 0, "timeout": int(max(10, rdzv_timeout_s))},
        max_restarts=0, monitor_interval=0.1, start_method="spawn", role="default", **log_fields,
    )
    failure = ""
    killed = ""  # "rank 0 was killed by SIGKILL": ended from outside, which is not a ddpdoctor bug
    before = _children()
    try:
        with noting_interrupts(interrupt_file):
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
        with contextlib.suppress(OSError):
            os.unlink(interrupt_file)
        _report_log_dir(logs, run_id, temporary_log_dir)
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
