"""`ckpt inspect/strip/diff --json PATH|-`: the JSON convention every command follows.

``--json PATH`` writes the document atomically and still prints the text report; ``--json -`` prints the
document on stdout instead of the text. Tested in-process with typer's CliRunner and as the real
installed ``ddpdoctor`` command; a ``--json`` into a missing folder is refused in one line before any work.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ddpdoctor.cli import build_app, main
from examples.ckpt_models import MLP, make_mlp
from tests.support import REPO, clean_env

MODEL = "examples.ckpt_models:make_mlp"


@pytest.fixture
def ddp_ckpt(tmp_path: Path) -> Path:
    path = tmp_path / "in" / "ddp.pt"
    path.parent.mkdir()
    torch.save({"epoch": 3, "net": {f"module.{k}": v for k, v in make_mlp().state_dict().items()}}, path)
    return path


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(build_app("ckpt"), args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


def _ddpdoctor() -> list[str]:
    """The installed console script, as a user runs it (``python -m ddpdoctor`` where none is installed)."""
    script = Path(sys.executable).with_name("ddpdoctor")
    found = str(script) if script.exists() else shutil.which("ddpdoctor")
    return [found] if found else [sys.executable, "-m", "ddpdoctor"]


def _commands(src: Path, out: Path) -> dict[str, tuple[list[str], int]]:
    """Each ckpt command on a 'module.'-prefixed checkpoint, with the exit code it must give."""
    return {"inspect": (["ckpt", "inspect", str(src)], 0),
            "strip": (["ckpt", "strip", str(src), "-o", str(out)], 0),
            "diff": (["ckpt", "diff", str(src), "--model", MODEL], 1)}


def test_json_dash_prints_only_the_document_in_process(ddp_ckpt: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    docs = {}
    for name, (args, code) in _commands(ddp_ckpt, tmp_path / "o.pt").items():
        got, stdout = _invoke([*args, "--json", "-"])
        assert got == code, (name, stdout)
        docs[name] = json.loads(stdout)  # the whole of stdout is the document: no text report around it
    assert docs["inspect"]["state_dicts"][0]["prefixes"][0]["prefix"] == "module."
    assert docs["inspect"]["findings"][0]["check"] == "state_dict"
    assert docs["strip"]["renamed_keys"] == 9 and docs["strip"]["written"] is True
    assert docs["diff"]["fix"]["strip_prefixes"] == ["module."] and docs["diff"]["status"] == "fail"
    MLP().load_state_dict(torch.load(tmp_path / "o.pt", weights_only=True)["net"], strict=True)


def test_json_path_writes_the_document_and_still_prints_the_text_in_process(
        ddp_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    reports = tmp_path / "reports"
    reports.mkdir()
    texts = {"inspect": "findings:", "strip": "wrote ", "diff": "FAIL  net does not load as is"}
    for name, (args, code) in _commands(ddp_ckpt, tmp_path / "o.pt").items():
        target = reports / f"{name}.json"
        got, stdout = _invoke([*args, "--json", str(target)])
        assert got == code, (name, stdout)
        assert texts[name] in stdout and not stdout.lstrip().startswith("{")
        (tmp_path / "o.pt").unlink(missing_ok=True)  # strip never replaces a checkpoint (the output policy)
        _, dash = _invoke([*args, "--json", "-"])
        written, printed = json.loads(target.read_text()), json.loads(dash)
        written.pop("phases_s", None), printed.pop("phases_s", None)  # timings: each run has its own
        assert written == printed, name  # the same document either way
    assert sorted(p.name for p in reports.iterdir()) == ["diff.json", "inspect.json", "strip.json"]  # no temp files


def test_json_both_forms_from_the_installed_command(ddp_ckpt: Path, tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    base = [*_ddpdoctor(), "ckpt", "inspect", str(ddp_ckpt)]
    to_file = subprocess.run([*base, "--json", str(target)], capture_output=True, text=True, env=clean_env(),
                             cwd=REPO, timeout=120)
    assert to_file.returncode == 0, to_file.stderr
    assert "state_dict  net: 9 keys" in to_file.stdout
    to_stdout = subprocess.run([*base, "--json", "-"], capture_output=True, text=True, env=clean_env(),
                               cwd=REPO, timeout=120)
    assert to_stdout.returncode == 0, to_stdout.stderr
    assert json.loads(to_stdout.stdout) == json.loads(target.read_text())
    assert json.loads(to_stdout.stdout)["status"] == "warn"


def test_json_into_a_missing_folder_is_one_line_exit_2_before_any_work(
        ddp_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)
    bad = tmp_path / "no" / "such" / "r.json"
    marker = tmp_path / "factory-ran"
    factory = tmp_path / "factory.py"
    factory.write_text(f"open({str(marker)!r}, 'w').close()\nfrom examples.ckpt_models import make_mlp\n")
    out = tmp_path / "o.pt"
    cases = [["ckpt", "inspect", str(tmp_path / "missing.pt")],  # the --json error comes before this one
             ["ckpt", "strip", str(ddp_ckpt), "-o", str(out)],
             ["ckpt", "diff", str(ddp_ckpt), "--model", f"{factory}:make_mlp"]]
    for args in cases:
        capsys.readouterr()
        assert main([*args, "--json", str(bad)]) == 2, args
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.count("\n") == 1 and "--json" in captured.err and "does not exist" in captured.err
    assert not out.exists() and not marker.exists()  # no output written, the model never built
    assert not bad.parent.exists()
    real = subprocess.run([*_ddpdoctor(), *cases[1], "--json", str(bad)], capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=120)
    assert real.returncode == 2 and real.stdout == "" and not out.exists()
    assert real.stderr.startswith("ddpdoctor: error: --json") and real.stderr.count("\n") == 1


def test_strip_json_says_where_the_time_went(ddp_ckpt: Path, tmp_path: Path) -> None:
    """``phases_s``: each phase of docs/ckpt.md, in seconds; only a replaced file waits for the disk
    (``flush``), and the phases add up to no more than the run took."""
    import time

    from ddpdoctor.ckpt import strip_file

    names = {"open", "plan", "prepare", "pickle", "copy", "flush", "rename"}
    start = time.perf_counter()
    new = strip_file(ddp_ckpt, tmp_path / "o.pt")
    took = time.perf_counter() - start
    assert set(new.phases_s) == names and all(v >= 0 for v in new.phases_s.values())
    assert sum(new.phases_s.values()) <= took
    assert new.to_json()["phases_s"] == new.phases_s
    replaced = strip_file(ddp_ckpt, None, in_place=True)
    assert set(replaced.phases_s) == names and replaced.written
    unchanged = strip_file(ddp_ckpt, None, in_place=True)  # nothing left to strip: nothing written
    assert not unchanged.written and set(unchanged.phases_s) == {"open", "plan"}


def test_what_the_model_factory_prints_stays_out_of_the_json_on_stdout(ddp_ckpt: Path, tmp_path: Path) -> None:
    """`ckpt diff --json -` with a factory (and its module) that print: the document alone on stdout, their lines
    on stderr (an explorer's find: "building model..." went in front of the `{` and `jq` broke)."""
    factory = tmp_path / "noisy_factory.py"
    factory.write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\nprint('importing the noisy module')\n"
                       "from examples.ckpt_models import make_mlp\n\n\n"
                       "def build():\n    print('building model...')\n    return make_mlp()\n")
    run = subprocess.run([*_ddpdoctor(), "ckpt", "diff", str(ddp_ckpt), "--model", f"{factory}:build", "--json", "-"],
                         capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=120)
    assert run.returncode in (0, 1), run.stderr
    assert json.loads(run.stdout)["command"] == "ckpt diff"
    assert "importing the noisy module" in run.stderr and "building model..." in run.stderr


@pytest.mark.parametrize("name", ["my ckpt ü.pt", "-dash.pt", "it's $HOME.pt"])
def test_the_suggested_strip_command_runs_as_printed(tmp_path: Path, name: str) -> None:
    """The remedy's command line is pasted into a shell as it is: quoted paths, `./` before a leading dash (an
    explorer's find: `ddpdoctor ckpt strip my ckpt ü.pt -o ...` failed with exit 2, `-dash.pt` as an option)."""
    torch.save({"module.w": torch.zeros(2)}, tmp_path / name)
    inspect = subprocess.run([*_ddpdoctor(), "ckpt", "inspect", "--", name], capture_output=True, text=True,
                             env=clean_env(), cwd=tmp_path, timeout=120)
    [line] = [ln for ln in inspect.stdout.splitlines() if "fix: ddpdoctor ckpt strip" in ln]
    command = line.split("fix: ", 1)[1].split("   (or in Python", 1)[0]
    run = subprocess.run(command, shell=True, capture_output=True, text=True, env=clean_env(), cwd=tmp_path,
                         timeout=120)
    assert run.returncode == 0, (command, run.stderr)
    stripped = tmp_path / name.replace(".pt", ".stripped.pt")
    assert list(torch.load(stripped, weights_only=True)) == ["w"]
