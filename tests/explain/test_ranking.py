"""Root cause first by evidence (issue 26): causal links, which rank ended first, errors before warnings.

Every text is real: captured here from real jobs (torch 2.13, gloo, torchrun), or quoted from the public thread
named next to it, or a source's format string (file named). Where a fixture joins real lines of one thread
into one consistent log, the comment says which lines and why.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest

from ddpdoctor.explain import ExplainResult, explain_streams, explain_text, rank_from_path, render_text
from tests.support import REPO, clean_env, free_port, run_cli, torchrun_cmd

EXAMPLES = REPO / "examples" / "logs"


def ids(result: ExplainResult) -> list[str]:
    return [d.id for d in result.diagnoses]


def tree(result: ExplainResult) -> list[tuple[str, str | None]]:
    """(id, caused_by) of every diagnosis, in report order."""
    return [(d.id, d.caused_by) for d in result.diagnoses]


def explain_files(*paths: Path) -> ExplainResult:
    with ExitStack() as stack:
        return explain_streams([(str(p), stack.enter_context(p.open("rb")), rank_from_path(str(p))) for p in paths])


# --- a watchdog timeout before the SIGABRT it caused -------------------------------------------------------

# huggingface/picotron_tutorial#6: ranks 2 and 3's watchdog lines, verbatim (torch 2.x before the [rankN]:
# prefix). The thread's summary quotes the entries of other ranks (0, 7: "exitcode : -6", "Signal 6 (SIGABRT)
# received by PID ...", same host and time) and elides ranks 2 and 3's; their entries below are written in
# the summary's own format (torch/distributed/elastic/multiprocessing/errors/__init__.py, _format_failure)
# with the thread's host, time and the pids next to the quoted ones.
WATCHDOG_RANKS_2_3 = """\
[E ProcessGroupNCCL.cpp:915] [Rank 2] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=120000) ran for 120822 milliseconds before timing out.
terminate called after throwing an instance of 'std::runtime_error'
  what():  [Rank 2] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=120000) ran for 120822 milliseconds before timing out.
[E ProcessGroupNCCL.cpp:488] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[E ProcessGroupNCCL.cpp:494] To avoid data inconsistency, we are taking the entire process down.
[E ProcessGroupNCCL.cpp:915] [Rank 3] NCCL watchdog thread terminated with exception: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=120000) ran for 120823 milliseconds before timing out.
"""
SUMMARY_RANKS_2_3 = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=====================================================
train.py FAILED
-----------------------------------------------------
Failures:
[1]:
  time      : 2025-05-01_11:12:35
  host      : 472a4389fceb
  rank      : 3 (local_rank: 3)
  exitcode  : -6 (pid: 3434)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 3434
-----------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-05-01_11:12:35
  host      : 472a4389fceb
  rank      : 2 (local_rank: 2)
  exitcode  : -6 (pid: 3433)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 3433
=====================================================
"""


@pytest.mark.parametrize("order", ["log-then-summary", "summary-then-log"])
def test_watchdog_timeout_comes_before_the_sigabrt_it_caused(order: str) -> None:
    """The watchdog aborts its process after a timeout ("we are taking the entire process down"): the SIGABRT
    torchrun reports is that abort, shown under the timeout, whatever the order of the inputs. Before issue 26
    the SIGABRT came first (a signal's precedence) and the timeout second, as a rival."""
    streams = [("train.log", WATCHDOG_RANKS_2_3), ("console.log", SUMMARY_RANKS_2_3)]
    if order == "summary-then-log":
        streams.reverse()
    result = explain_streams([(name, io.BytesIO(text.encode()), None) for name, text in streams])
    assert tree(result) == [("nccl-timeout", None), ("worker-killed-by-signal", "nccl-timeout")]
    assert [d.id for d in result.problems] == ["nccl-timeout"]
    timeout, abort = result.diagnoses
    assert timeout.ranks == {2, 3} and abort.ranks == {2, 3} and abort.details["signal"] == ["SIGABRT"]
    report = render_text(result)
    assert report.startswith("ddpdoctor explain: 1 known problem found")
    assert report.index("[nccl-timeout]") < report.index("consequences (explained by the above") < report.index(
        "[worker-killed-by-signal]")


def test_a_sigkill_is_not_the_watchdogs_doing() -> None:
    """The link is declared for SIGABRT only: a rank SIGKILLed (the OOM killer, the scheduler) next to a
    timeout stays a problem of its own, and it comes first (the others time out because it died)."""
    summary = SUMMARY_RANKS_2_3.replace("-6 (pid", "-9 (pid").replace("Signal 6 (SIGABRT)", "Signal 9 (SIGKILL)")
    result = explain_text(WATCHDOG_RANKS_2_3 + summary)
    assert tree(result)[:2] == [("worker-killed-by-signal", None), ("nccl-timeout", None)]


# --- the kernel's OOM killer before the SIGKILL ---------------------------------------------------------------

# Linux mm/oom_kill.c (__oom_kill_process) prints "%s: Killed process %d (%s) total-vm:%lukB, anon-rss:%lukB,
# file-rss:%lukB, shmem-rss:%lukB, UID:%u pgtables:%lukB oom_score_adj:%hd" (message: "Out of memory" or
# "Memory cgroup out of memory"); kernels before 4.x printed "Killed process %d (%s) total-vm:...". As `dmesg -T`
# shows it, naming pid 4569: the rank examples/logs/torchrun_sigkill.log (a real run) reports SIGKILLed.
OOM_KILL_4569 = ("[Sat Nov 22 01:39:40 2026] Out of memory: Killed process 4569 (python) total-vm:31457280kB, "
                 "anon-rss:30408704kB, file-rss:4096kB, shmem-rss:0kB, UID:0 pgtables:60000kB oom_score_adj:0\n")
OLD_OOM_KILL_4569 = ("[ 5120.417001] Killed process 4569 (python) total-vm:31457280kB, anon-rss:30408704kB, "
                     "file-rss:4096kB\n")


@pytest.mark.parametrize("kernel_line", [OOM_KILL_4569, OLD_OOM_KILL_4569, OOM_KILL_4569.replace(
    "Out of memory", "Memory cgroup out of memory")])
def test_oom_killer_comes_before_the_sigkill_of_the_same_pid(tmp_path: Path, kernel_line: str) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text(kernel_line)
    result = explain_files(EXAMPLES / "torchrun_sigkill.log", kern)
    assert tree(result) == [("host-oom-killed", None), ("worker-killed-by-signal", "host-oom-killed"),
                            ("remote-process-exited", "worker-killed-by-signal")]
    assert result.diagnoses[0].details["pid"] == ["4569"]


def test_an_oom_kill_of_another_pid_explains_nothing(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text(OOM_KILL_4569.replace("4569", "4211"))
    result = explain_files(EXAMPLES / "torchrun_sigkill.log", kern)
    assert ("worker-killed-by-signal", None) in tree(result)


# --- errors before warnings printed earlier ------------------------------------------------------------------

NCCL_ON_CPU_BUILD = textwrap.dedent("""\
    import torch.distributed as dist


    def main() -> None:
        dist.init_process_group("nccl")


    main()
""")


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").distributed.is_nccl_available(), reason="needs a torch build without NCCL")
def test_missing_master_addr_comes_before_the_nccl_warning_printed_first(tmp_path: Path) -> None:
    """Issue 26's seed000, reproduced: `init_process_group("nccl")` on a build without NCCL and without
    MASTER_ADDR first warns "NCCL support is not compiled" (distributed_c10d._get_default_timeout), then fails
    on MASTER_ADDR (rendezvous._env_error). The warning is not why the run ended."""
    (tmp_path / "job.py").write_text(NCCL_ON_CPU_BUILD)
    with (tmp_path / "seed.log").open("wb") as out:
        job = subprocess.run([sys.executable, "job.py"], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                             timeout=120, env=clean_env({"RANK": "0", "WORLD_SIZE": "2"}))
    assert job.returncode != 0
    text = (tmp_path / "seed.log").read_text()
    assert text.index("NCCL support is not compiled") < text.index("MASTER_ADDR expected, but not set")
    proc = run_cli(["explain", "--json", "-", str(tmp_path / "seed.log")])
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)["diagnoses"]
    assert [(d["id"], d["level"]) for d in data] == [("env-not-set", "error"), ("nccl-not-available", "warning")]
    assert data[0]["details"]["frame"] == [f"{tmp_path / 'job.py'}:5 in main"]
    text_report = run_cli(["explain", str(tmp_path / "seed.log")]).stdout
    assert "(seen in warnings only)" in text_report.split("[nccl-not-available]")[1]


def test_the_warning_alone_is_still_reported() -> None:
    """tests/data/real_logs/nccl_not_compiled_userwarning.log's thread: the warning is all the log has."""
    line = ("D:\\Python39\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py:613: UserWarning: Attempted "
            "to get default timeout for nccl backend, but NCCL support is not compiled\n")
    result = explain_text(line)
    assert [(d.id, d.level) for d in result.diagnoses] == [("nccl-not-available", "warning")]


# --- echoes on other ranks, and a fallback that names the exception -----------------------------------------

ECHO_JOB = textwrap.dedent("""\
    import time

    import torch
    import torch.distributed as dist


    def load_batch(step: int) -> torch.Tensor:
        if dist.get_rank() == 1 and step == 2:
            raise ValueError(f"batch {step} has 0 samples")
        return torch.ones(4)


    def main() -> None:
        dist.init_process_group("gloo")
        for step in range(4):
            t = load_batch(step)
            dist.all_reduce(t)
            print(f"step {step} loss {t.sum().item():.1f}", flush=True)
            time.sleep(0.2)


    main()
""")


def _torchrun(tmp_path: Path, script: str, *extra: str) -> tuple[Path, list[Path]]:
    """Run ``script`` on 2 local ranks under a real torchrun; (console log, [rank 0's stderr, rank 1's])."""
    (tmp_path / "job.py").write_text(script)
    logdir = tmp_path / "logs"
    job = subprocess.run(
        [*torchrun_cmd(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         # A slow monitor: torchrun must not stop rank 0 before it prints gloo's "peer went away" error.
         "--monitor-interval", "3", "--log-dir", str(logdir), "--redirects", "3", *extra, "job.py"],
        capture_output=True, text=True, timeout=180, env=clean_env({"OMP_NUM_THREADS": "1"}), cwd=tmp_path)
    assert job.returncode != 0, job.stdout[-2000:] + job.stderr[-2000:]
    console = tmp_path / "console.log"
    console.write_text(job.stdout + job.stderr)
    ranks = sorted(logdir.rglob("stderr.log"), key=lambda p: rank_from_path(str(p)) or 0)
    assert [rank_from_path(str(p)) for p in ranks] == [0, 1]
    return console, ranks


@pytest.mark.slow
def test_unknown_exception_names_the_rank_its_error_and_frame_and_the_peers_echo_goes_under_it(
        tmp_path: Path) -> None:
    """A real gloo job: rank 1 raises an exception no signature knows; rank 0 then fails in all_reduce with
    gloo's "Connection closed by peer". torchrun's summary calls rank 0 the root cause (both exit codes seen in
    one poll, no error files): the evidence says rank 1, whatever the order of the inputs."""
    console, (rank0, rank1) = _torchrun(tmp_path, ECHO_JOB)
    assert "Root Cause (first observed failure)" in console.read_text()
    for inputs in ([console, rank0, rank1], [rank1, rank0, console], [rank0, rank1]):
        result = explain_files(*inputs)
        assert [d.id for d in result.problems] == ["python-exception"], (inputs, tree(result))
        head = result.diagnoses[0]
        assert head.ranks == {1} and head.first_rank == 1
        first = head.first_event
        assert first is not None and (first.exception, first.message) == ("ValueError", "batch 2 has 0 samples")
        assert first.frame == f"{tmp_path / 'job.py'}:9 in load_batch"  # its own frame, not torch's
        echo = next(d for d in result.diagnoses if d.id == "remote-process-exited")
        assert (echo.ranks, echo.caused_by) == ({0}, "python-exception")
    report = run_cli(["explain", str(console), str(rank0), str(rank1)]).stdout
    assert f"1. Rank 1 raised ValueError: batch 2 has 0 samples  (at {tmp_path / 'job.py'}:9 in load_batch)" in report
    assert "A rank raised a Python exception" not in report


FIRST_FAILURE_JOB = textwrap.dedent("""\
    import signal
    import time

    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record


    def check_shards(rank: int) -> None:
        if rank == 1:
            raise KeyError("shard-00017 missing from the index")
        # Rank 0 fails two seconds later with another error. torchrun stops the other ranks with SIGTERM as
        # soon as it sees rank 1's exit; ignoring it lets rank 0's own failure happen, whatever the timing.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(2)
        raise FileNotFoundError("/data/val/shard-00003.tar")


    @record
    def main() -> None:
        dist.init_process_group("gloo")
        dist.barrier()
        check_shards(dist.get_rank())


    main()
""")


@pytest.mark.slow
def test_first_rank_by_torchruns_first_observed_failure_not_by_input_order(tmp_path: Path) -> None:
    """Two ranks raise unknown exceptions, rank 1 two seconds before rank 0; the lines carry no time stamps.
    torchrun's summary names rank 1 the first observed failure: that, not the input order (rank 0's file
    first), says which rank failed first."""
    console, (rank0, rank1) = _torchrun(tmp_path, FIRST_FAILURE_JOB)
    summary = console.read_text()
    assert summary.index("Root Cause (first observed failure)") < summary.index("rank      : 1 (local_rank: 1)")
    assert "FileNotFoundError" in rank0.read_text() and "KeyError" in rank1.read_text()
    result = explain_files(rank0, rank1, console)
    head = result.diagnoses[0]
    assert head.id == "python-exception" and head.ranks == {0, 1}
    assert (head.first_rank, head.first_rank_by) == (1, "torchrun's first observed failure")
    assert head.first_event is not None and head.first_event.exception == "KeyError"
    assert head.first_event.frame == f"{tmp_path / 'job.py'}:10 in check_shards"
    data = json.loads(run_cli(["explain", "--json", "-", str(rank0), str(rank1), str(console)]).stdout)
    first = data["diagnoses"][0]
    assert (first["first_rank"], first["first_rank_by"]) == (1, "torchrun's first observed failure")
    assert first["exception"] == {"exception": "KeyError", "message": "'shard-00017 missing from the index'",
                                  "frame": f"{tmp_path / 'job.py'}:10 in check_shards"}


def test_time_stamps_refute_an_echo_that_came_first(tmp_path: Path) -> None:
    """rank 0's watchdog timed out at 01:30 and torchrun saw rank 1 fail at 01:40 (its agent's line, format of
    examples/logs/torchrun_sigkill_peer_first.log): a timeout cannot be the echo of a failure after it, so it
    is not folded under it. With rank 1 failing at 01:20 it is."""
    (tmp_path / "rank0.log").write_text(
        "[rank0]:[E1122 01:30:00.000000000 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600000 "
        "milliseconds before timing out.\n")
    agent = ("E1122 {} 22399 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) "
             "local_rank: 1 (pid: 22403) of binary: /work/main/.venv/bin/python\n")
    (tmp_path / "rank1.log").write_text(agent.format("01:40:00.415000"))
    result = explain_files(tmp_path / "rank0.log", tmp_path / "rank1.log")
    assert sorted(tree(result)) == [("nccl-timeout", None), ("worker-failed", None)]
    (tmp_path / "rank1.log").write_text(agent.format("01:20:00.415000"))
    result = explain_files(tmp_path / "rank0.log", tmp_path / "rank1.log")
    assert tree(result) == [("worker-failed", None), ("nccl-timeout", "worker-failed")]


def test_json_says_level_cause_and_first_rank() -> None:
    proc = run_cli(["explain", "--json", "-", str(EXAMPLES / "torchrun_sigkill.log")])
    data = json.loads(proc.stdout)["diagnoses"]
    assert [(d["id"], d["caused_by"], d["level"], d["first_rank"]) for d in data] == [
        ("worker-killed-by-signal", None, "error", 1), ("remote-process-exited", "worker-killed-by-signal", "error", 0)]


def test_kb_links_name_known_ids_and_form_no_cycle() -> None:
    """A link to an unknown id, or a cycle (A causes B causes A), is a KB bug that must fail loudly."""
    from importlib import resources

    from ddpdoctor.explain.knowledge import parse_kb

    real = json.loads(resources.files("ddpdoctor.explain").joinpath("kb.json").read_text(encoding="utf-8"))

    def parse_with(change: dict) -> None:
        data = json.loads(json.dumps(real))
        for s in data["signatures"]:
            s.update(change.get(s["id"], {}))
        parse_kb(json.dumps(data))

    parse_with({})
    with pytest.raises(ValueError, match="unknown ids"):
        parse_with({"nccl-timeout": {"causes": [{"id": "no-such-id"}]}})
    with pytest.raises(ValueError, match="cycle"):
        parse_with({"worker-killed-by-signal": {"causes": [{"id": "nccl-timeout"}]}})
    with pytest.raises(ValueError, match="rank must be"):
        parse_with({"nccl-timeout": {"causes": [{"id": "worker-killed-by-signal", "rank": "mine"}]}})


# --- a cause its source prints as a warning: c10d's failed name lookups ----------------------------------------

# torch/csrc/distributed/c10d/socket.cpp (SocketConnectOp): every failed getaddrinfo is recorded with
# C10D_WARNING ("The IPv6 network addresses of (HOST, PORT) cannot be retrieved (gai error: -2 - ...)") and the
# connect then fails with C10D_ERROR; the name that does not resolve is why. A real client, here: a TCPStore
# pointed at a name under .invalid (RFC 2606: never resolves).
UNRESOLVABLE_STORE = """\
from datetime import timedelta
import torch.distributed as dist
dist.TCPStore("ddpdoctor-no-such-host.invalid", {port}, 2, False, timeout=timedelta(seconds=2))
"""


@pytest.mark.slow
def test_a_name_that_does_not_resolve_explains_the_connect_timeout_though_c10d_warns_it(tmp_path: Path) -> None:
    (tmp_path / "client.py").write_text(UNRESOLVABLE_STORE.format(port=free_port()))
    with (tmp_path / "client.log").open("wb") as out:
        job = subprocess.run([sys.executable, "client.py"], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                             timeout=120, env=clean_env())
    text = (tmp_path / "client.log").read_text()
    assert job.returncode != 0 and "cannot be retrieved (gai error" in text, text[-2000:]
    result = explain_files(tmp_path / "client.log")
    assert tree(result)[:2] == [("hostname-resolution", None), ("master-connect-timeout", "hostname-resolution")]
    assert result.diagnoses[0].level == "warning"  # what c10d printed it as: still the root cause
    assert result.diagnoses[0].details["host"] == ["ddpdoctor-no-such-host.invalid"]
    # The link needs the same endpoint: a lookup that failed for another host explains nothing here.
    other = "\n".join(line.replace("(ddpdoctor-no-such-host.invalid,", "(other-host.invalid,")
                      if "cannot be retrieved" in line else line for line in text.splitlines())
    assert [d for d in tree(explain_text(other)) if d[0] == "master-connect-timeout"] == \
        [("master-connect-timeout", None)]


def test_a_summary_traceback_under_a_long_error_file_path_keeps_its_rank() -> None:
    """torchrun's summary quotes a worker's traceback only when the worker wrote an error file (`@record`), so
    `error_file:` then holds a long path; the `traceback :` line under it was taken for that line's terminal wrap,
    and the exception lost its rank (an explorer's find: "ranks: unknown", the echo listed as its own problem)."""
    from ddpdoctor.explain import explain_text

    long_path = "/tmp/torchelastic_abcd1234/9f8e7d6c-5b4a-3c2d-1e0f-a1b2c3d4e5f6_x7y8z9/attempt_0/1/error.json"
    log = ("Root Cause (first observed failure):\n[0]:\n  time      : 2024-11-28_10:25:06\n  host      : node1\n"
           "  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 1234)\n"
           f"  error_file: {long_path}\n  traceback : Traceback (most recent call last):\n"
           '    File "/home/u/train.py", line 40, in main\n      dist.all_reduce(t)\n  ValueError: bad batch\n'
           + "=" * 60 + "\n")
    for path in (long_path, "/tmp/e.json"):
        got = explain_text(log.replace(long_path, path)).diagnoses
        assert [(d.id, sorted(d.ranks)) for d in got] == [("python-exception", [1]), ("worker-failed", [1])], path
