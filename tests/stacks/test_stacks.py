"""`ddpdoctor stacks` against real hung torchrun jobs (gloo, CPU), real py-spy, real signals.

Every job is started in its own session and killed in a ``finally`` together with all its descendants
(torchrun starts each worker in a new session, so killing the agent's group alone would leave them).
Tests wait for each rank to reach its hang point (marker file, then its main thread asleep with no CPU
progress) instead of sleeping a fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.support import REPO, clean_env, free_port, run_cli, torchrun_cmd

EXAMPLE = REPO / "examples" / "stacks_hang.py"
START_DEADLINE_S = 240.0


def example_line(code: str) -> int:
    """The line of the example that holds ``code`` (so tests survive edits to the example)."""
    for number, text in enumerate(EXAMPLE.read_text().splitlines(), start=1):
        if text.strip() == code:
            return number
    raise AssertionError(f"{code!r} not in {EXAMPLE}")


BARRIER_LINE = example_line("dist.barrier()")
ALL_REDUCE_LINE = example_line("dist.all_reduce(grad)")
SLEEP_LINE = example_line("time.sleep(3600)")


@dataclass
class HungJob:
    agents: list[subprocess.Popen[bytes]]
    marker_dir: Path
    logs: list[Path]
    rank_pids: dict[int, int] = field(default_factory=dict)

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())


def _main_thread_ticks(pid: int) -> tuple[str, int]:
    """State letter and utime+stime of the main thread (tid == pid) from /proc."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[11]) + int(fields[12])


def _wait_blocked(job: HungJob, deadline: float) -> None:
    """Every rank's main thread asleep and making no CPU progress across two looks: it is in its hang."""
    pending = set(job.rank_pids.values())
    last: dict[int, tuple[str, int]] = {}
    while pending:
        assert time.monotonic() < deadline, f"ranks never settled:\n{job.log_text()}"
        for pid in list(pending):
            now = _main_thread_ticks(pid)
            if now[0] == "S" and last.get(pid) == now:
                pending.discard(pid)
            last[pid] = now
        time.sleep(0.3)


def _kill_tree(agents: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each agent's process group and every descendant's group; assert nothing is left."""
    victims: list[psutil.Process] = []
    for agent in agents:
        try:
            victims.append(psutil.Process(agent.pid))
            victims.extend(psutil.Process(agent.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    for victim in victims:
        for kill in (lambda v: os.killpg(v.pid, signal.SIGKILL), lambda v: v.kill()):
            with suppress(ProcessLookupError, PermissionError, psutil.Error):
                kill(victim)
    for agent in agents:
        agent.wait(timeout=60)
    _, alive = psutil.wait_procs(victims, timeout=60)
    assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], alive


@contextmanager
def hung_job(tmp_path: Path, nproc: int, mode: str, odd_rank: int, *, nnodes: int = 1,
             install_dumps: bool = False, stack_dir: Path | None = None) -> Iterator[HungJob]:
    """Start a real torchrun job (``nnodes`` agents on this machine) that hangs with one odd rank."""
    marker_dir = tmp_path / f"markers-{mode}-{odd_rank}-{nproc}x{nnodes}"
    marker_dir.mkdir()
    port = free_port()
    extra = {"OMP_NUM_THREADS": "1"}
    if stack_dir is not None:
        extra["DDPDOCTOR_STACK_DIR"] = str(stack_dir)
    args = [str(EXAMPLE), "--mode", mode, "--odd-rank", str(odd_rank), "--marker-dir", str(marker_dir),
            "--timeout", "300"] + (["--install-dumps"] if install_dumps else [])
    job = HungJob([], marker_dir, [])
    try:
        for node in range(nnodes):
            log = tmp_path / f"job-{port}-node{node}.log"
            job.logs.append(log)
            cmd = [*torchrun_cmd(), "--nnodes", str(nnodes), "--node-rank", str(node),
                   "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
                   *args]
            with open(log, "wb") as out:
                job.agents.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                                   env=clean_env(extra), start_new_session=True))
        deadline = time.monotonic() + START_DEADLINE_S
        world = nproc * nnodes
        while len(list(marker_dir.iterdir())) < world:
            dead = [a.args for a in job.agents if a.poll() is not None]
            assert not dead, f"job exited early:\n{job.log_text()}"
            assert time.monotonic() < deadline, f"ranks never reached their hang point:\n{job.log_text()}"
            time.sleep(0.2)
        time.sleep(0.1)  # the marker's text is written just after the file appears
        job.rank_pids = {int(p.name.split("-")[1]): int(p.read_text()) for p in marker_dir.iterdir()}
        _wait_blocked(job, deadline)
        yield job
    finally:
        _kill_tree(job.agents)


def _cli(args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(["stacks", *args], timeout=180, env=env)


@pytest.mark.slow
def test_four_ranks_barrier_outlier_named_by_py_spy_and_by_signal(tmp_path: Path) -> None:
    stack_dir = tmp_path / "dumps"
    with hung_job(tmp_path, 4, "barrier", 1, install_dumps=True, stack_dir=stack_dir) as job:
        agent = str(job.agents[0].pid)
        verdict = (f"rank 1 is in barrier() at stacks_hang.py:{BARRIER_LINE}; "
                   f"ranks 0,2-3 are in all_reduce() at stacks_hang.py:{ALL_REDUCE_LINE}")

        # No arguments: discovery by environment finds this job (other jobs on the machine may appear too).
        found = _cli([])
        assert found.returncode == 1, found.stderr
        assert verdict in found.stdout, found.stdout
        for rank, pid in job.rank_pids.items():
            assert f"rank {rank}=pid {pid}@" in found.stdout

        # --job (the torchrun agent's pid) + --json + --all-threads; run in-process to see that torch
        # never gets imported by `ddpdoctor stacks`.
        out = tmp_path / "stacks.json"
        probe = subprocess.run(
            [sys.executable, "-c",
             "import sys; from ddpdoctor.cli import main; rc = main(sys.argv[1:]);"
             " print('TORCH_IMPORTED' if 'torch' in sys.modules else 'NO_TORCH'); sys.exit(rc)",
             "stacks", "--job", agent, "--json", str(out), "--all-threads"],
            capture_output=True, text=True, timeout=180, env=clean_env())
        assert probe.returncode == 1, probe.stderr
        assert "NO_TORCH" in probe.stdout
        assert verdict in probe.stdout
        assert 'thread heartbeat' in probe.stdout  # the second thread, shown because of --all-threads
        doc = json.loads(out.read_text())
        assert doc["outliers"] == [1]
        assert [g["ranks"] for g in doc["groups"]] == [[0, 2, 3], [1]]
        assert doc["groups"][0]["where"] == f"stacks_hang.py:{ALL_REDUCE_LINE} in train_step"
        assert doc["groups"][1]["where"] == f"stacks_hang.py:{BARRIER_LINE} in sync_odd_path"
        assert doc["groups"][1]["stack"][0].endswith(" in barrier")
        procs = {p["rank"]: p for p in doc["processes"]}
        assert sorted(procs) == [0, 1, 2, 3]
        assert all(procs[r]["pid"] == job.rank_pids[r] and procs[r]["local_rank"] == r for r in procs)
        assert all(any(t["main"] for t in p["threads"]) for p in procs.values())

        # Without --all-threads the heartbeat thread is hidden, and the report says so.
        quiet = _cli(["--job", agent])
        assert "thread heartbeat" not in quiet.stdout and "--all-threads shows them" in quiet.stdout

        # The fallback: no py-spy anywhere (empty PATH, and subprocess poisoned so nothing can be spawned).
        fallback = subprocess.run(
            [sys.executable, "-c",
             "import subprocess, sys; subprocess.Popen = None; from ddpdoctor.cli import main;"
             " sys.exit(main(sys.argv[1:]))",
             "stacks", "--signal", "--stack-dir", str(stack_dir), "--job", agent],
            capture_output=True, text=True, timeout=180, env=clean_env({"PATH": ""}))
        assert fallback.returncode == 1, fallback.stderr
        assert "(stacks by signal)" in fallback.stdout
        assert verdict in fallback.stdout, fallback.stdout
        # Every rank is still alive after the signal: the dump did not kill anyone.
        assert all(psutil.pid_exists(pid) for pid in job.rank_pids.values())
        assert len(list(stack_dir.glob("rank*-pid*.txt"))) == 4


@pytest.mark.slow
def test_two_ranks_sleeping_rank_and_bad_pids_are_reported(tmp_path: Path) -> None:
    not_python = subprocess.Popen(["sleep", "600"])
    try:
        with hung_job(tmp_path, 2, "sleep", 1) as job:
            agent = str(job.agents[0].pid)
            res = _cli(["--job", agent])
            assert res.returncode == 1, res.stderr
            assert (f"rank 1 is at stacks_hang.py:{SLEEP_LINE} in load_batch() (not in a torch.distributed "
                    f"call); rank 0 is in all_reduce() at stacks_hang.py:{ALL_REDUCE_LINE}") in res.stdout

            mixed = _cli(["--pid", str(job.rank_pids[0]), "--pid", str(not_python.pid), "--pid", "4194304"])
            assert mixed.returncode == 1, mixed.stderr
            assert "Traceback" not in mixed.stderr
            assert f"pid {not_python.pid} on" in mixed.stdout and "not a Python process (sleep 600)" in mixed.stdout
            assert "pid 4194304" in mixed.stdout and "no such process" in mixed.stdout
            assert "in all_reduce()" in mixed.stdout
    finally:
        not_python.kill()
        not_python.wait()


def test_process_that_exits_during_the_dump_is_reported(tmp_path: Path) -> None:
    """The process is found, then dies before py-spy reads it (the window a real dump races with)."""
    from ddpdoctor.stacks.engine import discover, dump_all

    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        cands = discover([victim.pid])
        assert cands[0].proc.error is None
        victim.kill()  # left unreaped on purpose: a zombie, exactly what a dying rank looks like
        zombie = psutil.Process(victim.pid)
        deadline = time.monotonic() + 60
        while zombie.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        procs = dump_all(cands, timeout=60)
        assert procs[0].error == "the process exited while it was being dumped"
    finally:
        victim.kill()
        victim.wait()
    res = _cli(["--pid", str(victim.pid)])
    assert res.returncode == 1 and "no such process" in res.stdout


@pytest.mark.slow
def test_merge_of_two_nodes_json_groups_across_nodes(tmp_path: Path) -> None:
    """Two torchrun agents (node ranks 0 and 1, 2 ranks each) form one 4-rank job; each "node" writes its
    own JSON (narrowed with --job AGENT_PID, as `srun` on each node would), then merge groups them."""
    with hung_job(tmp_path, 2, "barrier", 3, nnodes=2) as job:
        files = []
        for node, agent in enumerate(job.agents):
            path = tmp_path / f"node{node}.json"
            res = _cli(["--job", str(agent.pid), "--json", str(path)])
            assert res.returncode in (0, 1), res.stderr
            files.append(path)
    node0 = json.loads(files[0].read_text())
    assert sorted(p["rank"] for p in node0["processes"]) == [0, 1] and node0["outliers"] == []
    node1 = json.loads(files[1].read_text())
    assert "no majority" in node1["jobs"][0]["summary"]  # 1 vs 1 on node 1 alone: nobody can tell
    # ... and its JSON names no outlier either: it says there is no majority.
    assert node1["outliers"] == [] and node1["jobs"][0]["outliers"] == []
    assert node1["no_majority"] is True and node1["jobs"][0]["no_majority"] is True

    merged_path = tmp_path / "merged.json"
    merged = run_cli(["stacks", "merge", str(files[0]), str(files[1]), "--json", str(merged_path)])
    assert merged.returncode == 1, merged.stderr
    assert (f"rank 3 is in barrier() at stacks_hang.py:{BARRIER_LINE}; "
            f"ranks 0-2 are in all_reduce() at stacks_hang.py:{ALL_REDUCE_LINE}") in merged.stdout
    doc = json.loads(merged_path.read_text())
    assert doc["outliers"] == [3] and [g["ranks"] for g in doc["groups"]] == [[0, 1, 2], [3]]
    # The same file twice does not double-count its ranks.
    again = run_cli(["stacks", "merge", str(files[0]), str(files[0])])
    assert "all 2 processes (ranks 0-1) are in all_reduce()" in again.stdout and again.returncode == 0


def test_merge_rejects_files_that_are_not_stacks_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"processes": [{"pid": 1}]}')
    cut = tmp_path / "cut.json"
    cut.write_text('{"processes": [')
    text_rank = tmp_path / "edited.json"  # hand-edited: a rank as a string used to crash the grouping
    text_rank.write_text('{"processes": [{"pid": 1, "host": "h", "rank": "0", "world_size": "4", "threads": []}]}')
    for path, text in ((bad, "is not a `ddpdoctor stacks --json` file"), (cut, "not readable JSON"),
                       (text_rank, "rank is '0', not an integer"),
                       (tmp_path / "missing.json", "no such file")):
        res = run_cli(["stacks", "merge", str(path)])
        assert res.returncode == 2 and text in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_py_spy_not_permitted_says_why_and_offers_the_fallback(tmp_path: Path) -> None:
    """Run ddpdoctor as `nobody` against root's rank: the kernel refuses ptrace, the user learns why."""
    if os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists():
        pytest.skip("needs root and setpriv to run ddpdoctor as another user")
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        res = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              sys.executable, "-m", "ddpdoctor", "stacks", "--pid", str(target.pid)],
                             capture_output=True, text=True, timeout=120, env=clean_env(), cwd="/")
    finally:
        target.kill()
        target.wait()
    assert res.returncode == 1, res.stderr
    assert f"not permitted to read pid {target.pid}: " in res.stdout
    assert "belongs to uid 0 and ddpdoctor runs as uid 65534" in res.stdout
    assert "ddpdoctor.install_stack_dumps()" in res.stdout and "--signal" in res.stdout


def test_signal_without_registered_ranks_refuses_to_signal(tmp_path: Path) -> None:
    res = _cli(["--signal", "--stack-dir", str(tmp_path)])
    assert res.returncode == 2
    assert "no live process registered" in res.stderr and "SIGUSR1 would kill it" in res.stderr


def test_unwritable_json_path_is_refused_before_any_dump(tmp_path: Path) -> None:
    target = tmp_path / "no-such-dir" / "out.json"
    res = _cli(["--pid", str(os.getpid()), "--json", str(target)])
    assert res.returncode == 2 and "does not exist" in res.stderr
    assert res.stdout == ""  # nothing was dumped or printed first
    merged = run_cli(["stacks", "merge", str(tmp_path / "a.json"), "--json", str(target)])
    assert merged.returncode == 2 and "does not exist" in merged.stderr
