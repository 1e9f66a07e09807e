"""``check``, ``watch`` and ``bench`` under real launchers, as users start them: ``mpirun -np 2 ddpdoctor ...``
(Open MPI) and ``srun -n 2 ddpdoctor ...`` (a one-node Slurm started for this module), with no MASTER_ADDR.

Each real job runs once (a module fixture) and every test below asserts one thing a user would see of it.
The watched script is written for torchrun (env://, no launcher code): before the fix it died under srun
and mpirun with "environment variable RANK expected, but not set" (issue 32).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.debian import MPI, SLURM, ensure_packages
from tests.launchers.cluster import OneNodeSlurm, mpirun_cmd
from tests.support import REPO, clean_env, free_port

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "launchers" / "env_desync.py"
JOB_DEADLINE_S = 240
DDPDOCTOR = [sys.executable, "-m", "ddpdoctor"]


@dataclass(frozen=True)
class Job:
    returncode: int
    stdout: str
    stderr: str
    json: dict[str, object]

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_job(cmd: list[str], json_path: Path, env: dict[str, str]) -> Job:
    """Run one launcher job to its end (killed at the deadline: a hang fails the test, not the suite)."""
    if cmd[0] == "mpirun":
        # Each mpirun its own session folder: two started at once (bench beside check) raced to create
        # /tmp/ompi.<host>.<uid> and one stopped with "orte_session_dir failed ... File exists".
        session = Path(tempfile.mkdtemp(prefix="ompi-", dir=json_path.parent))
        env = {**env, "OMPI_MCA_orte_tmpdir_base": str(session), "PRTE_MCA_prte_tmpdir_base": str(session)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_DEADLINE_S, env=env, cwd=REPO)
    document = json.loads(json_path.read_text()) if json_path.exists() else {}
    return Job(done.returncode, done.stdout, done.stderr, document)


@dataclass(frozen=True)
class LauncherJobs:
    name: str  # the launcher as ddpdoctor names it ("mpi", "slurm")
    check: Job
    watch: Job
    bench: Job | None


def _jobs(name: str, launch: object, tmp: Path, env: dict[str, str], bench: bool) -> LauncherJobs:
    assert callable(launch)
    with ThreadPoolExecutor(max_workers=2) as pool:
        # bench runs beside check to save the suite a job's start-up; its own MASTER_PORT keeps it off the
        # port check derives from its job id (check is the test of that).
        bench_job = pool.submit(run_job, launch(2, [*DDPDOCTOR, "bench", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1",
                                                    "--json", str(tmp / "bench.json")]), tmp / "bench.json",
                                {**env, "MASTER_PORT": str(free_port())}) if bench else None
        check = run_job(launch(2, [*DDPDOCTOR, "check", "--only", "barrier,connectivity", "--timeout", "90",
                                    "--json", str(tmp / "check.json")]), tmp / "check.json", env)
        benched = bench_job.result(timeout=JOB_DEADLINE_S + 30) if bench_job is not None else None
    # --hang-timeout 20: a loaded 2-core CI machine once took >5 s in torch's import + DDP's first broadcast.
    watch = run_job(launch(2, [*DDPDOCTOR, "watch", "--hang-timeout", "20", "--json", str(tmp / "watch.json"),
                                str(SCRIPT)]), tmp / "watch.json", env)
    return LauncherJobs(name, check, watch, benched)


@pytest.fixture(scope="module", params=["mpirun", "srun"])
def jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LauncherJobs]:
    tmp = tmp_path_factory.mktemp(request.param)
    env = clean_env()
    if request.param == "mpirun":
        why = ensure_packages(MPI)
        if why:
            pytest.skip(f"Open MPI: {why}")
        yield _jobs("mpi", mpirun_cmd, tmp, env, bench=True)
        return
    why = ensure_packages(SLURM)
    if why:
        pytest.skip(f"Slurm: {why}")
    cluster = OneNodeSlurm(tmp / "slurm")
    try:
        cluster.start()
        yield _jobs("slurm", cluster.srun_cmd, tmp, {**env, **cluster.env}, bench=False)
    finally:
        cluster.close()


def test_check_runs_on_one_node_without_master_addr(jobs: LauncherJobs) -> None:
    # Before: mpirun stopped with "launched by MPI but MASTER_ADDR is not set"; torchrun defaults to the local host.
    assert jobs.check.returncode == 0, jobs.check.output
    assert "MASTER_ADDR" not in jobs.check.output
    assert "2 ranks on 1 host" in jobs.check.stdout and f"launcher {jobs.name}" in jobs.check.stdout
    assert jobs.check.json["status"] == "pass" and jobs.check.json["launcher"] == jobs.name


def test_watch_gives_an_env_script_torchruns_variables(jobs: LauncherJobs) -> None:
    assert "environment variable RANK expected" not in jobs.watch.output
    seen = sorted((json.loads(line.split(" ", 1)[1]) for line in jobs.watch.stdout.splitlines()
                   if line.startswith("torchrun-env ")), key=lambda env: int(env["RANK"]))
    assert len(seen) == 2, jobs.watch.output
    for rank, env in enumerate(seen):
        # What torchrun --nproc-per-node 2 sets on one node (LocalElasticAgent._start_workers).
        assert env["RANK"] == env["ROLE_RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "2"
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["ROLE_NAME"]) == ("0", "1", "default")
        assert env["MASTER_ADDR"] == "127.0.0.1"
    # Every rank derived the same port without talking (from the job id), inside 29500-31999.
    assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"] and 29500 <= int(seen[0]["MASTER_PORT"]) < 32000


def test_watch_names_the_desync_under_the_launcher(jobs: LauncherJobs) -> None:
    assert jobs.watch.returncode == 1, jobs.watch.output
    # gloo sees two different collectives meet (#3: barrier against all_reduce): watch says MISMATCH.
    assert "collective #3: rank 0 in barrier at tests/launchers/env_desync.py:28; rank 1 in all_reduce" in (
        jobs.watch.output)
    assert jobs.watch.json["status"] == "mismatch", jobs.watch.json


def test_bench_sweeps_on_one_node_without_master_addr(jobs: LauncherJobs) -> None:
    if jobs.bench is None:
        pytest.skip("bench runs under one launcher only (mpirun), to keep the suite short")
    assert jobs.bench.returncode == 0, jobs.bench.output
    rows = jobs.bench.json.get("results") or jobs.bench.json.get("rows")
    assert rows, jobs.bench.json
    assert jobs.bench.json.get("world_size") == 2
