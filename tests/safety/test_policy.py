"""The output policy across commands: the cases issue 27 found, each reproduced with the real CLI.

What a user would see break: a log turned into JSON by ``explain --json train.log`` under cron, an
older result read as this run's, ``fr`` blaming a rank for a file it wrote itself, an evidence folder
mixing two runs, a report that comes out 0600 whatever the umask, a root run taking a file from its owner.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor import outputs
from ddpdoctor.errors import DoctorError
from tests.safety.conftest import OTHER_UID, as_user, run_main, snapshot
from tests.support import REPO, clean_env, run_cli


def test_explain_json_on_the_log_with_stdin_not_a_terminal_is_refused(workspace: Path) -> None:
    """cron/CI/nohup: `explain --json train.log` took the log as the output and read stdin; the log became
    an empty JSON document and the verdict a false all-clear (exit 0)."""
    before = snapshot(workspace)
    res = run_cli(["explain", "--json", str(workspace / "train.log")], input_text="", cwd=workspace)
    assert res.returncode == 2, res.stderr
    assert "--json takes the file to WRITE" in res.stderr and "explain " in res.stderr
    assert res.stderr.count("\n") == 1 and res.stdout == ""
    assert snapshot(workspace) == before


def test_a_failed_run_leaves_the_error_document_never_the_older_result(workspace: Path) -> None:
    report = workspace / "fr.json"
    ok = run_cli(["fr", str(workspace / "dumps"), "--json", str(report)], cwd=workspace)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(report.read_text())["status"] == "pass"
    failed = run_cli(["fr", str(workspace / "no-such-dumps"), "--json", str(report)], cwd=workspace)
    assert failed.returncode == 2
    doc = json.loads(report.read_text())
    assert (doc["tool"], doc["command"], doc["status"], doc["exit_code"]) == ("ddpdoctor", "fr", "error", 2)
    assert "no-such-dumps" in doc["error"] and doc["error"] in failed.stderr


def test_fr_never_takes_its_own_output_for_a_dump(workspace: Path) -> None:
    """`fr DIR --json DIR/verdict_rank_2.json` made the next `fr DIR` fail with "two dumps for rank 2"."""
    dumps = workspace / "dumps"
    shutil.copy(dumps / "nccl_trace_rank_0", dumps / "nccl_trace_rank_2")  # a second rank's dump
    first = run_cli(["fr", str(dumps), "--json", str(dumps / "verdict_rank_2.json")], cwd=workspace)
    assert first.returncode in (0, 1), first.stderr
    again = run_cli(["fr", str(dumps)], cwd=workspace)
    assert again.returncode == first.returncode, again.stderr
    assert again.stdout == first.stdout
    named = run_cli(["fr", str(dumps / "verdict_rank_2.json")], cwd=workspace)
    assert named.returncode == 2 and "a ddpdoctor `fr` document" in named.stderr
    # The same --json again: the verdict now sits among the dumps it would be read with; refused, one line
    # saying what to do, the first verdict untouched (issue 35: the policy, and tests/gpu's test, say this).
    before = (dumps / "verdict_rank_2.json").read_bytes()
    twice = run_cli(["fr", str(dumps), "--json", str(dumps / "verdict_rank_2.json")], cwd=workspace)
    assert twice.returncode == 2 and twice.stderr.count("\n") == 1, twice.stderr
    assert f"in the input folder PATH {dumps}" in twice.stderr and "write it outside" in twice.stderr
    assert (dumps / "verdict_rank_2.json").read_bytes() == before


def test_our_own_document_is_replaced_and_marked_as_ours(workspace: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Running a command twice with the same --json replaces its document; every document says whose it is."""
    runs = {"explain": ["explain", str(workspace / "train.log")], "fr": ["fr", str(workspace / "dumps")],
            "env": ["env", "--no-torch"], "ckpt inspect": ["ckpt", "inspect", str(workspace / "ddp.pt")],
            "stacks merge": ["stacks", "merge", str(workspace / "node.json")]}
    for command, argv in runs.items():
        report = workspace / f"{command.replace(' ', '_')}.json"
        for _ in range(2):
            code, err = run_main([*argv, "--json", str(report)], None, monkeypatch, capsys)
            assert code in (0, 1), (argv, err)
        assert outputs.is_our_json(report, command)
        doc = json.loads(report.read_text())
        assert list(doc)[:2] == ["tool", "command"] and doc["command"] == command
        assert [p.name for p in workspace.iterdir() if p.name.endswith(outputs.PARTIAL_SUFFIX)] == []


def test_new_json_reports_follow_the_umask(tmp_path: Path) -> None:
    """Every --json and evidence file was 0600 whatever the umask (mkstemp's mode)."""
    for umask, expected in ((0o022, 0o644), (0o027, 0o640), (0o002, 0o664)):
        report = tmp_path / f"env_{umask:o}.json"
        res = subprocess.run([sys.executable, "-m", "ddpdoctor", "env", "--no-torch", "--json", str(report)],
                             cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=120,
                             preexec_fn=lambda m=umask: os.umask(m))
        assert res.returncode == 0, res.stderr
        assert report.stat().st_mode & 0o777 == expected


def test_plots_are_written_in_the_format_their_name_says_and_only_ours_are_replaced(tmp_path: Path) -> None:
    from ddpdoctor.bench.analysis import Row
    from ddpdoctor.bench.render import write_plot

    rows = [Row(op="all_reduce", bytes=1 << n, count=1 << n, dtype="float", time_us=10.0 * n, max_time_us=10.0 * n,
                slowest_rank=0, algbw_gbps=1.0, busbw_gbps=1.0 * n, wrong=0) for n in range(10, 14)]
    magic = {".png": b"\x89PNG", ".svg": b"<?xml", ".pdf": b"%PDF"}
    for ext, head in magic.items():
        path = tmp_path / f"bw{ext}"
        write_plot(str(path), rows, "t")
        assert path.read_bytes().startswith(head) and outputs.is_our_plot(path)
        write_plot(str(path), rows, "again")  # ours: replaced
        user = tmp_path / f"user{ext}"
        user.write_bytes(head + b" a figure of the user's")
        with pytest.raises(DoctorError, match="not a plot ddpdoctor wrote"):
            write_plot(str(user), rows, "t")
        assert user.read_bytes() == head + b" a figure of the user's"


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_a_json_report_of_another_user_is_neither_taken_over_nor_replaced_as_root_it_keeps_its_owner(
        shared_tmp: Path) -> None:
    report = shared_tmp / "env.json"
    outputs.write_json(report, {"status": "pass"}, "env")
    report.chmod(0o666)  # even writable by all: replacing it would make it the other user's
    before = report.read_bytes()

    def replace_it() -> int:
        try:
            outputs.resolve("--json", report, outputs.JSON, command="env")
        except DoctorError as exc:
            return 0 if "belongs to another user" in str(exc) else 1
        return 1

    assert as_user(OTHER_UID, replace_it) == 0
    assert report.read_bytes() == before
    # Root replacing a user's report keeps it the user's, with its mode.
    os.chown(report, OTHER_UID, OTHER_UID)
    report.chmod(0o640)
    res = run_cli(["env", "--no-torch", "--json", str(report)], cwd=REPO)
    assert res.returncode == 0, res.stderr
    st = report.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (OTHER_UID, OTHER_UID, 0o640)
    assert report.read_bytes() != before


def test_evidence_refuses_a_folder_in_use_and_a_reused_bundle(workspace: Path, tmp_path: Path, no_ranks_start: None,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`--evidence .` overwrote the user's report.txt and env.json; a reused folder mixed two runs' dumps.
    The bundle is a real watch run's; the refusals, which come before any rank, run in-process."""
    script = tmp_path / "crash.py"
    script.write_text("raise SystemExit('the watched script fails')\n")
    (workspace / "report.txt").write_text("the user's own report\n")
    bundle = tmp_path / "bundle"
    first = run_cli(["watch", "--nproc", "1", "--evidence", str(bundle), str(script)], cwd=tmp_path, timeout=300)
    assert first.returncode == 1, first.stderr
    assert (bundle / "verdict.json").is_file() and outputs.is_our_json(bundle / "verdict.json", "watch")
    before, kept = snapshot(workspace), snapshot(bundle)
    for folder, cwd in ((".", workspace), (str(bundle), tmp_path)):
        code, err = run_main(["watch", "--nproc", "1", "--evidence", folder, str(script)], cwd, monkeypatch, capsys)
        assert code == 2 and "--evidence" in err and "not empty" in err, err
    assert snapshot(workspace) == before and snapshot(bundle) == kept


def test_an_empty_output_path_asks_for_the_kind_of_name_the_option_takes() -> None:
    """`--evidence ""` (an unset shell variable) was told to "give a file name" for an option that takes a folder."""
    with pytest.raises(DoctorError, match=r"^--evidence: an empty path; give a folder name$"):
        outputs.resolve("--evidence", "", outputs.EVIDENCE_FOLDER)
    with pytest.raises(DoctorError, match=r"^--json: an empty path; give a file name$"):
        outputs.resolve("--json", "", outputs.JSON)


def test_an_evidence_folder_filled_during_the_run_gets_no_bundle_mixed_in(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from ddpdoctor.watch import evidence

    folder = tmp_path / "ev"
    evidence.validate(str(folder))  # accepted before the run: it does not exist yet
    folder.mkdir()
    (folder / "other_run.txt").write_text("another run's file\n")
    chosen = evidence.prepare(str(folder))
    assert chosen is not None and Path(chosen) != folder and "no longer empty" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["other_run.txt"]
    shutil.rmtree(chosen)


def test_a_check_that_never_ran_leaves_the_error_document_not_yesterdays_report(tmp_path: Path) -> None:
    """A busy MASTER_PORT stops `check` before any rank starts (exit 1, no result): the --json file must
    not go on saying yesterday's "pass" about today's run."""
    import socket

    report = tmp_path / "check.json"
    outputs.write_json(report, {"status": "pass", "world_size": 2}, "check")  # an earlier run's result
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        res = run_cli(["check", "--nproc", "2", "--master-port", str(holder.getsockname()[1]), "--json", str(report)],
                      cwd=REPO, timeout=180)
    finally:
        holder.close()
    assert res.returncode == 1, res.stderr
    doc = json.loads(report.read_text())
    assert (doc["command"], doc["status"], doc["exit_code"]) == ("check", "error", 1)
    assert "is already in use" in doc["error"] and doc["error"] in res.stderr


@pytest.mark.skipif(outputs.pseudo_filesystem(Path("/sys")) is None, reason="no sysfs mounted at /sys here")
@pytest.mark.parametrize("argv", [
    ["bench", "-e", "4K", "-n", "2", "--json", "/sys/x.json"],
    ["check", "--only", "env", "--json", "/sys/x.json"],
    ["check", "--only", "env", "--log-dir", "/sys/ddpdoctor-logs"],
    ["explain", "LOG", "--json", "/proc/x.json"],
])
def test_an_output_on_the_kernels_filesystems_is_refused_before_any_work(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """As root, access(2) passes its write check on /sys and /proc, and creating the file then fails: `bench`
    ran its whole sweep and ended with exit 3, `check` printed PASS and exited 1, `explain` said /proc does not
    exist (an explorer's finds). Now one line, exit 2, before any rank starts."""
    log = tmp_path / "job.log"
    log.write_text("hello\n")
    code, err = run_main([str(log) if a == "LOG" else a for a in argv], tmp_path, monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "filesystem, where no file can be created" in err
