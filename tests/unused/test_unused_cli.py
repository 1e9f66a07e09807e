"""`ddpdoctor unused` as a real subprocess: exit codes, output, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import REPO, clean_env, run_cli

EXAMPLES = str(REPO / "examples" / "models_unused.py")


def test_healthy_model_exits_0_and_keeps_default_flags() -> None:
    proc = run_cli(["unused", f"{EXAMPLES}:healthy", "--input-shape", "4,16"])
    assert proc.returncode == 0, proc.stderr
    assert "all 6 trainable parameters got a gradient on every step" in proc.stdout
    assert "find_unused_parameters=False, static_graph=False" in proc.stdout


def test_dead_branch_exits_1_naming_parameters_and_module() -> None:
    proc = run_cli(["unused", f"{EXAMPLES}:dead_branch", "--input-shape", "4,16"])
    assert proc.returncode == 1, proc.stderr
    assert "2 never used" in proc.stdout
    assert "aux_head.weight  [aux_head: Linear]" in proc.stdout and "aux_head.bias" in proc.stdout


def test_data_dependent_json_lists_sometimes_used() -> None:
    proc = run_cli(["unused", f"{EXAMPLES}:data_dependent", "--batch", f"{EXAMPLES}:alternating_batch",
                    "--steps", "4", "--json", "-"])
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data["sometimes_used"]) == {"pos_head.weight", "pos_head.bias", "neg_head.weight", "neg_head.bias"}
    assert data["never_used"] == [] and data["steps"] == 4
    assert data["recommendation"]["find_unused_parameters"] is True


def test_unused_output_exits_1_and_names_the_output() -> None:
    proc = run_cli(["unused", f"{EXAMPLES}:unused_output", "--input-shape", "4,16"])
    assert proc.returncode == 1
    assert "output[1] (4, 4) does not contribute to the loss" in proc.stdout


def test_loss_over_all_outputs_clears_the_unused_output(tmp_path: Path) -> None:
    loss = tmp_path / "myloss.py"
    loss.write_text("def both(out, batch):\n    return out[0].sum() + out[1].sum()\n")
    proc = run_cli(["unused", f"{EXAMPLES}:unused_output", "--input-shape", "4,16", "--loss", f"{loss}:both"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_find_unused_flag_on_a_healthy_model_is_reported_as_waste() -> None:
    proc = run_cli(["unused", f"{EXAMPLES}:healthy", "--input-shape", "4,16", "--ddp-find-unused"])
    assert proc.returncode == 1
    assert "find_unused_parameters=True is set but not needed" in proc.stdout


@pytest.mark.parametrize(("source", "args", "expected"), [
    ("import nosuchpackage_xyz\n\ndef build():\n    pass\n", [],
     "ModuleNotFoundError: No module named 'nosuchpackage_xyz' (at usermodel.py:1)"),  # the user's line, not importlib's
    ("def build():\n    raise RuntimeError('CUDA out of memory (pretend)')\n", [],
     "RuntimeError: CUDA out of memory (pretend) (at usermodel.py:2)"),
    ("def build():\n    return 42\n", [], "returned int, expected a torch.nn.Module"),
])
def test_bad_factory_exits_2_with_one_line(tmp_path: Path, source: str, args: list[str], expected: str) -> None:
    (tmp_path / "usermodel.py").write_text(source)
    proc = run_cli(["unused", f"{tmp_path / 'usermodel.py'}:build", "--input-shape", "4,16", *args])
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("spec", "expected"), [
    ("{tmp}/:build", "is a folder; give the .py file that defines the factory"),
    ("nosuchpackage_xyz.models:build", "ModuleNotFoundError: No module named 'nosuchpackage_xyz'; a dotted MODULE is "
                                       "imported from the current folder"),
], ids=["a-folder", "a-module-not-importable-from-here"])
def test_a_factory_that_cannot_be_found_says_what_to_give(tmp_path: Path, spec: str, expected: str) -> None:
    """`examples/:healthy` read "no such file 'examples/'"; `examples.models:make` run from another folder named
    importlib's own line as where the error was."""
    proc = run_cli(["unused", spec.format(tmp=tmp_path), "--input-shape", "4,16"], cwd=tmp_path)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "__init__.py" not in proc.stderr


def test_an_input_shape_too_large_to_allocate_is_named_as_the_option() -> None:
    """The random batch is ddpdoctor's own: "the batch function raised" named a function the user never gave."""
    proc = run_cli(["unused", f"{EXAMPLES}:healthy", "--input-shape", "100000,100000,100000"])
    assert proc.returncode == 2
    assert proc.stderr.startswith("ddpdoctor: error: --input-shape 100000x100000x100000: cannot make a random batch")
    assert "batch function" not in proc.stderr


def test_batch_of_wrong_shape_exits_2_pointing_at_the_model_line() -> None:
    proc = run_cli(["unused", f"{EXAMPLES}:healthy", "--input-shape", "4,15"])
    assert proc.returncode == 2
    assert "mat1 and mat2 shapes cannot be multiplied (4x15 and 16x32)" in proc.stderr
    assert "models_unused.py:" in proc.stderr and "Traceback" not in proc.stderr


def test_batch_function_that_raises_exits_2(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text("def batch(step):\n    raise KeyError(f'shard {step} missing')\n")
    proc = run_cli(["unused", f"{EXAMPLES}:healthy", "--batch", f"{tmp_path / 'data.py'}:batch"])
    assert proc.returncode == 2
    assert "--batch" in proc.stderr and "KeyError: 'shard 0 missing' (at data.py:2)" in proc.stderr


def test_no_input_given_exits_2() -> None:
    proc = run_cli(["unused", f"{EXAMPLES}:healthy"])
    assert proc.returncode == 2 and "--input-shape" in proc.stderr


def test_a_bad_rank_variable_is_one_line_exit_2() -> None:
    """Under a launcher the batches differ per rank; a RANK that is not a number is bad usage."""
    proc = run_cli(["unused", f"{EXAMPLES}:healthy", "--input-shape", "4,16"],
                   env=clean_env({"RANK": "abc", "WORLD_SIZE": "2"}))
    assert proc.returncode == 2 and "RANK must be an integer" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_model_that_cannot_be_deep_copied_is_analysed(tmp_path: Path) -> None:
    """The command builds the model for this run only, so it analyses it in place: no copy needed."""
    source = tmp_path / "locked.py"
    source.write_text("""
import threading
import torch

class Locked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()  # copy.deepcopy cannot copy a lock
        self.used = torch.nn.Linear(16, 4)
        self.unused = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.used(x)

def build():
    return Locked()
""")
    proc = run_cli(["unused", f"{source}:build", "--input-shape", "4,16", "--json", "-"])
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["never_used"] == ["unused.weight", "unused.bias"]


# -- the --json convention, in-process (typer's CliRunner) --------------------------------------------

def test_json_path_writes_the_document_and_still_prints_the_report(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    out = tmp_path / "unused.json"
    result = CliRunner().invoke(app, ["unused", f"{EXAMPLES}:dead_branch", "--input-shape", "4,16",
                                      "--json", str(out)])
    assert result.exit_code == 1, result.output
    assert "2 never used" in result.stdout
    assert json.loads(out.read_text())["never_used"] == ["aux_head.weight", "aux_head.bias"]


def test_json_dash_prints_only_the_document_in_process() -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    result = CliRunner().invoke(app, ["unused", f"{EXAMPLES}:dead_branch", "--input-shape", "4,16", "--json", "-"])
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["never_used"] == ["aux_head.weight", "aux_head.bias"]
