"""The `unused_params` check: each rank's analysis and rank 0's comparison, directly and for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.check import CheckContext, CheckOptions
from ddpdoctor.checks import unused_params
from ddpdoctor.findings import Finding
from tests.support import REPO, run_cli

EXAMPLES = str(REPO / "examples" / "models_unused.py")


def _ctx(rank: int, world_size: int, **options: object) -> CheckContext:
    return CheckContext(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
                        host="node-a", pid=1000 + rank, launcher="test", backend="gloo", device="cpu",
                        master_addr="127.0.0.1", master_port=29500, process_group=None, store=None,
                        options=CheckOptions(**options))  # type: ignore[arg-type]


def _run_ranks(monkeypatch: pytest.MonkeyPatch, world_size: int, **options: object) -> list[Finding]:
    """Every rank's _run in turn (RANK set as a launcher would), then rank 0's _combine."""
    by_rank = {}
    for rank in range(world_size):
        monkeypatch.setenv("RANK", str(rank))
        found = unused_params._run(_ctx(rank, world_size, **options))
        for f in found:
            f.check = "unused_params"
        by_rank[rank] = found
    return unused_params._combine(by_rank, {})


def test_without_model_the_check_skips_and_says_how_to_enable_it() -> None:
    (finding,) = unused_params._run(_ctx(0, 1))
    assert finding.status == "skip" and "--model" in finding.remedy


def test_model_without_input_skips_and_says_how_to_enable_it() -> None:
    """`check --checkpoint X --model M:F` gives --model to the state_dict check; no input, no usage check."""
    (finding,) = unused_params._run(_ctx(0, 1, model=f"{EXAMPLES}:healthy"))
    assert finding.status == "skip" and "--input-shape" in finding.summary + finding.remedy


def test_factory_that_raises_is_summarised(tmp_path: Path) -> None:
    bad = tmp_path / "badmodel.py"
    bad.write_text("def build():\n    raise FileNotFoundError('no such checkpoint: /ckpt/last.pt')\n")
    (finding,) = unused_params._run(_ctx(0, 1, model=f"{bad}:build", input_shape=(4, 16)))
    assert finding.status == "error"
    assert "FileNotFoundError: no such checkpoint: /ckpt/last.pt" in finding.summary
    assert "badmodel.py:2" in finding.summary


def test_rank_dependent_parameters_named_with_their_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    findings = _run_ranks(monkeypatch, 3, model=f"{EXAMPLES}:rank_dependent", input_shape=(4, 16))
    fails = [f for f in findings if f.status == "fail"]
    assert len(fails) == 1
    assert fails[0].details["params"] == ["extra.weight", "extra.bias"]
    assert fails[0].details["used_on_ranks"] == [1] and fails[0].ranks == [0, 2]
    assert "used on rank 1 but never on ranks 0,2" in fails[0].summary
    assert "find_unused_parameters=True" in fails[0].remedy


def test_dead_branch_is_never_used_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    findings = _run_ranks(monkeypatch, 2, model=f"{EXAMPLES}:dead_branch", batch=f"{EXAMPLES}:batch")
    (fail,) = [f for f in findings if f.status == "fail"]
    assert fail.details["params"] == ["aux_head.weight", "aux_head.bias"] and fail.ranks == [0, 1]
    assert "never used on any rank" in fail.summary


def test_unused_output_remedy_names_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    findings = _run_ranks(monkeypatch, 2, model=f"{EXAMPLES}:unused_output", input_shape=(4, 16))
    (fail,) = [f for f in findings if f.status == "fail"]
    assert fail.details["dead_outputs"] == ["output[1]"] and "output[1]" in fail.remedy


def test_healthy_unseeded_model_passes_both_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    findings = _run_ranks(monkeypatch, 2, model=f"{EXAMPLES}:healthy", input_shape=(4, 16))
    assert [f.status for f in findings] == ["pass", "pass"]
    assert "all 6 trainable parameters get a gradient" in findings[0].summary


def test_per_rank_seed_shows_as_value_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    findings = _run_ranks(monkeypatch, 3, model=f"{EXAMPLES}:seeded_per_rank", input_shape=(4, 16))
    (warn,) = [f for f in findings if f.status == "warn"]
    assert "weights differ across ranks" in warn.summary and warn.ranks == [1, 2]
    assert {d["field"] for d in warn.details["differences"]} == {"values"}
    assert "seed" in warn.remedy


def test_rank_dependent_width_is_a_structural_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    findings = _run_ranks(monkeypatch, 2, model=f"{EXAMPLES}:width_per_rank", input_shape=(4, 16))
    (fail,) = [f for f in findings if f.status == "fail"]
    assert "encoder.0.weight: shape differs: [32, 16] on rank 0; [40, 16] on rank 1" in fail.summary
    assert fail.ranks == [1] and "DDP expects same model across all ranks" in fail.remedy


# -- real multi-rank runs through `ddpdoctor check` ---------------------------------------------------

def _registered() -> bool:
    from ddpdoctor.checks import CHECK_IDS

    return "unused_params" in CHECK_IDS


needs_registration = pytest.mark.skipif(not _registered(), reason="unused_params not yet in checks/__init__.py")


def _check(tmp_path: Path, factory: str, nproc: int, *extra: str) -> tuple[int, list[dict[str, object]], str]:
    out = tmp_path / "report.json"
    proc = run_cli(["check", "--only", "unused_params", "--model", f"{EXAMPLES}:{factory}", *extra,
                    "--nproc", str(nproc), "--timeout", "120", "--json", str(out)], timeout=300)
    assert out.exists(), proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    return proc.returncode, [f for f in report["findings"] if f["check"] == "unused_params"], proc.stdout


@pytest.mark.slow
@needs_registration
def test_real_three_ranks_rank_dependent_branch_with_batch_fn(tmp_path: Path) -> None:
    """3 ranks (a 2-rank job of the same factory asserted a subset: the FAIL on the ranks that left the
    parameters unused, named in the JSON and the text; --input-shape is exercised by the tests below)."""
    code, findings, stdout = _check(tmp_path, "rank_dependent", 3, "--batch", f"{EXAMPLES}:batch")
    assert code == 1
    (fail,) = [f for f in findings if f["status"] == "fail"]
    assert fail["details"]["used_on_ranks"] == [1] and fail["ranks"] == [0, 2]
    assert fail["details"]["params"] == ["extra.weight", "extra.bias"]
    assert "extra.weight" in stdout
    # Unseeded factory: each process draws its own weights; that is not reported as a difference.
    assert any(f["status"] == "pass" and "same model structure" in f["summary"] for f in findings)


@pytest.mark.slow
@needs_registration
def test_real_two_ranks_seed_per_rank_is_named(tmp_path: Path) -> None:
    _, findings, _ = _check(tmp_path, "seeded_per_rank", 2, "--input-shape", "4,16")
    (warn,) = [f for f in findings if f["status"] == "warn"]
    assert warn["ranks"] == [1] and "weights differ across ranks" in warn["summary"]


RANK_FROM_PROCESS_GROUP = '''
import torch.distributed as dist
from torch import nn


class RankOneHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 4)
        self.rank_one_head = nn.Linear(4, 4)

    def forward(self, x):
        y = self.body(x)
        # The rank as training code reads it: from the process group, 0 when there is none.
        if (dist.get_rank() if dist.is_initialized() else 0) == 1:
            y = self.rank_one_head(y)
        return y


def build():
    return RankOneHead()
'''


@pytest.mark.slow
@needs_registration
def test_real_only_unused_params_runs_the_model_inside_the_process_group(tmp_path: Path) -> None:
    # With --only unused_params no selected check needs the process group; the model's forward must
    # still see its rank through dist.get_rank(), or rank 1's branch goes unseen. `--json -`: the report
    # is rank 0's stdout, as JSON only.
    source = tmp_path / "rank_model.py"
    source.write_text(RANK_FROM_PROCESS_GROUP)
    proc = run_cli(["check", "--only", "unused_params", "--model", f"{source}:build", "--input-shape", "4,16",
                    "--nproc", "2", "--backend", "gloo", "--timeout", "120", "--json", "-"], timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    (fail,) = [f for f in report["findings"] if f["check"] == "unused_params" and f["status"] == "fail"]
    assert fail["ranks"] == [0] and fail["details"]["used_on_ranks"] == [1]
    assert fail["details"]["params"] == ["rank_one_head.weight", "rank_one_head.bias"]
