"""`ddpdoctor explain` as a user runs it: real processes, real files, stdin, exit codes, a real torchrun job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.explain_throughput import ERROR_BLOCKS, realistic_lines
from tests.support import (
    REPO,
    can_drop_root_read,
    clean_env,
    free_port,
    run_cli,
    torchrun_cmd,
    without_root_read,
)

EXAMPLES = REPO / "examples" / "logs"


def test_text_report_root_cause_first_and_exit_1() -> None:
    proc = run_cli(["explain", str(EXAMPLES / "torchrun_sigkill.log")])
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    # Rank 0's "Connection reset by peer" is the echo of rank 1's SIGKILL: shown under it, not as a rival.
    assert "1 known problem found" in out and "1 more diagnosis is shown under it as a consequence" in out
    first, second = out.index("[worker-killed-by-signal]"), out.index("[remote-process-exited]")
    assert first < out.index("   consequences (explained by the above, not separate problems):") < second
    assert "2. " not in out
    assert "ranks: 1 " in out and "signal=SIGKILL" in out
    assert "torchrun_sigkill.log:52:" in out  # evidence as file:line
    assert "next: ddpdoctor env" in out


def test_json_contract() -> None:
    proc = run_cli(["explain", "--json", "-", str(EXAMPLES / "ddp_unused_parameters.log")])
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    first = data["diagnoses"][0]
    assert first["id"] == "unused-parameters"
    assert first["ranks"] == [0, 1]
    assert first["details"]["param_indices"] == ["2 3"]
    assert {"id", "title", "ranks", "evidence", "cause", "remedy", "command"} <= set(first)
    assert set(first["evidence"][0]) == {"file", "line", "text"}


def test_stdin_when_no_file_or_dash() -> None:
    text = (EXAMPLES / "ddp_model_mismatch.log").read_text()
    for args in (["explain"], ["explain", "-"]):
        proc = run_cli([*args, "--json", "-"], input_text=text)
        assert proc.returncode == 1, proc.stderr
        data = json.loads(proc.stdout)
        assert data["diagnoses"][0]["id"] == "model-mismatch"
        assert data["diagnoses"][0]["evidence"][0]["file"] == "<stdin>"


def test_nothing_recognised_exits_0() -> None:
    proc = run_cli(["explain"], input_text="epoch 1 step 10 loss 0.5\nall good\n")
    assert proc.returncode == 0, proc.stderr
    assert "no known DDP/NCCL/torchrun error found" in proc.stdout


def test_realistic_noisy_logs_healthy_exits_0_and_one_oom_exits_1(tmp_path: Path) -> None:
    """A noisy healthy multi-node log (glog warnings, NCCL INFO, c10d retries, tqdm, wandb retries) is not a
    problem; the same log with one rank's CUDA OOM traceback in it is exactly that problem, at that line."""
    lines = list(realistic_lines(20000, seed=5))
    healthy = tmp_path / "healthy.log"
    healthy.write_text("".join(lines))
    proc = run_cli(["explain", str(healthy)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no known DDP/NCCL/torchrun error found (1 input, 20,000 lines)" in proc.stdout
    crashed = tmp_path / "crashed.log"
    crashed.write_text("".join(lines[:12345]) + ERROR_BLOCKS["cuda-oom"] + "".join(lines[12345:]))
    proc = run_cli(["explain", "--json", "-", str(crashed)])
    assert proc.returncode == 1, proc.stderr
    (d,) = json.loads(proc.stdout)["diagnoses"]
    assert (d["id"], d["ranks"]) == ("cuda-oom", [5])
    oom_line = 12345 + next(i for i, ln in enumerate(ERROR_BLOCKS["cuda-oom"].splitlines(), 1) if "OutOfMemoryError" in ln)
    assert d["evidence"][0]["line"] == oom_line and "Tried to allocate 2.00 GiB" in d["evidence"][0]["text"]


def test_missing_file_and_directory_exit_2_with_one_line(tmp_path: Path) -> None:
    for bad, words in ((tmp_path / "nope.log", "no such file"), (tmp_path, "is a directory")):
        proc = run_cli(["explain", str(EXAMPLES / "torchrun_sigkill.log"), str(bad)])
        assert proc.returncode == 2
        assert words in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert proc.stdout == ""  # inputs are checked before any scanning or output


@pytest.mark.skipif(not can_drop_root_read(), reason="as root, needs setpriv to drop the capabilities that "
                    "skip permission checks")
def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "secret.log"
    f.write_text("x\n")
    f.chmod(0)
    proc = subprocess.run(without_root_read([sys.executable, "-m", "ddpdoctor", "explain", str(f)]),
                          capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 2 and "cannot read" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_binary_garbage_file_is_handled(tmp_path: Path) -> None:
    f = tmp_path / "core.bin"
    f.write_bytes(os.urandom(300_000) + b"\n[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                  b"2.00 GiB.\n" + os.urandom(1000))
    proc = run_cli(["explain", "--json", "-", str(f)])
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["diagnoses"][0]["ranks"] == [2]


def test_one_file_per_rank(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text(
        "[E1122 01:40:00.000000 1 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600000 "
        "milliseconds before timing out.\n")
    (tmp_path / "train_rank_1.log").write_text(
        "step 1\nTraceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
        "ValueError: bad sample 17\n")
    proc = run_cli(["explain", "--json", "-", str(tmp_path / "rank0.log"), str(tmp_path / "train_rank_1.log")])
    data = json.loads(proc.stdout)
    assert [(d["id"], d["ranks"]) for d in data["diagnoses"]] == [("python-exception", [1]), ("nccl-timeout", [0])]


def test_explain_does_not_import_torch() -> None:
    code = textwrap.dedent(f"""
        import sys
        from ddpdoctor.cli import main
        rc = main(["explain", {str(EXAMPLES / "torchrun_sigkill.log")!r}])
        print("TORCH_IMPORTED" if "torch" in sys.modules else "NO_TORCH", rc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=clean_env())
    assert proc.stdout.strip().splitlines()[-1] == "NO_TORCH 1", proc.stdout + proc.stderr


JOB = """
import os, signal, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(t)
time.sleep(1)
"""


@pytest.mark.slow
def test_real_torchrun_job_killed_by_sigkill(tmp_path: Path) -> None:
    """Run a real 2-rank gloo job under torchrun, SIGKILL rank 1, and explain what torchrun left behind."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    logdir = tmp_path / "logs"
    job = subprocess.run(
        [*torchrun_cmd(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         # A slow monitor: torchrun must not tear rank 0 down before it prints gloo's "peer went away"
         # error (which comes within milliseconds of the SIGKILL); otherwise the log has nothing to show.
         "--monitor-interval", "3", "--log-dir", str(logdir), "--redirects", "3", str(script)],
        capture_output=True, text=True, timeout=180, env=clean_env(), cwd=tmp_path)
    assert job.returncode != 0
    console = tmp_path / "console.log"
    console.write_text(job.stdout + job.stderr)
    rank_files = sorted(str(p) for p in logdir.rglob("stderr.log"))
    assert len(rank_files) == 2
    proc = run_cli(["explain", "--json", "-", str(console), *rank_files])
    assert proc.returncode == 1, proc.stderr
    found = [(d["id"], d["ranks"]) for d in json.loads(proc.stdout)["diagnoses"]]
    assert found[0] == ("worker-killed-by-signal", [1])
    assert ("remote-process-exited", [0]) in found


# -- the --json convention, in-process (typer's CliRunner) --------------------------------------------

def test_json_path_writes_the_document_and_still_prints_the_report(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    out = tmp_path / "explain.json"
    result = CliRunner().invoke(app, ["explain", "--json", str(out), str(EXAMPLES / "ddp_unused_parameters.log")])
    assert result.exit_code == 1, result.output
    assert "[unused-parameters]" in result.stdout  # the text report, as without --json
    assert json.loads(out.read_text())["diagnoses"][0]["id"] == "unused-parameters"


def test_json_dash_prints_only_the_document_in_process() -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    result = CliRunner().invoke(app, ["explain", "--json", "-", str(EXAMPLES / "ddp_unused_parameters.log")])
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["diagnoses"][0]["ranks"] == [0, 1]  # nothing but JSON on stdout


def test_json_into_a_missing_folder_is_exit_2_before_reading_the_logs(tmp_path: Path) -> None:
    proc = run_cli(["explain", "--json", str(tmp_path / "absent" / "e.json"), str(tmp_path / "no-such.log")])
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "no-such.log" not in proc.stderr


def test_a_deeply_nested_json_input_is_no_crash(tmp_path: Path) -> None:
    """A .json input is tried as a torchrun error file; one nested past Python's recursion limit is a log."""
    deep = tmp_path / "error.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    done = run_cli(["explain", str(deep)], timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_a_log_that_is_empty_is_refused_not_reported_clean(tmp_path: Path) -> None:
    """`explain train.log` on an empty file said "no known error found (1 input, 0 lines)", exit 0: a wrong path
    or a log that caught nothing read as a clean run. Exit 2, one line. An empty rank log beside others, and
    empty stdin (a grep that matched nothing), are still read."""
    empty, other = tmp_path / "train.log", tmp_path / "rank1.log"
    empty.write_bytes(b"")
    alone = run_cli(["explain", str(empty)])
    assert alone.returncode == 2 and alone.stdout == ""
    assert alone.stderr.strip().splitlines() == [
        f"ddpdoctor: error: {empty} is empty (0 bytes): nothing to explain; is it the right file? (a job's errors "
        "go to stderr: `2>&1` in the command that wrote it keeps them)"]
    other.write_text("step 1 loss 0.5\n")
    beside = run_cli(["explain", str(empty), str(other)])
    assert beside.returncode == 0 and "(2 inputs, 1 line)" in beside.stdout, beside.stderr
    piped = run_cli(["explain", "-"], input_text="")
    assert piped.returncode == 0 and "(1 input, 0 lines)" in piped.stdout, piped.stderr
