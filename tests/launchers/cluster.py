"""Real launchers for the tests: Open MPI's ``mpirun`` and a one-node Slurm (munged, slurmctld, slurmd).

Both come from Debian packages (``openmpi-bin``; ``slurmd``, ``slurmctld``, ``slurm-client``, ``munge``),
installed once per run when root by tests/debian.py (``apt-get install`` takes ~25 s here, see docs/testing.md). The Slurm
"cluster" is this machine alone, configured in a temporary folder: its own munge socket and key, its own
ports, state and spool folders, ``SLURM_CONF`` pointing at its slurm.conf, so nothing under /etc/slurm or
/run/munge is touched and two runs never share a daemon. Every wait has a deadline; ``close()`` ends the
daemons it started, by their pids.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests.debian import is_root

DAEMON_DEADLINE_S = 60
# Open MPI refuses root without these; --oversubscribe lets 2 ranks share fewer cores than ranks (CI: 2).
MPIRUN_ROOT_FLAGS = ("--allow-run-as-root", "--oversubscribe")


def mpirun_cmd(nproc: int, argv: Sequence[str]) -> list[str]:
    """``mpirun -np N argv`` as a user would type it (plus the flags root needs)."""
    return ["mpirun", *(MPIRUN_ROOT_FLAGS if is_root() else ()), "-np", str(nproc), *argv]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class OneNodeSlurm:
    """munged + slurmctld + slurmd for this host, configured under ``folder``."""

    folder: Path
    cpus: int = 8  # more than CI's 2 cores: config_overrides lets 2-4 tasks share them, as oversubscribe does
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """What srun needs to find this cluster (its slurm.conf)."""
        return {"SLURM_CONF": str(self.folder / "slurm.conf")}

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        for sub in ("state", "spool", "munge", "log"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder / "munge", 0o700)
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o400)
        sock = self.folder / "munge" / "munge.socket"
        self._daemon(["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                      f"--pid-file={self.folder / 'munge' / 'munged.pid'}",
                      f"--seed-file={self.folder / 'munge' / 'munged.seed'}",
                      f"--log-file={self.folder / 'log' / 'munged.log'}"], "munged")
        self._wait(lambda: sock.exists(), "munged's socket")
        ctl_port, d_port = _free_port(), _free_port()
        (self.folder / "slurm.conf").write_text("\n".join([
            "ClusterName=ddpdoctor-tests",
            # Job ids pick the job's MASTER_PORT (ddpdoctor.runtime.launcher.job_port): a fresh cluster
            # starting at job 1 in two test runs at once would give both jobs the same port.
            f"FirstJobId={random.randrange(1000, 1_000_000)}",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctl_port}",
            f"SlurmdPort={d_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={sock}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.folder / 'state'}",
            f"SlurmdSpoolDir={self.folder / 'spool'}",
            f"SlurmctldPidFile={self.folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.folder / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.folder / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.folder / 'log' / 'slurmd.log'}",
            # No cgroups in a container: track processes by their parent, bind nothing.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "KillWait=5",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE",
            "",
        ]))
        env = {**os.environ, **self.env}
        self._daemon(["slurmctld", "-D", "-i"], "slurmctld", env)
        self._daemon(["slurmd", "-D", "-N", self.node], "slurmd", env)
        self._wait(self._node_idle, f"node {self.node} to be idle in sinfo")

    def _daemon(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> None:
        with open(self.folder / "log" / f"{name}.out", "wb") as out:
            self.daemons.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                 stdin=subprocess.DEVNULL, start_new_session=True))

    def _node_idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **self.env})
        return done.stdout.strip() in ("idle", "mix", "alloc")

    def _wait(self, ready: object, what: str) -> None:
        assert callable(ready)
        deadline = time.monotonic() + DAEMON_DEADLINE_S
        while not ready():
            for proc in self.daemons:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}) waiting for {what}:\n"
                                       f"{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {DAEMON_DEADLINE_S} s:\n{self.logs()}")
            time.sleep(0.5)

    def logs(self) -> str:
        parts = []
        for path in sorted((self.folder / "log").glob("*")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def srun_cmd(self, ntasks: int, argv: Sequence[str]) -> list[str]:
        """``srun -n N argv`` as a user types it; the step ends within 5 minutes whatever happens."""
        return ["srun", "-n", str(ntasks), "--time=5", *argv]

    def close(self) -> None:
        for proc in reversed(self.daemons):  # slurmd before slurmctld before munged
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    with suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=20)
        self.daemons.clear()
