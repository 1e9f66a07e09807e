"""Grouping, naming and parsing for `ddpdoctor stacks` (pure functions), plus SLURM-style discovery.

The SLURM test runs real processes whose environment carries the variables ``srun`` sets (no SLURM on
this machine): a ``bash`` task wrapper and the Python rank under it, as ``srun bash -c 'python ...'`` does.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ddpdoctor.stacks.engine import discover
from ddpdoctor.stacks.ident import identity, is_rank_env, job_key
from ddpdoctor.stacks.model import Frame, ProcessStacks, ThreadStack, analyze, format_ranks, position
from ddpdoctor.stacks.report import to_json
from ddpdoctor.stacks.signal_dumps import parse_faulthandler
from tests.support import clean_env, run_cli

SITE = "/venv/lib/python3.11/site-packages"
ALL_REDUCE = [Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 3252),
              Frame("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
              Frame("train_step", "/job/train.py", 55), Frame("main", "/job/train.py", 90)]
BARRIER = [Frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 5356),
           Frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
           Frame("checkpoint", "/job/train.py", 80), Frame("main", "/job/train.py", 92)]


def proc(rank: int, frames: list[Frame], host: str = "node-a") -> ProcessStacks:
    return ProcessStacks(pid=1000 + rank, host=host, rank=rank, world_size=4, local_world_size=4,
                         job="torchrun:none@10.0.0.1:29500",
                         threads=[ThreadStack(1, "MainThread", True, frames)])


def test_position_skips_wrappers_and_native_frames() -> None:
    native = [Frame("pthread_cond_wait", "/usr/lib/libc.so.6", 0),
              Frame("c10d::Work::wait", "/venv/lib/libtorch_cpu.so", 0), *ALL_REDUCE]
    pos = position(native)
    assert pos.call == "all_reduce" and pos.user == Frame("train_step", "/job/train.py", 55)
    assert pos.describe() == "in all_reduce() at train.py:55"
    sleeping = position([Frame("load_batch", "/job/train.py", 38), Frame("main", "/job/train.py", 90)])
    assert sleeping.describe() == "at train.py:38 in load_batch() (not in a torch.distributed call)"


def test_outlier_named_and_ranks_compressed() -> None:
    reports = analyze([proc(0, ALL_REDUCE), proc(1, BARRIER), proc(2, ALL_REDUCE), proc(3, ALL_REDUCE)])
    assert reports[0].summary() == ("rank 1 is in barrier() at train.py:80; "
                                    "ranks 0,2-3 are in all_reduce() at train.py:55")
    assert [p.rank for p in reports[0].outliers] == [1]
    doc = to_json([], reports, "py-spy", host="node-a")
    assert doc["outliers"] == [1] and doc["groups"][0]["where"] == "train.py:55 in train_step"
    # The rank list every command writes (ddpdoctor.ranks): runs of 2+ become ranges.
    assert format_ranks([proc(r, ALL_REDUCE) for r in (8, 0, 1, 2, 3, 5, 7)]) == "ranks 0-3,5,7-8"
    unknown = [ProcessStacks(pid=p, host="h") for p in (913, 77)]
    assert format_ranks([proc(2, ALL_REDUCE), *unknown]) == "rank 2 and pids 77,913"


def test_missing_rank_of_a_single_node_job_is_named() -> None:
    reports = analyze([proc(0, ALL_REDUCE), proc(2, ALL_REDUCE), proc(3, ALL_REDUCE)])
    assert reports[0].missing_ranks == [1] and reports[0].problem
    # One node of a multi-node job cannot know about the other nodes' ranks.
    partial = [proc(0, ALL_REDUCE), proc(1, ALL_REDUCE)]
    for p in partial:
        p.local_world_size = 2
    assert analyze(partial)[0].missing_ranks == [] and not analyze(partial)[0].problem


def test_tie_prefers_the_rank_outside_any_collective_as_outlier() -> None:
    sleeping = [Frame("load_batch", "/job/train.py", 38)]
    report = analyze([proc(0, ALL_REDUCE), proc(1, sleeping)])[0]
    assert [p.rank for p in report.outliers] == [1]
    assert report.summary().startswith("rank 1 is at train.py:38 in load_batch()")
    # Two ranks, two different collectives: nobody can say which one is wrong, and the report says so.
    split = analyze([proc(0, ALL_REDUCE), proc(1, BARRIER)])[0]
    assert split.tie and split.summary().startswith("no majority: rank 1 is in barrier()")
    # ... and the JSON says the same: no outlier named, the tie stated, still a problem (exit 1).
    assert split.outliers == [] and split.problem
    doc = to_json([], [split], "py-spy", host="node-a")
    assert doc["outliers"] == [] and doc["no_majority"] is True
    assert doc["jobs"][0]["outliers"] == [] and doc["jobs"][0]["no_majority"] is True
    # Two tied groups and a smaller third: only the third is an outlier.
    sleeping_rank = [proc(0, ALL_REDUCE), proc(1, ALL_REDUCE), proc(2, BARRIER), proc(3, BARRIER),
                     ProcessStacks(pid=1099, host="node-a", rank=4, world_size=5, local_world_size=5,
                                   job="torchrun:none@10.0.0.1:29500",
                                   threads=[ThreadStack(1, "MainThread", True, sleeping)])]
    three = analyze(sleeping_rank)[0]
    assert three.tie and [p.rank for p in three.outliers] == [4]
    assert to_json([], [three], "py-spy")["jobs"][0]["outliers"] == [4]
    majority = to_json([], [report], "py-spy", host="node-a")
    assert majority["no_majority"] is False and majority["jobs"][0]["no_majority"] is False


def test_parse_faulthandler_output_of_a_real_dump() -> None:
    with tempfile.TemporaryFile("w+") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
        fh.seek(0)
        import threading

        threads = parse_faulthandler(fh.read(), threading.main_thread().ident)
    main = [t for t in threads if t.main]
    assert len(main) == 1 and main[0].name == "MainThread"
    assert main[0].frames[0].function == "test_parse_faulthandler_output_of_a_real_dump"
    assert main[0].frames[0].file == __file__


def test_identity_from_torchrun_and_slurm_environments() -> None:
    torchrun = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert is_rank_env(torchrun) and identity(torchrun).rank == 3
    assert job_key(torchrun) == "torchrun:none@10.0.0.1:29500"
    slurm = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "77",
             "SLURM_STEP_ID": "0"}
    ident = identity(slurm)
    assert (ident.rank, ident.local_rank, ident.world_size, ident.job) == (5, 1, 8, "slurm:77.0")
    assert not is_rank_env({"RANK": "0"})  # a stray RANK without a launcher is not a DDP rank


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc environments")
def test_slurm_tasks_found_by_environment_and_wrapper_shell_dropped() -> None:
    job_id = f"9{os.getpid()}"
    tasks = []
    try:
        for rank in (0, 1):
            env = clean_env({"SLURM_JOB_ID": job_id, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
                             "SLURM_LOCALID": str(rank), "SLURM_NTASKS": "2"})
            # `exec` is avoided on purpose: bash stays the parent, carrying the same SLURM variables.
            tasks.append(subprocess.Popen(
                ["bash", "-c", f"{sys.executable} -c 'import time; time.sleep(600)'; true"],
                env=env, start_new_session=True))
        deadline = time.monotonic() + 60
        res = run_cli(["stacks", "--job", f"{job_id}.0"])
        while "all 2 processes" not in res.stdout and time.monotonic() < deadline:
            time.sleep(0.5)  # the Python children may not have started yet
            res = run_cli(["stacks", "--job", f"{job_id}.0"])
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"job slurm:{job_id}.0: 2 processes" in res.stdout
        assert "all 2 processes (ranks 0-1) are at <string>:1 in <module>()" in res.stdout
    finally:
        for task in tasks:
            os.killpg(task.pid, 9)
            task.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc environments")
def test_torchrun_worker_found_under_an_agent_whose_environment_has_rank(tmp_path: Path) -> None:
    """Kubeflow's PyTorchJob (or `export RANK=...; torchrun --node_rank=$RANK`) gives the agent itself a
    RANK; a worker whose environment cannot tell (here: emptied) is still its child."""
    agent_script = tmp_path / "torchrun_agent.py"  # "torchrun" in the command line, as the real agent has
    agent_script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], env={})\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n")
    agent = subprocess.Popen([sys.executable, str(agent_script)], stdout=subprocess.PIPE, text=True,
                             env=clean_env({"RANK": "0", "WORLD_SIZE": "2"}), start_new_session=True)
    try:
        assert agent.stdout is not None
        worker = int(agent.stdout.readline())
        found = [c.proc.pid for c in discover(job=str(agent.pid))]
        assert found == [worker]
    finally:
        os.killpg(agent.pid, 9)
        agent.wait(timeout=60)


def test_frames_are_frozen_and_group_ranks_as_dict_keys() -> None:
    frame = Frame("all_reduce", "/x/torch/distributed/distributed_c10d.py", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        frame.line = 4  # type: ignore[misc]
    assert {frame: 1}[Frame("all_reduce", "/x/torch/distributed/distributed_c10d.py", 3)] == 1
