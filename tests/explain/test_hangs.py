"""Probable hangs in logs (issue 26): a log that stops inside start-up or NCCL's init with no error after it.

The hangs are real: jobs on gloo and torchrun are started, left to hang until their log shows where they wait,
then killed (only the processes started here, by their process group), and their log is explained. NCCL's
init cannot run here (no GPU): its lines are quoted from NVIDIA NCCL's init.cc format and a public thread.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
import pytest

from ddpdoctor.explain import ExplainResult, explain_streams, explain_text
from tests.support import clean_env, free_port, run_cli, torchrun_cmd

WAIT_S = 120  # the most any job here may take to print where it waits (loaded CI machines are slow)


@contextmanager
def running(cmds: Sequence[tuple[list[str], dict[str, str]]], log: Path, cwd: Path) -> Iterator[None]:
    """Start ``cmds`` (argv, extra env), all writing to ``log``; kill their process groups on the way out."""
    procs = []
    with log.open("ab") as out:
        try:
            for argv, extra in cmds:
                procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                              env=clean_env({"OMP_NUM_THREADS": "1", **extra}),
                                              start_new_session=True))
            yield
        finally:
            for p in procs:
                # torchrun starts each worker in a session of its own: kill the workers too, by pid, not just
                # the launcher's process group (the log must just stop, as in a hang killed by the user).
                try:
                    family = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
                except psutil.NoSuchProcess:
                    family = []
                with suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                for pid in family:
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            for p in procs:
                p.wait(timeout=30)


def wait_for(log: Path, text: str, count: int = 1, deadline_s: float = WAIT_S) -> str:
    """The log once ``text`` is in it ``count`` times; fails after ``deadline_s`` seconds."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        data = log.read_text(errors="replace")
        if data.count(text) >= count:
            return data
        time.sleep(0.5)
    raise AssertionError(f"{text!r} never appeared {count} time(s) in {log}:\n{log.read_text()[-3000:]}")


def explain_json(*paths: Path) -> tuple[int, list[dict]]:
    proc = run_cli(["explain", "--json", "-", *map(str, paths)])
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)["diagnoses"]


# --- real hangs -----------------------------------------------------------------------------------------

BARRIER_JOB = textwrap.dedent("""\
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()}: process group up", flush=True)
    if dist.get_rank() == 0:
        dist.new_group([0])  # TORCH_DIST_INIT_BARRIER=1: a store-based barrier over every rank
    else:
        time.sleep(600)  # rank 1 never calls new_group
""")


@pytest.mark.slow
def test_real_job_stuck_in_the_store_barrier(tmp_path: Path) -> None:
    """Rank 0 waits in new_group's store-based barrier for rank 1, which never comes: with TORCH_LOGS=+distributed
    torch 2.13 logs "Waiting in store based barrier ... secondsrank: 0, ... num_workers_joined=1 ..." every ~10 s
    (distributed_c10d._store_based_barrier) and nothing else."""
    (tmp_path / "job.py").write_text(BARRIER_JOB)
    log, port = tmp_path / "train.log", str(free_port())
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCH_DIST_INIT_BARRIER": "1",
           "TORCH_LOGS": "+distributed"}
    with running([([sys.executable, "job.py"], {**env, "RANK": str(r)}) for r in (0, 1)], log, tmp_path):
        wait_for(log, "Waiting in store based barrier")
    code, diags = explain_json(log)
    assert code == 1
    hang = diags[0]
    assert (hang["id"], hang["ranks"], hang["caused_by"]) == ("probable-hang", [0], None)
    assert hang["details"]["phase"] == ["store barrier"]
    assert hang["details"]["world_size"] == ["2"] and hang["details"]["workers_joined"] == ["1"]
    assert hang["details"]["ranks_not_seen"] == ["1"]
    assert "Waiting in store based barrier" in hang["evidence"][-1]["text"]
    report = run_cli(["explain", str(log)]).stdout
    assert "next: ddpdoctor stacks" in report and "ddpdoctor watch" in report


@pytest.mark.slow
def test_real_torchrun_stuck_in_the_rendezvous(tmp_path: Path) -> None:
    """torchrun --nnodes=2 started on one node only: its agent logs "[default] Rendezvous'ing worker group"
    (LOGLEVEL=INFO; torch/distributed/elastic/agent/server/api.py) and waits for the other node."""
    (tmp_path / "job.py").write_text("print('never started')\n")
    log = tmp_path / "node0.log"
    argv = [*torchrun_cmd(), "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", "job.py"]
    with running([(argv, {"LOGLEVEL": "INFO"})], log, tmp_path):
        wait_for(log, "Rendezvous'ing worker group")
        time.sleep(2)  # nothing else comes
    code, diags = explain_json(log)
    assert code == 1
    assert [(d["id"], d["details"].get("phase")) for d in diags] == [("probable-hang", ["rendezvous"])]
    assert "never started" not in log.read_text()


def _reset_every_connection(port: int, stop: threading.Event) -> None:
    """A listener that accepts and closes each connection at once: a port held by something that is not the
    store (the TCPStore client's validation fails and it retries)."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(16)
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.close()


@pytest.mark.slow
def test_real_rank_stuck_connecting_to_the_store(tmp_path: Path) -> None:
    """MASTER_PORT held by something that is not the store: the rank logs TCPStore.cpp's "TCP client failed to
    connect/validate to host 127.0.0.1:P - retrying (try=N, ...)" warnings, each with c10's C++ stack, forever."""
    port = free_port()
    stop = threading.Event()
    holder = threading.Thread(target=_reset_every_connection, args=(port, stop), daemon=True)
    holder.start()
    try:
        (tmp_path / "job.py").write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n")
        log = tmp_path / "rank1.log"
        env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        with running([([sys.executable, "job.py"], env)], log, tmp_path):
            wait_for(log, "- retrying (try=", count=3)
    finally:
        stop.set()
        holder.join(timeout=10)
    code, diags = explain_json(log)
    assert code == 1
    hang = diags[0]
    assert (hang["id"], hang["details"]["phase"]) == ("probable-hang", ["store connect"])
    assert hang["details"]["endpoint"] == [f"127.0.0.1:{port}"] and hang["ranks"] == [1]


TRAINING_JOB = textwrap.dedent("""\
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    for step in range(STEPS):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()} step {step} loss {1.0 / (step + 1):.4f}", flush=True)
        time.sleep(0.3)
""")


@pytest.mark.slow
def test_a_log_that_ends_after_healthy_steps_is_not_a_hang(tmp_path: Path) -> None:
    """The same rendezvous and start-up lines, then training steps: a finished run and a run killed in the
    middle of its steps (the log just stops) are both exit 0."""
    def torchrun() -> list[str]:
        return [*torchrun_cmd(), "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                "job.py"]

    log = tmp_path / "done.log"
    (tmp_path / "job.py").write_text(TRAINING_JOB.replace("STEPS", "3"))
    with log.open("wb") as out:
        done = subprocess.run(torchrun(), stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, timeout=WAIT_S,
                              env=clean_env({"LOGLEVEL": "INFO", "OMP_NUM_THREADS": "1"}))
    assert done.returncode == 0
    assert "Rendezvous'ing worker group" in log.read_text()
    assert explain_json(log) == (0, [])
    killed = tmp_path / "killed.log"
    (tmp_path / "job.py").write_text(TRAINING_JOB.replace("STEPS", "1000"))
    with running([(torchrun(), {"LOGLEVEL": "INFO"})], killed, tmp_path):
        wait_for(killed, "step 5 loss")
    assert explain_json(killed) == (0, [])


# --- NCCL's init: texts (no GPU here) ----------------------------------------------------------------------

# ParCIS/Chimera#2 ("NCCL stuck"): both ranks log Init START, set up their channels, and the log ends.
# NCCL 2.28's init.cc prints "[Rank %d] %s comm %p rank %d nranks %d ... - Init START" (the newer form, below).
NCCL_INIT_STUCK = """\
gpt-dev-ppt:65959:67395 [1] NCCL INFO Using network Socket
gpt-dev-ppt:65958:67394 [0] NCCL INFO comm 0x5599f9cc8900 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0x1ad9716b1600c155 - Init START
gpt-dev-ppt:65959:67395 [1] NCCL INFO comm 0x55ed37268f30 rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 1c000 commId 0x1ad9716b1600c155 - Init START
gpt-dev-ppt:65958:67394 [0] NCCL INFO Setting affinity for GPU 0 to ff00ff
gpt-dev-ppt:65959:67395 [1] NCCL INFO Setting affinity for GPU 1 to ff00ff
gpt-dev-ppt:65958:67394 [0] NCCL INFO Channel 00/02 :    0   1
gpt-dev-ppt:65958:67394 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1
gpt-dev-ppt:65958:67394 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct
gpt-dev-ppt:65959:67395 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct
gpt-dev-ppt:65958:67394 [0] NCCL INFO Connected all rings
gpt-dev-ppt:65958:67394 [0] NCCL INFO Connected all trees
"""
NCCL_2_28_START = ("node-a:4001:4071 [0] NCCL INFO [Rank 0] ncclCommInitRankConfig comm 0x55d1c7f0a000 rank 0 nranks 2 "
                   "cudaDev 0 nvmlDev 0 busId 1b000 commId 0x8e3c1a2b4d5e6f70 - Init START\n")
NCCL_2_28_COMPLETE = ("node-a:4001:4071 [0] NCCL INFO ncclCommInitRankConfig comm 0x55d1c7f0a000 rank 0 nranks 2 "
                      "cudaDev 0 nvmlDev 0 busId 1b000 commId 0x8e3c1a2b4d5e6f70 - Init COMPLETE\n")


def first(result: ExplainResult) -> tuple[str, list[int], list[str]] | None:
    if not result.diagnoses:
        return None
    d = result.diagnoses[0]
    return d.id, sorted(d.ranks), d.details.get("phase", [])


def test_nccl_init_start_without_complete_is_a_hang_inside_init() -> None:
    assert first(explain_text(NCCL_INIT_STUCK)) == ("probable-hang", [0, 1], ["NCCL communicator init"])
    assert first(explain_text(NCCL_2_28_START)) == ("probable-hang", [0], ["NCCL communicator init"])
    assert explain_text(NCCL_2_28_START + NCCL_2_28_COMPLETE).diagnoses == []  # an excerpt that completed


def test_nccl_init_then_nothing_is_a_hang_at_the_first_collective_only_in_a_whole_job_log() -> None:
    """The job's own output, rank 0's "NCCL version" line, every communicator complete, then nothing: the
    first collective never finished. The same NCCL lines pasted alone prove nothing (a healthy job's are the
    same; tests/data/real_logs/healthy_nccl_info_64_ranks_socket.log is such an excerpt)."""
    nccl = ("node-a:4001:4071 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n" + NCCL_2_28_START + NCCL_2_28_COMPLETE)
    job = "[rank0]: loading 128 shards\n[rank0]: model ready, 1.3B parameters\n"
    assert first(explain_text(job + nccl)) == ("probable-hang", [0], ["first collective"])
    assert explain_text(nccl).diagnoses == []
    assert explain_text(job + nccl + "[rank0]: step 1 loss 2.3012\n").diagnoses == []


def test_a_scripts_distributed_init_lines_then_nothing_is_a_hang_in_init_process_group() -> None:
    """facebookresearch's init_distributed_mode (DeiT, MAE, DINO and their copies) prints this line on every rank
    right before init_process_group and a barrier; rank 0 goes on printing after them. Nothing after: a hang there."""
    init = "".join(f"| distributed init (rank {r}): env://, gpu {r}\n" for r in (2, 0, 3))
    assert first(explain_text(init)) == ("probable-hang", [0, 2, 3], ["init_process_group"])
    assert explain_text(init + "job dir: /work/mae\nNamespace(batch_size=64, epochs=400)\n").diagnoses == []


# Lightning's lines (lightning/fabric/utilities/distributed.py, _init_dist_connection): every rank logs its
# "Initializing distributed" line right before init_process_group; rank 0 prints the banner once it returned.
RULE = "-" * 100 + "\n"
LIGHTNING_UP = RULE + "distributed_backend=nccl\nAll distributed processes registered. Starting with 2 processes\n" + RULE


def test_lightnings_init_lines_then_nothing_is_a_hang_in_its_init_process_group() -> None:
    init = "".join(f"Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/4\n" for r in (1, 3, 0))
    assert first(explain_text(init)) == ("probable-hang", [0, 1, 3], ["Lightning's init_process_group"])
    # PyTorch Lightning 1.x's wording, behind Python logging's prefix.
    assert first(explain_text("INFO:lightning:initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/2\n")) == (
        "probable-hang", [1], ["Lightning's init_process_group"])


def test_lightnings_banner_then_nothing_is_a_hang_at_the_start_of_training() -> None:
    """The process group came up (rank 0's banner) and the job printed nothing of its training after it: the
    ranks wait in the first collective (DDP's parameter broadcast, NCCL's communicator set-up). A healthy job
    prints its LOCAL_RANK lines, a model summary or progress right after the banner."""
    init = "".join(f"Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/2\n" for r in (0, 1))
    result = explain_text(init + LIGHTNING_UP)
    assert first(result) == ("probable-hang", [], ["Lightning's start of training"])
    assert "DDP's parameter broadcast" in " ".join(result.diagnoses[0].notes)
    assert explain_text(init + LIGHTNING_UP + "\nLOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1]\n").diagnoses == []


# A traceback right under Lightning's init line, cut in Lightning's own frames: its init_process_group failed.
LIGHTNING_CUT = """GPU available: True, used: True
LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1]
initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/2
Traceback (most recent call last):
  File "{root}project/train.py", line 74, in main
    trainer.fit(model, datamodule=data)
  File "{root}envs/pl/lib/site-packages/pytorch_lightning/trainer/trainer.py", line 445, in fit
"""


def test_a_traceback_cut_right_under_lightnings_init_line_is_its_init_process_group() -> None:
    """On Windows (its paths), where PyTorch has no NCCL and Lightning on GPUs asks for it: probably no NCCL,
    with Lightning's line quoted; on Linux the same cut is named as a traceback cut in init_process_group."""
    on_windows = explain_text(LIGHTNING_CUT.format(root="D:\\work\\"))
    d = on_windows.diagnoses[0]
    assert (d.id, sorted(d.ranks)) == ("nccl-not-available", [0]) and "Lightning's 'initializing' line" in d.signature.title
    assert "initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/2" in [e.text for e in d.evidence]
    on_linux = explain_text(LIGHTNING_CUT.format(root="/home/me/"))
    assert [(d.id, d.details.get("stage")) for d in on_linux.diagnoses] == [("traceback-cut", ["init"])]


# --- what a hang is not ------------------------------------------------------------------------------------

# store_barrier_waiting_one_line_day_timeout.log's line (torch 1.x INFO), then the error torch raises when the
# barrier times out (distributed_c10d._store_based_barrier, torch 2.13).
BARRIER_WAIT = ("Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:1 "
                "(world_size=2, worker_count=1, timeout=0:30:00)\n")
BARRIER_TIMEOUT = ("torch.distributed.DistStoreError: Timed out initializing process group in store based barrier on "
                   "rank 0, for key: store_based_barrier_key:1 (world_size=2, num_workers_joined=1, timeout=0:30:00 "
                   "error=Wait timeout)\n")


def test_an_error_after_the_wait_ends_the_phase_no_hang() -> None:
    result = explain_text(BARRIER_WAIT * 3 + BARRIER_TIMEOUT)
    assert "probable-hang" not in [d.id for d in result.diagnoses] and result.diagnoses


def test_a_hang_on_a_rank_whose_peer_crashed_is_the_peers_echo(tmp_path: Path) -> None:
    """rank 0 waits in the barrier; rank 1's log shows why: it raised before reaching it."""
    rank0 = "[rank0]: " + BARRIER_WAIT
    rank1 = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"/workspace/train.py\", line 40, in <module>\n"
             "[rank1]:     shards = index[\"val\"]\n[rank1]: KeyError: 'val'\n")
    result = explain_streams([("rank0.log", io.BytesIO(rank0.encode()), 0), ("rank1.log", io.BytesIO(rank1.encode()), 1)])
    assert [(d.id, d.caused_by) for d in result.diagnoses] == [("python-exception", None),
                                                                ("probable-hang", "python-exception")]


def test_a_phase_line_cut_inside_its_marker_word_is_still_found() -> None:
    """Where the input ends is read only when its tail holds a marker word (phases.where_input_ends' quick test,
    which spares a trainer logging at INFO level the classification of 1 MiB of lines); the test joins the tail's
    lines first, so a terminal that cut the waiting line inside "store based barrier", quoted or not, still
    leaves a probable hang."""
    line = "INFO:torch.distributed.distributed_c10d:" + BARRIER_WAIT.rstrip("\n")
    width = line.index("store based bar") + len("store based bar")  # 66 columns: the cut is inside the word
    wrapped = "".join("\n".join(line[k:k + width] for k in range(0, len(line), width)) + "\n" for _ in range(2))
    assert "store based barrier" not in wrapped
    assert first(explain_text(wrapped)) == ("probable-hang", [0], ["store barrier"])
    quoted = "".join(f"> {piece}\n" for piece in wrapped.splitlines())
    assert first(explain_text(quoted)) == ("probable-hang", [0], ["store barrier"])
    # A long tail of trainer INFO lines before the wait (no marker word among them) changes nothing.
    info = "".join(f"2024-05-01 10:00:{i % 60:02d},000 - INFO - train.py:212 - step {i} loss 2.3\n" for i in range(9000))
    assert first(explain_text(info + BARRIER_WAIT)) == ("probable-hang", [0], ["store barrier"])
    assert explain_text(info).diagnoses == []
