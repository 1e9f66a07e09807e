"""The `state_dict` check, called directly with a rank-0 CheckContext (no process group needed)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ddpdoctor.check.api import CheckContext, CheckOptions
from ddpdoctor.checks import state_dict
from ddpdoctor.findings import Finding
from examples.ckpt_models import make_mlp
from tests.ckpt.test_safety import _evil_checkpoints

MODEL = "examples.ckpt_models:make_mlp"


def _run(checkpoint: str | None = None, model: str | None = None) -> list[Finding]:
    ctx = CheckContext(rank=0, world_size=1, local_rank=0, local_world_size=1, host="node-a", pid=os.getpid(),
                       launcher="none", backend="gloo", device="cpu", master_addr="127.0.0.1", master_port=0,
                       process_group=None, store=None, options=CheckOptions(checkpoint=checkpoint, model=model))
    return state_dict.CHECK.run(ctx)


def _ddp_ckpt(tmp_path: Path) -> Path:
    path = tmp_path / "ddp.pt"
    torch.save({"epoch": 1, "model": {f"module.{k}": v for k, v in make_mlp().state_dict().items()}}, path)
    return path


def test_check_identity() -> None:
    assert state_dict.CHECK.id == "state_dict" and state_dict.CHECK.rank0_only


def test_skip_without_checkpoint() -> None:
    [f] = _run()
    assert f.status == "skip" and "--checkpoint" in f.summary


def test_prefix_is_a_warning_without_model(tmp_path: Path) -> None:
    [f] = _run(str(_ddp_ckpt(tmp_path)))
    assert f.status == "warn" and "'module.'" in f.summary
    assert "ddpdoctor ckpt strip" in f.remedy


def test_with_model_fails_and_names_the_fix(tmp_path: Path) -> None:
    path = _ddp_ckpt(tmp_path)
    [f] = _run(str(path), MODEL)
    assert f.status == "fail"
    assert "loads with strict=True after: remove 'module.'" in f.summary
    assert f.details["fix"]["strip_prefixes"] == ["module."]
    assert f.details["missing"][0] == "fc1.weight" and f.details["unexpected"][0] == "module.fc1.weight"


def test_with_model_passes_after_strip(tmp_path: Path) -> None:
    from ddpdoctor.ckpt import strip_file

    src = _ddp_ckpt(tmp_path)
    out = tmp_path / "plain.pt"
    strip_file(src, out)
    [f] = _run(str(out), MODEL)
    assert f.status == "pass", f.summary


def test_unreadable_checkpoint_and_bad_model_are_failures_not_errors(tmp_path: Path) -> None:
    [f] = _run(str(tmp_path / "missing.pt"))
    assert f.status == "fail" and "not found" in f.summary
    [f] = _run(str(_ddp_ckpt(tmp_path)), "examples.ckpt_models:make_broken")
    assert f.status == "fail" and "num_classes must be set" in f.summary


def test_malicious_checkpoint_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker, paths = _evil_checkpoints(tmp_path)
    for path in paths:
        [f] = _run(str(path), MODEL)
        assert f.status == "fail" and "system" in f.summary
    assert not marker.exists()


def test_check_command_with_checkpoint_and_model_runs_the_state_dict_check_only(tmp_path: Path) -> None:
    """The README's `ddpdoctor check --checkpoint PATH --model M:F`: --model is for state_dict here."""
    import json

    from tests.support import REPO, run_cli

    report = tmp_path / "report.json"
    res = run_cli(["check", "--nproc", "1", "--only", "unused_params,state_dict", "--checkpoint",
                   str(_ddp_ckpt(tmp_path)), "--model", MODEL, "--json", str(report)], cwd=REPO, timeout=180)
    assert res.returncode == 1, res.stderr  # the checkpoint's 'module.' prefix fails state_dict
    by_check = {f["check"]: f for f in json.loads(report.read_text())["findings"]}
    assert by_check["state_dict"]["status"] == "fail"
    assert "remove 'module.'" in by_check["state_dict"]["summary"]
    assert by_check["unused_params"]["status"] == "skip"


def test_directories_dcp_and_shard_sets_are_checked(tmp_path: Path) -> None:
    """--checkpoint takes a torch.distributed.checkpoint directory and a shard set, as `ckpt` does."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from examples.ckpt_make_shards import make_shards

    sd = {f"module.{k}": v for k, v in make_mlp().state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: dcp.save saves as a single process
        dcp.save({"model": sd}, checkpoint_id=tmp_path / "dcp")
    [f] = _run(str(tmp_path / "dcp"), MODEL)
    assert f.status == "fail" and "loads with strict=True after: remove 'module.'" in f.summary
    assert f.remedy.startswith(f"ddpdoctor ckpt strip {tmp_path / 'dcp'} -o")
    [f] = _run(str(tmp_path / "dcp"))
    assert f.status == "warn" and "'module.'" in f.summary
    make_shards(tmp_path / "shards")
    [f] = _run(str(tmp_path / "shards" / "st"), "examples.ckpt_models:make_stack")
    assert f.status == "fail" and f.details["fix"]["strip_prefixes"] == ["module."]
    (tmp_path / "shards" / "st" / "model-00001-of-00003.safetensors").unlink()
    for model in (None, "examples.ckpt_models:make_stack"):
        findings = _run(str(tmp_path / "shards" / "st"), model)
        assert any(f.status == "fail" and "shard file(s) missing: model-00001-of-00003.safetensors" in f.summary
                   for f in findings), findings


def test_a_missing_shard_is_one_cause_not_a_wrong_architecture(tmp_path: Path) -> None:
    """`check --checkpoint SET --model M:F` with shard 2 gone gave two failures: "different architecture"
    and "download or copy the missing shard(s) again" (an explorer's find). The keys the shard held belong
    to the shard's finding; with the prefix removed the shard is the only failure."""
    from ddpdoctor.ckpt import strip_file
    from examples.ckpt_make_shards import make_shards

    make_shards(tmp_path / "shards")
    plain = tmp_path / "plain"
    strip_file(tmp_path / "shards" / "st", plain)
    (plain / "model-00002-of-00003.safetensors").unlink()
    findings = _run(str(plain), "examples.ckpt_models:make_stack")
    assert [f.status for f in findings] == ["fail", "pass"], findings
    shard, keys = findings
    assert shard.summary.startswith(f"{plain}: shard file(s) missing: model-00002-of-00003.safetensors; loading "
                                    "fails on the 5 key(s) the index places there")
    assert shard.remedy == "download or copy the missing shard(s) again" and shard.ranks == [0]
    assert "architecture" not in keys.summary + keys.remedy


def test_an_unsafe_checkpoint_gets_advice_that_works_from_check(tmp_path: Path) -> None:
    """The check has no --trust, yet said "If you trust where the file came from, pass --trust" (an explorer's
    find). It names the command that takes it, quoted for the shell, and that command runs without running
    the file."""
    import shlex

    from ddpdoctor.cli import main

    folder = tmp_path / "my run"
    folder.mkdir()
    marker, paths = _evil_checkpoints(folder)
    [f] = _run(str(paths[0]), MODEL)
    assert f.status == "fail" and "needs posix.system to load" in f.summary
    assert "--trust" not in f.summary
    command = f"ddpdoctor ckpt inspect --trust {shlex.quote(str(paths[0]))}"
    assert command in f.remedy, f.remedy
    assert main(shlex.split(command)[1:]) == 0
    assert not marker.exists()
