"""The self-launched ranks' output as torchrun shows it (issue 25, issue 28's torchrun conventions).

Real ranks through the real CLI: two ranks that write half lines with a pause in between (what interleaved
mid-line before: "training donetraining done"), on stdout and stderr. Checked: every line whole and
prefixed ``[rankN]:``; ``--json -`` leaves stdout to the JSON document alone; ``--quiet`` keeps only the
verdict; ``--log-dir``/``--tee``/``--redirects``/``--local-ranks-filter`` mean what they mean to torchrun. The
forwarder's own edge cases (a ``\\r`` progress bar, a line without end, a prefix torch already wrote) go
through real pipes in-process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.watch.output import OutputOptions, RankOutput
from tests.support import run_cli

CHATTY = """\
import sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(3):
    sys.stdout.write("training ")
    sys.stdout.flush()
    time.sleep(0.05)  # the other rank writes meanwhile: unprefixed, the lines interleaved mid-line
    print(f"done {step}")
print(f"note from {rank}", file=sys.stderr)
dist.barrier()
dist.destroy_process_group()
"""


def _run(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    return run_cli(["watch", "--nproc", "2", "--hang-timeout", "60", *options, str(script)], timeout=240, cwd=tmp_path)


def _script_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "training" in line or "done" in line or "note from" in line]


@pytest.mark.slow
def test_json_dash_is_json_alone_and_every_rank_line_is_whole_and_prefixed(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--json", "-")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)  # nothing of the script's is in stdout
    assert doc["status"] == "ok" and doc["world_size"] == 2
    lines = _script_lines(proc.stderr)
    for rank in (0, 1):
        assert [line for line in lines if line.startswith(f"[rank{rank}]:training")] == \
            [f"[rank{rank}]:training done {step}" for step in range(3)], proc.stderr
        assert f"[rank{rank}]:note from {rank}" in lines
    assert all(re.fullmatch(r"\[rank[01]\]:(training done \d|note from \d)", line) for line in lines), lines


@pytest.mark.slow
def test_rank_stdout_stays_on_stdout_prefixed_and_quiet_keeps_only_the_verdict(tmp_path: Path) -> None:
    loud = _run(tmp_path)
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert sorted(_script_lines(loud.stdout)) == sorted(f"[rank{r}]:training done {s}" for r in (0, 1) for s in range(3))
    assert "[rank1]:note from 1" in loud.stderr and "ddpdoctor watch: ok: 2 ranks finished" in loud.stderr
    quiet = _run(tmp_path, "--quiet")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stdout == ""
    assert quiet.stderr.strip() == "ddpdoctor watch: ok: 2 ranks finished (exit code 0)"


@pytest.mark.slow
def test_log_dir_tee_and_local_ranks_filter_as_torchrun(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = _run(tmp_path, "--log-dir", str(logs), "--tee", "3", "--local_ranks_filter", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # torchrun's layout: <log-dir>/<run>/attempt_0/<rank>/{stdout,stderr}.log, the raw lines (no prefix).
    (run,) = list(logs.iterdir())
    for rank in (0, 1):
        folder = run / "attempt_0" / str(rank)
        assert (folder / "stdout.log").read_text() == "".join(f"training done {s}\n" for s in range(3))
        assert (folder / "stderr.log").read_text() == f"note from {rank}\n"
    # The console shows rank 1 only; the files keep both.
    assert "[rank0]:" not in proc.stdout + proc.stderr
    assert "[rank1]:training done 2" in proc.stdout and "[rank1]:note from 1" in proc.stderr
    assert f"the ranks' logs go to {run}/attempt_0/<rank>/" in proc.stderr
    # --redirects: the file only. stdout of every rank to its file, stderr still on the console.
    redirected = _run(tmp_path, "--log-dir", str(logs), "--redirects", "1")
    assert redirected.returncode == 0, redirected.stderr[-2000:]
    assert _script_lines(redirected.stdout) == [] and "[rank0]:note from 0" in redirected.stderr
    second = next(p for p in logs.iterdir() if p != run)  # a new run folder: the log dir is reusable
    assert (second / "attempt_0" / "1" / "stdout.log").read_text().count("training done") == 3
    assert not (second / "attempt_0" / "1" / "stderr.log").exists()


@pytest.mark.parametrize(("flags", "needle"), [
    (["--tee", "4"], "--tee takes 0 (none), 1 (stdout), 2 (stderr), 3 (both)"),
    (["--redirects", "0:3,x"], "--redirects takes"),
    (["--local-ranks-filter", "0,a"], "--local-ranks-filter must be a comma-separated list of integers"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout must be a non-negative number of seconds"),
])
def test_bad_torchrun_style_options_are_one_line_exit_2(tmp_path: Path, flags: list[str], needle: str) -> None:
    script = tmp_path / "x.py"
    script.write_text("print('never runs')\n")
    proc = run_cli(["watch", *flags, str(script)], cwd=tmp_path)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "never runs" not in proc.stdout


def test_the_forwarder_keeps_lines_whole_through_real_pipes(tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """A writer process sends half lines, a \\r progress bar, a line with torch's own [rank0]: prefix and an
    unterminated last line through the pipes the forwarder reads, as a rank would."""
    writer = (
        "import os, sys, time\n"
        "out, err = int(sys.argv[1]), int(sys.argv[2])\n"
        "os.write(out, b'half ')\n"
        "time.sleep(0.3)\n"
        "os.write(out, b'line\\n')\n"
        "os.write(err, b' 10%\\r 20%\\r')\n"
        "os.write(err, b'[rank0]: Traceback (most recent call last):\\n')\n"
        "os.write(out, b'no newline at the end')\n"
    )
    forwarder = RankOutput(OutputOptions())
    out, err = forwarder.pipes(0)
    child = subprocess.Popen([sys.executable, "-c", writer, str(out), str(err)], pass_fds=(out, err))
    os.close(out)
    os.close(err)
    forwarder.start()
    child.wait(timeout=60)
    forwarder.stop()
    captured = capfdbinary.readouterr()
    assert captured.out == b"[rank0]:half line\n[rank0]:no newline at the end\n"
    assert captured.err == b"[rank0]: 10%\r[rank0]: 20%\r[rank0]: Traceback (most recent call last):\n"
    assert forwarder.tail_text(0).splitlines()[:2] == ["half line", " 10%"]
