"""`ddpdoctor env`: a paste-ready block and JSON from this real machine; `--no-torch` imports no torch."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.support import clean_env, run_cli


def test_env_block_names_versions_machine_and_watched_variables() -> None:
    # A value with a newline and an escape sequence (an explorer's find: it printed "fake line" as a line of
    # its own, forging a line of the bug report): shown escaped, as Python's repr, on the variable's line.
    forged = "INIT\nfake line\x1b[2J"
    proc = run_cli(["env"], env=clean_env({"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4",
                                           "NCCL_DEBUG_SUBSYS": forged}), timeout=90)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"environment on {socket.gethostname()}" in out
    assert "torch        2." in out
    assert "NCCL_DEBUG=INFO" in out and "OMP_NUM_THREADS=4" in out
    assert "  NCCL_DEBUG_SUBSYS='INIT\\nfake line\\x1b[2J'" in out.splitlines()
    assert "fake line" not in out.splitlines() and "\x1b" not in out
    assert "launcher     none" in out
    # No GPU here: the block says so and why (not a traceback).
    assert "gpus         none:" in out


def test_env_json_is_data() -> None:
    proc = run_cli(["env", "--json", "-"], env=clean_env({"GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO\nx"}),
                   timeout=90)
    data = json.loads(proc.stdout)
    assert data["vars"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO\nx"}  # JSON: the values as they are
    assert data["versions"]["torch"].startswith("2.")
    assert "lo" in data["interfaces"]
    assert data["gpu"]["available"] is False and data["gpu"]["reason"]


def test_env_no_torch_does_not_import_torch() -> None:
    code = ("import sys; from ddpdoctor.cli import main; rc = main(['env', '--no-torch']); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "torch        not imported (--no-torch)" in proc.stdout


def test_env_reports_an_invalid_launcher_environment_instead_of_crashing() -> None:
    proc = run_cli(["env", "--no-torch"], env=clean_env({"RANK": "x", "WORLD_SIZE": "2"}), timeout=60)
    assert proc.returncode == 0
    assert "launcher     invalid: RANK must be an integer" in proc.stdout


def test_env_json_path_writes_the_document_and_still_prints_the_block(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    out = tmp_path / "env.json"
    result = CliRunner().invoke(app, ["env", "--no-torch", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert f"environment on {socket.gethostname()}" in result.stdout
    data = json.loads(out.read_text())
    assert data["versions"]["python"] == sys.version.split()[0] and "torch" not in data["versions"]


def test_env_json_dash_prints_only_the_document_in_process() -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    result = CliRunner().invoke(app, ["env", "--no-torch", "--json", "-"])
    assert result.exit_code == 0, result.output
    assert "environment on" not in result.stdout
    assert "interfaces" in json.loads(result.stdout)


def test_no_fact_can_write_a_line_of_its_own() -> None:
    """Every value in the block comes from outside ddpdoctor (host name, launcher error, interface names,
    paths): whichever holds a control character, the block keeps one line per fact, the character escaped."""
    from ddpdoctor.env.report import collect, render

    facts = collect(with_torch=False)
    facts["host"] = "node\nfake: host"
    facts["launcher"] = {"launcher": "invalid", "error": "RANK must be an integer, got: '1\r\nx'"}
    facts["interfaces"] = {"eth\x1b0": ["10.0.0.1"]}
    facts["vars"] = {"NCCL_\nX": "1"}
    lines = render(facts).splitlines()
    assert lines[0].endswith("environment on node\\nfake: host")
    assert "launcher     invalid: RANK must be an integer, got: '1\\r\\nx'" in lines
    assert any(line.startswith("interfaces   ") and "eth\\x1b0 10.0.0.1" in line for line in lines)
    assert "  NCCL_\\nX=1" in lines
    assert all(line.isprintable() for line in lines)
