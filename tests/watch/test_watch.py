"""`ddpdoctor watch` on real gloo jobs: each broken example with 3 ranks (the 2-rank forms run elsewhere:
the rank0-only barrier under torchrun below, a skipped collective under mp.spawn in test_spawn.py, a 2-rank
mismatch of shapes in test_aggregate.py and of sizes in the p2p job below), crashes, a healthy run.

Every test runs the real CLI (self-launching real rank processes), reads the ``--json`` report, checks
what a user reads on stderr, and checks that no process of the job survived.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import REPO, TEST_TAG_VARIABLE, clean_env, free_port, run_cli, torchrun_cmd

EXAMPLES = REPO / "examples"
pytestmark = pytest.mark.slow
# No progress on any rank for this long is a hang (issue 25). DDP's constructor alone takes seconds on gloo on
# a busy machine: a healthy phase must fit well within it.
HANG_TIMEOUT = 8


def site(example: str, marker: str) -> str:
    """'hang_eval_barrier.py:39': the last line of the example containing ``marker`` (code, not docstring)."""
    found = [number for number, line in enumerate((EXAMPLES / example).read_text().splitlines(), start=1)
             if marker in line]
    assert found, f"{marker!r} not in {example}"
    return f"{example}:{found[-1]}"


def leftovers(example: str) -> list[str]:
    """Processes of this test still running the example (any rank, any child), as 'pid cmdline'. This test's:
    they carry its tag (tests/conftest.py); another test may run the same example beside it (pytest -n)."""
    found = []
    tag = os.environ.get(TEST_TAG_VARIABLE)
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if (example in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE and proc.pid != psutil.Process().pid
                    and (tag is None or proc.environ().get(TEST_TAG_VARIABLE) == tag)):
                found.append(f"{proc.pid} {cmdline}")
        except psutil.Error:
            continue
    return found


def watch(tmp_path: Path, example: str, nproc: int, *script_args: str,
          hang_timeout: float = HANG_TIMEOUT) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = tmp_path / "watch.json"
    started = time.monotonic()
    proc = run_cli(["watch", "--nproc", str(nproc), "--hang-timeout", str(hang_timeout), "--json", str(report),
                    "--evidence", str(tmp_path / "evidence"),
                    str(EXAMPLES / example), *script_args], timeout=240, cwd=EXAMPLES)
    elapsed = time.monotonic() - started
    assert report.exists(), f"no report after {elapsed:.0f} s; stderr:\n{proc.stderr[-3000:]}"
    assert leftovers(example) == [], "processes of the job survived watch"
    data = json.loads(report.read_text())
    if data["evidence"]:
        assert_evidence_line_names_the_bundle(proc.stderr, Path(data["evidence"]))
    return proc, data


def assert_evidence_line_names_the_bundle(stderr: str, bundle: Path) -> None:
    """The report's last line names exactly the files the bundle holds (it named stacks and Flight Recorder
    dumps that a crash before any collective never had, and not the ranks' output files it had)."""
    [line] = [ln for ln in stderr.splitlines() if ln.startswith(f"evidence: {bundle} (")]
    named: set[str] = set()
    for part in line[len(f"evidence: {bundle} ("):-1].split("; "):
        kind, _, ranks = part.partition(" for ")
        if not ranks:
            named |= set(part.split(", "))
            continue
        for piece in ranks.split(" ", 1)[1].split(","):
            first, _, last = piece.partition("-")
            named |= {kind.replace("_N", f"_{r}") for r in range(int(first), int(last or first) + 1)}
    held = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    assert named == held, (line, sorted(held))


def watch_inline(tmp_path: Path, name: str, source: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Write ``source`` as tmp_path/name and run it under ``watch`` on 2 ranks with a 3 s hang timeout."""
    script = tmp_path / name
    script.write_text(source)
    report = tmp_path / "watch.json"
    proc = run_cli(["watch", "--nproc", "2", "--hang-timeout", str(HANG_TIMEOUT), "--json", str(report),
                    "--evidence", str(tmp_path / "evidence"), str(script)],
                   timeout=240, cwd=tmp_path)
    assert report.exists(), f"no report; stderr:\n{proc.stderr[-3000:]}"
    return proc, json.loads(report.read_text())


def groups_by_rank(divergence: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {rank: group for group in divergence["groups"] for rank in group["ranks"]}


def assert_rank0_only_barrier(proc: subprocess.CompletedProcess[str], data: dict[str, Any], nproc: int) -> None:
    """What a user reads about examples/hang_eval_barrier.py on ``nproc`` ranks: a hang, rank 0 in the
    barrier, the others in backward, each with its line."""
    barrier = site("hang_eval_barrier.py", "dist.barrier()  # BUG")
    backward = site("hang_eval_barrier.py", "loss.backward()")
    assert data["status"] == "hang"
    assert "HANG" in proc.stderr
    div = data["divergence"]
    assert div["group"] == "WORLD" and div["seq"] == 3
    by_rank = groups_by_rank(div)
    assert by_rank[0]["op"] == "barrier" and by_rank[0]["site"] == barrier
    for rank in range(1, nproc):
        assert by_rank[rank]["op"].startswith("backward") and by_rank[rank]["site"] == backward
    assert f"rank 0 in barrier at {barrier}" in proc.stderr
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert ranks[0]["waiting_in"]["op"] == "barrier" and ranks[0]["waiting_in"]["seq"] == 3
    assert ranks[0]["last_completed"]["op"] == "all_reduce" and ranks[0]["last_completed"]["seq"] == 2
    assert any("loss.backward()" in line for line in ranks[1]["stack"])


def test_rank0_only_barrier_is_a_hang_naming_barrier_and_backward(tmp_path: Path) -> None:
    """3 ranks; the same checks on 2 ranks: test_under_torchrun_rank0_reports_the_hang_and_the_job_ends."""
    proc, data = watch(tmp_path, "hang_eval_barrier.py", 3)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert_rank0_only_barrier(proc, data, 3)


def test_skipped_collective_is_a_mismatch_at_the_shifted_call(tmp_path: Path) -> None:
    nproc = 3
    proc, data = watch(tmp_path, "hang_skip_collective.py", nproc)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "mismatch"
    div = data["divergence"]
    assert div["seq"] == 6
    by_rank = groups_by_rank(div)
    reduce_site = site("hang_skip_collective.py", "dist.all_reduce(grad)")
    barrier_site = site("hang_skip_collective.py", "dist.barrier()")
    for rank in range(nproc - 1):
        assert (by_rank[rank]["op"], by_rank[rank]["site"]) == ("all_reduce", reduce_site)
    assert (by_rank[nproc - 1]["op"], by_rank[nproc - 1]["site"]) == ("barrier", barrier_site)
    assert f"rank {nproc - 1} in barrier at {barrier_site}" in proc.stderr


def test_shape_mismatch_reports_both_shapes_and_the_site(tmp_path: Path) -> None:
    nproc = 3
    proc, data = watch(tmp_path, "hang_shape_mismatch.py", nproc)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "mismatch"
    div = data["divergence"]
    assert div["seq"] == 2
    where = site("hang_shape_mismatch.py", "dist.all_reduce(stats)")
    by_rank = groups_by_rank(div)
    assert by_rank[nproc - 1]["desc"] == "float32[4]" and by_rank[nproc - 1]["site"] == where
    for rank in range(nproc - 1):
        assert by_rank[rank]["desc"] == "float32[3]" and by_rank[rank]["op"] == "all_reduce"
    assert "float32[3]" in proc.stderr and "float32[4]" in proc.stderr
    # The ranks end after the verdict (gloo raises on the mismatch). A rank still running when the report is
    # made answered with its stack; one that exited meanwhile is reported as exited: never "running" with no
    # stack because py-spy was pointed at a process that was gone (the stack wait once ignored their exits).
    assert any(r["state"] == "crashed" for r in data["ranks"]), data["ranks"]
    for r in data["ranks"]:
        assert not (r["state"] == "running" and "no stack" in " ".join(r["stack"])), r


def test_healthy_script_passes_through_output_and_exits_0(tmp_path: Path) -> None:
    proc, data = watch(tmp_path, "train_ok.py", 2, "--epochs", "2", "--steps", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TRAIN_OK steps=6" in proc.stdout
    assert data["status"] == "ok" and data["exit_code"] == 0
    assert data["warnings"] == [] and data["straggler"] is None and data["evidence"] is None
    assert all(r["state"] == "exited" and r["exit_code"] == 0 for r in data["ranks"])
    assert "HANG" not in proc.stderr and "MISMATCH" not in proc.stderr


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_a_rank_that_dies_mid_run_is_a_crash_not_a_hang(tmp_path: Path, mode: str) -> None:
    proc, data = watch(tmp_path, "crash_rank.py", 2, "--mode", mode)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "crash"
    assert data["crash_order"][0] == 1
    rank1 = next(r for r in data["ranks"] if r["rank"] == 1)
    assert rank1["state"] == "crashed"
    if mode == "raise":
        assert "ValueError: corrupt sample" in rank1["error"]
        assert site("crash_rank.py", "raise ValueError") in rank1["error"]
    else:
        assert rank1["signal"] == "SIGKILL"
    if mode == "raise":
        assert "CRASH: rank 1 raised ValueError: corrupt sample" in proc.stderr
        # A script's own exception: explain knows nothing more than the headline says (no "fix:" invented).
        assert data["known_cause"] is None and "fix:" not in proc.stderr
    else:
        assert "CRASH: rank 1 was killed by signal 9 (SIGKILL)" in proc.stderr
    assert "HANG" not in proc.stderr


def test_training_loop_pitfalls_are_warned_with_their_lines(tmp_path: Path) -> None:
    proc, data = watch(tmp_path, "pitfalls_loop.py", 2, "--out", str(tmp_path / "ckpt.pt"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = {w["kind"]: w for w in data["warnings"]}
    assert found["dataloader_without_distributed_sampler"]["site"] == site("pitfalls_loop.py", "# pitfall 1")
    assert found["sampler_epoch_never_set"]["site"] == site("pitfalls_loop.py", "DistributedSampler(data")
    assert found["torch_save"]["site"] == site("pitfalls_loop.py", "# pitfall 3")
    assert found["torch_save"]["ranks"] == [0, 1]
    assert found["find_unused_parameters_unneeded"]["site"] == site("pitfalls_loop.py", "# pitfall 4")
    assert "warning: DataLoader without a DistributedSampler" in proc.stderr


def _port_with_next_one_taken() -> tuple[int, socket.socket]:
    """A free port P and a listener holding P+1: a second job started with --master-port P+1."""
    for _ in range(50):
        port = free_port()
        blocker = socket.socket()
        try:
            blocker.bind(("0.0.0.0", port + 1))
            blocker.listen(1)
            return port, blocker
        except OSError:
            blocker.close()
    raise AssertionError("no port P with P+1 free")


def test_under_torchrun_rank0_reports_the_hang_and_the_job_ends(tmp_path: Path) -> None:
    """No DDPDOCTOR_WATCH_PORT, and MASTER_PORT+1 taken by someone else: the channel still works."""
    report = tmp_path / "watch.json"
    port, blocker = _port_with_next_one_taken()
    cmd = [*torchrun_cmd(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
           "-m", "ddpdoctor", "watch", "--hang-timeout", str(HANG_TIMEOUT), "--json", str(report),
           "--evidence", str(tmp_path / "evidence"), str(EXAMPLES / "hang_eval_barrier.py")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=clean_env(), cwd=str(EXAMPLES))
    finally:
        blocker.close()
    assert proc.returncode != 0
    assert "runs unwatched" not in proc.stderr and "cannot listen" not in proc.stderr, proc.stderr[-2000:]
    data = json.loads(report.read_text())
    assert_rank0_only_barrier(proc, data, 2)  # the 2-rank form of the self-launched 3-rank test above
    # Rank 0 writes the bundle; every live rank writes its own Flight Recorder dump into it.
    bundle = tmp_path / "evidence"
    assert data["evidence"] == str(bundle)
    assert sorted(p.name for p in (bundle / "flight_recorder").iterdir()) == ["fr_rank_0", "fr_rank_1"]
    assert (bundle / "stack_rank_1.txt").read_text().strip().endswith("loss.backward()")
    assert leftovers("hang_eval_barrier.py") == []


def test_bad_usage_is_one_line_exit_2(tmp_path: Path) -> None:
    missing = run_cli(["watch", str(tmp_path / "nope.py")])
    assert missing.returncode == 2 and "script not found" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    for value in ("0", "0.05", "nan"):  # 0.05: below the ranks' 0.1 s reporting tick, every step would read as a hang
        bad = run_cli(["watch", "--hang-timeout", value, str(EXAMPLES / "train_ok.py")])
        assert bad.returncode == 2 and "--hang-timeout must be at least 1 s" in bad.stderr, bad.stderr
    # Refused before any rank starts, not after the whole run.
    no_dir = run_cli(["watch", "--json", str(tmp_path / "absent" / "r.json"), str(EXAMPLES / "train_ok.py")])
    assert no_dir.returncode == 2 and "does not exist" in no_dir.stderr
    (tmp_path / "a_file").write_text("")
    for flags, needle in ((["--evidence", str(tmp_path / "a_file")], "is not a folder"),
                          (["--evidence", str(tmp_path / "absent" / "ev")], "does not exist"),
                          (["--launch", "twice"], "--launch must be auto, ranks or script")):
        bad_flag = run_cli(["watch", *flags, str(EXAMPLES / "train_ok.py")])
        assert bad_flag.returncode == 2 and needle in bad_flag.stderr, bad_flag.stderr
        assert len(bad_flag.stderr.strip().splitlines()) == 1


def test_an_option_watch_lacks_is_named_as_an_unknown_option_not_as_a_missing_script(tmp_path: Path) -> None:
    """Issue 28: `watch --timeout 5 x.py` said "script not found: '--timeout'"."""
    proc = run_cli(["watch", "--timeout", "5", "x.py"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "script not found" not in line
    assert "no such option for watch: --timeout; did you mean --hang-timeout?" in line
    assert "--nproc" in line and "--evidence" in line  # the options watch does have
    # A script whose name starts with a dash is still a script.
    (tmp_path / "-odd.py").write_text("print('ODD RAN')\n")
    ran = run_cli(["watch", "--nproc", "1", "--", "-odd.py"], cwd=tmp_path, timeout=120)
    assert ran.returncode == 0 and "ODD RAN" in ran.stdout, ran.stderr


def test_json_dash_and_master_port_reach_the_job(tmp_path: Path) -> None:
    script = tmp_path / "port.py"
    script.write_text("import os, sys\nimport torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "sys.stderr.write(f\"PORT {os.environ['MASTER_PORT']}\\n\")\n"
                      "dist.barrier()\ndist.destroy_process_group()\n")
    port = free_port()
    proc = run_cli(["watch", "--nproc", "2", "--master-port", str(port), "--hang-timeout", "30", "--json", "-",
                    str(script)], timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)  # the JSON instead of the text report
    assert data["status"] == "ok" and [r["state"] for r in data["ranks"]] == ["exited", "exited"]
    assert "ddpdoctor watch: ok" not in proc.stderr
    assert proc.stderr.count(f"PORT {port}") == 2  # --master-port is the job's MASTER_PORT


def test_script_arguments_are_not_taken_as_watch_options(tmp_path: Path) -> None:
    script = tmp_path / "argv.py"
    script.write_text("import sys\nprint('ARGV', sys.argv[1:])\nsys.exit(0)\n")
    proc = run_cli(["watch", "--nproc", "1", str(script), "--json", "x", "--nproc", "7"])
    assert proc.returncode == 0, proc.stderr
    assert "ARGV ['--json', 'x', '--nproc', '7']" in proc.stdout
    assert sys.executable  # the script ran under this interpreter's environment


P2P_SCRIPT = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
names = [None] * dist.get_world_size()
dist.all_gather_object(names, f"rank{rank}")
dist.barrier()
if rank == 0:
    dist.send(torch.zeros(4), dst=1)
else:
    dist.recv(torch.zeros(5), src=0)
dist.destroy_process_group()
"""


def test_object_collectives_count_once_and_p2p_size_mismatch_names_send_and_recv(tmp_path: Path) -> None:
    proc, data = watch_inline(tmp_path, "p2p_mismatch.py", P2P_SCRIPT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "mismatch"
    div = data["divergence"]
    assert div["group"] == "WORLD:p2p:0->1" and div["seq"] == 1
    by_rank = groups_by_rank(div)
    assert (by_rank[0]["op"], by_rank[0]["site"]) == ("send", "p2p_mismatch.py:10")
    assert (by_rank[1]["op"], by_rank[1]["site"]) == ("recv", "p2p_mismatch.py:12")
    assert "float32[4]" in by_rank[0]["desc"] and "float32[5]" in by_rank[1]["desc"]
    # all_gather_object runs all_gather inside torch: recorded once, as what the script called.
    assert [rank["issued"] for rank in data["ranks"]] == [{"WORLD": 2, "WORLD:p2p:0->1": 1},
                                                         {"WORLD": 2, "WORLD:p2p:0->1": 1}]
    assert leftovers("p2p_mismatch.py") == []


def test_under_torchrun_a_crashed_rank_is_reported_by_rank0(tmp_path: Path) -> None:
    report = tmp_path / "watch.json"
    cmd = [*torchrun_cmd(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "ddpdoctor", "watch", "--hang-timeout", str(HANG_TIMEOUT), "--json", str(report),
           "--evidence", str(tmp_path / "evidence"), str(EXAMPLES / "crash_rank.py"), "--mode", "raise"]
    env = clean_env({"DDPDOCTOR_WATCH_PORT": str(free_port())})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=str(EXAMPLES))
    assert proc.returncode != 0
    data = json.loads(report.read_text())
    assert data["status"] == "crash" and data["crash_order"] == [1]
    assert "ValueError: corrupt sample" in data["ranks"][1]["error"]
    assert leftovers("crash_rank.py") == []


def test_under_torchrun_ranks_that_all_raised_are_all_named(tmp_path: Path) -> None:
    """Every rank raises at the same step (a bug every rank hits): rank 0's own exception, in the process that
    supervises, must not read as "torn down" because another rank's message reached the channel first, and a
    rank's count from before the others' calls arrived is no skipped collective."""
    report = tmp_path / "watch.json"
    cmd = [*torchrun_cmd(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "ddpdoctor", "watch", "--json", str(report), "--evidence", str(tmp_path / "evidence"),
           str(EXAMPLES / "crash_rank.py"), "--crash-rank", "all"]
    env = clean_env({"DDPDOCTOR_WATCH_PORT": str(free_port())})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=str(EXAMPLES))
    assert proc.returncode != 0
    data = json.loads(report.read_text())
    assert data["status"] == "crash" and sorted(data["crash_order"]) == [0, 1], proc.stderr[-3000:]
    assert all("ValueError: corrupt sample in batch 3" in rank["error"] for rank in data["ranks"])
    assert "torn down" not in proc.stderr and "never issued" not in proc.stderr, proc.stderr[-3000:]
    first, then = data["crash_order"]
    assert (f"first; rank {then} raised the same at the same place (each rank hit it: not a consequence of rank "
            f"{first}'s crash)") in proc.stderr, proc.stderr[-3000:]
    assert leftovers("crash_rank.py") == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupting_watch_tears_down_every_rank(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C, a scheduler's SIGTERM, even SIGKILL of the supervisor: no rank outlives it."""
    cmd = [sys.executable, "-m", "ddpdoctor", "watch", "--nproc", "2", "--hang-timeout", "600",
           str(EXAMPLES / "hang_eval_barrier.py")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        deadline = time.monotonic() + 120
        # The supervisor's own command line names the script too: wait for it plus two ranks.
        while len(leftovers("hang_eval_barrier.py")) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(leftovers("hang_eval_barrier.py")) >= 3, "the ranks never started"
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGKILL:
        # Nobody can tear down for a killed supervisor: each rank sees its channel close and ends itself.
        deadline = time.monotonic() + 30
        while leftovers("hang_eval_barrier.py") and time.monotonic() < deadline:
            time.sleep(0.2)
    else:
        assert proc.returncode == 128 + sig, err[-2000:]
        assert f"interrupted ({sig.name})" in err
    assert leftovers("hang_eval_barrier.py") == []


def test_under_torchrun_a_clean_run_passes_through(tmp_path: Path) -> None:
    report = tmp_path / "watch.json"
    cmd = [*torchrun_cmd(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "ddpdoctor", "watch", "--json", str(report), str(EXAMPLES / "train_ok.py"), "--epochs", "1",
           "--steps", "2"]
    env = clean_env({"DDPDOCTOR_WATCH_PORT": str(free_port())})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=str(EXAMPLES))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TRAIN_OK steps=2" in proc.stdout
    data = json.loads(report.read_text())
    assert data["status"] == "ok" and [r["state"] for r in data["ranks"]] == ["exited", "exited"]


WORKERS_SCRIPT = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
data = TensorDataset(torch.randn(64, 4))
loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data), num_workers=2, persistent_workers=True)
for (batch,) in loader:
    dist.all_reduce(batch)
    break
if dist.get_rank() == 0:
    dist.barrier()
else:
    for (batch,) in loader:
        dist.all_reduce(batch)
"""


def test_teardown_kills_dataloader_workers_too(tmp_path: Path) -> None:
    proc, data = watch_inline(tmp_path, "workers_mismatch.py", WORKERS_SCRIPT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "mismatch"
    by_rank = groups_by_rank(data["divergence"])
    assert (by_rank[0]["op"], by_rank[1]["op"]) == ("barrier", "all_reduce")
    assert leftovers("workers_mismatch.py") == [], "DataLoader worker processes survived"


ASYNC_SCRIPT = """\
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.zeros(4)
if dist.get_rank() == 0:
    req = dist.irecv(t, src=1)
    req.wait()
else:
    time.sleep(600)
"""


def test_a_rank_blocked_in_work_wait_is_waiting_and_names_the_async_call(tmp_path: Path) -> None:
    proc, data = watch_inline(tmp_path, "async_hang.py", ASYNC_SCRIPT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "hang"
    rank0, rank1 = data["ranks"]
    assert rank0["state"] == "waiting"
    assert rank0["waiting_in"]["op"] == "wait for #1 irecv (async_hang.py:8)"
    assert rank0["waiting_in"]["site"] == "async_hang.py:9"
    assert rank1["state"] == "running" and rank1["stack"][-1].startswith("async_hang.py:11")
    assert "message #1 from rank 1 to rank 0" in proc.stderr
    assert leftovers("async_hang.py") == []


@pytest.mark.parametrize(("extra", "needle"), [
    ({"DDPDOCTOR_WATCH_PORT": "abc"}, "DDPDOCTOR_WATCH_PORT must be an integer"),
    ({"DDPDOCTOR_WATCH_PORT": "70000"}, "DDPDOCTOR_WATCH_PORT must be in 1-65535"),
    ({"MASTER_PORT": "65535"}, "no MASTER_PORT+1"),
])
def test_a_bad_channel_port_under_a_launcher_is_one_line_exit_2(extra: dict[str, str], needle: str) -> None:
    """A rank started by hand (RANK/WORLD_SIZE set): the watch channel's port comes from the environment."""
    env = clean_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port()), **extra})
    proc = run_cli(["watch", str(EXAMPLES / "train_ok.py")], env=env, timeout=120)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_rank_that_runs_out_of_batches_and_exits_0_is_named_as_the_cause(tmp_path: Path) -> None:
    """Rank 1 has one batch fewer and exits 0; rank 0's all_reduce then fails on the closed connection. The
    report named rank 0's echo as the crash and explain's "look at the other ranks' logs" as the fix."""
    proc, data = watch(tmp_path, "early_exit_rank.py", 2)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert data["status"] == "crash" and data["early_exit"]["rank"] == 1, proc.stderr[-3000:]
    assert data["known_cause"] is None
    assert "\nddpdoctor watch: CRASH: rank 1 exited with code 0 while rank 0 was still " in proc.stderr, \
        proc.stderr[-3000:]
    assert "a rank that ends early (fewer batches, an early return or sys.exit) leaves the others in a collective" \
        in proc.stderr
    assert "fix: give every rank the same number of steps" in proc.stderr
