"""`ddpdoctor ckpt inspect/strip/diff` on checkpoints saved from real DDP and torch.compile wrappers."""

from __future__ import annotations

import json
import subprocess
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from ddpdoctor.ckpt import build_model_for_shapes, load_checkpoint_into, strip_file
from ddpdoctor.ckpt.prefixes import plan_renames
from ddpdoctor.errors import DoctorError
from examples.ckpt_models import MLP, make_mlp
from tests.ckpt.conftest import sha as _sha
from tests.support import REPO, load_checking_offsets, run_cli

MODEL = "examples.ckpt_models:make_mlp"


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return run_cli(args, cwd=REPO)


def test_inspect_reports_ddp_prefix_state_dict_location_and_other_entries(ex: Path) -> None:
    res = _cli(["ckpt", "inspect", str(ex / "ddp.pt"), "--json", "-"])
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["format"] == "torch_zip"
    [sd] = rep["state_dicts"]
    assert sd["location"] == "net" and sd["keys"] == 9
    assert sd["prefixes"] == [{"prefix": "module.", "keys": 9, "examples": sd["prefixes"][0]["examples"]}]
    others = {e["key"]: e["summary"] for e in rep["other_entries"]}
    assert others["epoch"] == "int: 3"
    assert others["optimizer"].startswith("optimizer state: 6 parameter states, 1 param group(s), lr=0.1")
    assert rep["status"] == "warn"
    [finding] = rep["findings"]
    assert finding["check"] == "state_dict" and finding["status"] == "warn"
    assert "ddpdoctor ckpt strip" in finding["remedy"]
    # Optimizer momentum buffers are tensors too: 9 state_dict entries + 6 buffers.
    assert rep["tensor_count"] == 15 and rep["dtypes"] == {"float32": 14, "int64": 1}


def test_inspect_text_mentions_prefix_and_fix(ex: Path, cli: Any) -> None:
    res = cli(["ckpt", "inspect", str(ex / "ddp_compiled.pt")])
    assert res.returncode == 0, res.stderr
    assert "'module._orig_mod.' on 9/9 keys" in res.stdout
    assert "torch.compile" in res.stdout and "fix: ddpdoctor ckpt strip" in res.stdout


def test_strip_output_loads_weights_only_and_mmap_equal_tensors(ex: Path, tmp_path: Path) -> None:
    src = ex / "ddp.pt"
    before = _sha(src)
    out = tmp_path / "plain.pt"
    res = _cli(["ckpt", "strip", str(src), "-o", str(out)])
    assert res.returncode == 0, res.stderr
    assert "9 keys renamed" in res.stdout
    assert _sha(src) == before
    orig = torch.load(src, weights_only=True)
    for mmap in (False, True):
        new = torch.load(out, weights_only=True, mmap=mmap)
        assert list(new["net"]) == [k[len("module."):] for k in orig["net"]]
        for key, value in new["net"].items():
            assert torch.equal(value, orig["net"]["module." + key])
        assert new["epoch"] == 3 and new["config"] == {"lr": 0.1, "arch": "mlp"}
        assert new["optimizer"]["param_groups"] == orig["optimizer"]["param_groups"]
        for idx, state in orig["optimizer"]["state"].items():
            assert torch.equal(new["optimizer"]["state"][idx]["momentum_buffer"], state["momentum_buffer"])
        # _metadata (module versions, e.g. BatchNorm's) follows the keys, as consume_prefix... does it.
        assert set(new["net"]._metadata) == {"", "fc1", "bn", "fc2"}
        assert new["net"]._metadata["bn"] == orig["net"]._metadata["module.bn"]
    model = MLP()
    model.load_state_dict(torch.load(out, weights_only=True)["net"], strict=True)


def test_strip_keeps_torch_zip_layout(ex: Path, tmp_path: Path, cli: Any) -> None:
    """Every record 64-byte aligned, and torch's offset arithmetic (calculate_storage_offsets) holds."""
    out = tmp_path / "o.pt"
    assert cli(["ckpt", "strip", str(ex / "ddp.pt"), "-o", str(out)]).returncode == 0
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        assert names[0].endswith("/data.pkl")
        assert {n.split("/", 1)[1] for n in names} >= {"data.pkl", "byteorder", "version",
                                                         ".data/serialization_id", ".format_version"}
        assert zf.testzip() is None  # every CRC matches
        src_id = zipfile.ZipFile(ex / "ddp.pt").read("ddp/.data/serialization_id")
        assert zf.read("ddp/.data/serialization_id") == src_id
    with out.open("rb") as fh:
        data = fh.read()
    for info in zipfile.ZipFile(out).infolist():
        name_len, extra_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
            int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
        assert (info.header_offset + 30 + name_len + extra_len) % 64 == 0, info.filename
    loaded, meta = load_checking_offsets(out)
    assert sorted(loaded["net"])[0] == "bn.bias"
    assert meta["net"]["fc1.weight"].shape == loaded["net"]["fc1.weight"].shape
    # Tensor payloads keep their page offset: the kernel copies page-congruent ranges twice as fast.
    from ddpdoctor.ckpt import zip_rewrite

    src_recs = {r.name: r.data_offset for r in zip_rewrite.open_zip(ex / "ddp.pt").records}
    out_recs = {r.name: r.data_offset for r in zip_rewrite.open_zip(out).records}
    tensors = [n for n in src_recs if "/data/" in n]
    assert tensors and all(out_recs[n] % 4096 == src_recs[n] % 4096 for n in tensors)
    assert out.stat().st_size < (ex / "ddp.pt").stat().st_size + 4096


@pytest.mark.parametrize("name", ["ddp_compiled.pt", "compiled_ddp.pt"])
def test_strip_removes_combined_prefixes_in_either_order(ex: Path, tmp_path: Path, name: str, cli: Any) -> None:
    out = tmp_path / name
    res = cli(["ckpt", "strip", str(ex / name), "-o", str(out), "--json", "-"])
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["renamed_keys"] == 9
    MLP().load_state_dict(torch.load(out, weights_only=True), strict=True)


def test_strip_shared_storage_and_views_stay_shared(tmp_path: Path) -> None:
    base = torch.arange(12, dtype=torch.float32)
    sd = OrderedDict([("module.w", base.view(3, 4)), ("module.tied", base.view(3, 4)),
                      ("module.tail", base[6:])])
    src, out = tmp_path / "tied.pt", tmp_path / "out.pt"
    torch.save(sd, src)
    strip_file(src, out)
    new = torch.load(out, weights_only=True, mmap=True)
    assert list(new) == ["w", "tied", "tail"]
    assert new["w"].untyped_storage().data_ptr() == new["tied"].untyped_storage().data_ptr()
    assert torch.equal(new["tail"], base[6:])
    assert len([n for n in zipfile.ZipFile(out).namelist() if "/data/" in n]) == 1


def test_strip_refuses_mixed_keys_and_leaves_no_output(ex: Path, tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "never.pt"
    res = cli(["ckpt", "strip", str(ex / "mixed.pt"), "-o", str(out)])
    assert res.returncode == 2
    assert "duplicate key 'fc1.weight'" in res.stderr and "'module.fc1.weight'" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    inspect = cli(["ckpt", "inspect", str(ex / "mixed.pt")])
    assert inspect.returncode == 1 and "FAIL" in inspect.stdout


def test_strip_refuses_to_overwrite_input_unless_in_place(ex: Path, tmp_path: Path, cli: Any) -> None:
    src = tmp_path / "ddp.pt"
    src.write_bytes((ex / "ddp.pt").read_bytes())
    before = _sha(src)
    res = cli(["ckpt", "strip", str(src), "-o", str(src)])
    assert res.returncode == 2 and "--in-place" in res.stderr
    assert _sha(src) == before
    res = cli(["ckpt", "strip", str(src), "--in-place"])
    assert res.returncode == 0, res.stderr
    assert next(iter(torch.load(src, weights_only=True)["net"])) == "fc1.weight"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp.pt"]  # no temp file left
    stat = src.stat()
    res = cli(["ckpt", "strip", str(src), "--in-place"])
    assert res.returncode == 0 and "nothing to strip" in res.stdout
    assert src.stat().st_mtime_ns == stat.st_mtime_ns


def test_strip_given_prefix_and_key(tmp_path: Path) -> None:
    model_sd = {f"model.{k}": v for k, v in make_mlp().state_dict().items()}
    ema_sd = {f"module.{k}": v for k, v in make_mlp().state_dict().items()}
    src, out = tmp_path / "two.pt", tmp_path / "out.pt"
    torch.save({"model": model_sd, "ema": ema_sd}, src)
    rep = strip_file(src, out, prefixes=["model"], key="model")
    assert rep.renamed_keys == 9
    new = torch.load(out, weights_only=True)
    assert next(iter(new["model"])) == "fc1.weight"
    assert next(iter(new["ema"])) == "module.fc1.weight"  # --key: the other state_dict is left alone


def test_strip_safetensors_keeps_metadata(ex: Path, tmp_path: Path, cli: Any) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    out = tmp_path / "plain.safetensors"
    res = cli(["ckpt", "strip", str(ex / "ddp.safetensors"), "-o", str(out)])
    assert res.returncode == 0, res.stderr
    orig = load_file(str(ex / "ddp.safetensors"))
    new = load_file(str(out))
    assert sorted(new) == sorted(k[len("module."):] for k in orig)
    assert all(torch.equal(new[k], orig["module." + k]) for k in new)
    with safe_open(str(out), "pt") as fh:
        assert fh.metadata() == {"format": "pt", "epoch": "3"}
    MLP().load_state_dict(new, strict=True)
    # The data block keeps its page offset (a faster kernel copy), and tensors stay 8-byte aligned.
    src_start = 8 + int.from_bytes((ex / "ddp.safetensors").read_bytes()[:8], "little")
    out_start = 8 + int.from_bytes(out.read_bytes()[:8], "little")
    assert out_start % 4096 == src_start % 4096 and out_start % 8 == 0


def test_strip_legacy_format_converts_to_zip(ex: Path, tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "o.pt"
    res = cli(["ckpt", "strip", str(ex / "legacy_ddp.pt"), "-o", str(out)])
    assert res.returncode == 0, res.stderr
    assert "converted from the legacy format" in res.stdout
    assert zipfile.is_zipfile(out)
    MLP().load_state_dict(torch.load(out, weights_only=True)["net"], strict=True)


def test_diff_names_the_prefix_fix(ex: Path, cli: Any) -> None:
    res = cli(["ckpt", "diff", str(ex / "ddp.pt"), "--model", MODEL, "--json", "-"])
    assert res.returncode == 1, res.stderr
    rep = json.loads(res.stdout)
    assert rep["loads_as_is"] is False and len(rep["missing"]) == 9 and len(rep["unexpected"]) == 9
    assert rep["fix"]["strip_prefixes"] == ["module."] and rep["fix"]["loads_strict_after"] is True
    [finding] = rep["findings"]
    assert finding["check"] == "state_dict" and finding["status"] == rep["status"] == "fail"
    assert "loads with strict=True after: remove 'module.'" in finding["summary"]
    assert "ddpdoctor ckpt strip" in finding["remedy"]


def test_diff_passes_for_plain_checkpoint_and_reports_shape_mismatch(ex: Path, cli: Any) -> None:
    ok = cli(["ckpt", "diff", str(ex / "plain.pt"), "--model", MODEL])
    assert ok.returncode == 0, ok.stderr
    assert "PASS" in ok.stdout
    bad = cli(["ckpt", "diff", str(ex / "ddp.pt"), "--model", "examples.ckpt_models:make_wide_mlp"])
    assert bad.returncode == 1
    assert "fc2.weight: checkpoint [4, 8] vs model [4, 16]" in bad.stdout


@pytest.mark.parametrize(("factory", "expected"), [
    ("examples.ckpt_models:make_broken", "ValueError: num_classes must be set in the config"),
    ("examples.ckpt_models:make_not_a_model", "expected a torch.nn.Module"),
    ("examples.ckpt_models:nope", "has no attribute 'nope'"),
    ("no_such_module_xyz:build", "No module named 'no_such_module_xyz'"),
    ("just_a_name", "expected MODULE:FACTORY"),
])
def test_diff_bad_model_spec_is_one_line_exit_2(ex: Path, factory: str, expected: str,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.cli import main

    # In-process (cli.main, the console entry point) to avoid paying torch's import once per case.
    monkeypatch.chdir(REPO)
    assert main(["ckpt", "diff", str(ex / "plain.pt"), "--model", factory]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_diff_bad_model_spec_message(ex: Path) -> None:
    res = _cli(["ckpt", "diff", str(ex / "plain.pt"), "--model", "examples.ckpt_models:make_broken"])
    assert res.returncode == 2
    assert res.stderr.strip() == ("ddpdoctor: error: 'examples.ckpt_models:make_broken' raised ValueError: "
                                  "num_classes must be set in the config (at ckpt_models.py:38)")


def test_strip_prefix_api() -> None:
    import ddpdoctor

    sd = OrderedDict([("_orig_mod.module.a", torch.ones(1)), ("module._orig_mod.b", torch.zeros(1)),
                      ("c", torch.ones(2))])
    sd._metadata = OrderedDict([("", {"version": 1}), ("_orig_mod", {}), ("_orig_mod.module", {"v": 2})])  # type: ignore[attr-defined]
    out = ddpdoctor.strip_prefix(sd)
    assert list(out) == ["a", "b", "c"] and out["c"] is sd["c"]
    assert "module.a" not in out._metadata and out._metadata[""] == {"v": 2}
    assert list(ddpdoctor.strip_prefix({"net.x": 1, "y": 2}, ["net."])) == ["x", "y"]
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        ddpdoctor.strip_prefix({"module.a": torch.ones(1), "a": torch.ones(1)})


def test_load_checkpoint_into_fixes_prefixes_both_ways(ex: Path, tmp_path: Path) -> None:
    import ddpdoctor

    model = MLP()
    rep = ddpdoctor.load_checkpoint_into(model, ex / "ddp.pt")
    assert rep.location == "net" and rep.stripped_prefixes == ["module."] and rep.renamed_keys == 9
    assert rep.missing == [] and rep.unexpected == []
    saved = torch.load(ex / "ddp.pt", weights_only=True)["net"]
    assert torch.equal(model.fc1.weight, saved["module.fc1.weight"])

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = MLP()

    wrapped = Wrapper()
    rep = ddpdoctor.load_checkpoint_into(wrapped, ex / "plain.pt")
    assert rep.added_prefix == "module." and rep.location == "model_state_dict"
    with pytest.raises(DoctorError, match="strict=True"):
        ddpdoctor.load_checkpoint_into(MLP(width=16), ex / "ddp.pt")
    rep = ddpdoctor.load_checkpoint_into(MLP(), ex / "ddp_compiled.pt")
    assert rep.stripped_prefixes == ["module.", "_orig_mod."]
    for name in ("ddp.safetensors", "legacy_ddp.pt"):
        fresh = MLP()
        rep = ddpdoctor.load_checkpoint_into(fresh, ex / name)
        assert rep.stripped_prefixes == ["module."] and rep.loaded_keys == 9, name
        assert torch.equal(fresh.fc2.weight, saved["module.fc2.weight"]), name


def test_whole_pickled_model_needs_trust_and_is_explained(tmp_path: Path, cli: Any) -> None:
    path = tmp_path / "whole.pt"
    torch.save(make_mlp(), path)
    res = cli(["ckpt", "inspect", str(path)])
    assert res.returncode == 2 and "examples.ckpt_models.MLP" in res.stderr
    res = cli(["ckpt", "inspect", str(path), "--trust"])
    assert res.returncode == 0
    assert "pickles a whole object (examples.ckpt_models.MLP), not a state_dict" in res.stdout


@pytest.mark.parametrize(("key", "expected"), [
    ("nope", "no entry 'nope' in the checkpoint (its keys: epoch, net, optimizer, config)"),
    ("optimizer", "not a state_dict"),
    ("optimizer/state", "not a state_dict"),
    ("epoch/x", "is not a mapping"),
])
def test_strip_bad_key_is_exit_2(ex: Path, tmp_path: Path, cli: Any, key: str, expected: str) -> None:
    res = cli(["ckpt", "strip", str(ex / "ddp.pt"), "-o", str(tmp_path / "o.pt"), "--key", key])
    assert res.returncode == 2 and expected in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []


def test_diff_builds_the_model_on_meta_when_it_can(ex: Path, cli: Any) -> None:
    """Comparing shapes needs no weights: a huge model costs no memory; numpy-initialised ones still work."""
    model = build_model_for_shapes(MODEL)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    real = build_model_for_shapes("examples.ckpt_models:make_mlp_numpy_init")
    assert isinstance(real, MLP) and float(real.fc1.weight.detach()[0, 0]) == 0.5
    res = cli(["ckpt", "diff", str(ex / "plain.pt"), "--model", "examples.ckpt_models:make_mlp_numpy_init"])
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_factory_that_cannot_build_on_meta_is_imported_once(tmp_path: Path) -> None:
    """The retry outside meta calls the same factory: a module file's top level does not run twice."""
    imports = tmp_path / "imports.log"
    source = tmp_path / "needs_data.py"
    source.write_text(f"""
import torch
open({str(imports)!r}, "a").write("imported\\n")

def build():
    net = torch.nn.Linear(3, 2)
    net.weight.data.fill_(1.0)
    print(float(net.weight.detach().sum()))  # reading a value fails on meta
    return net
""")
    model = build_model_for_shapes(f"{source}:build")
    assert float(model.weight.detach()[0, 0]) == 1.0
    assert imports.read_text() == "imported\n"


def _adam_state(model: torch.nn.Module) -> dict[str, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return opt.state_dict()


def test_real_world_layouts_lightning_and_named_optimizer_state(tmp_path: Path, cli: Any) -> None:
    """Lightning nests `state_dict` with `model.` keys; FSDP/DCP optimizer states are keyed by name.

    A per-parameter optimizer entry ({"exp_avg": t, "exp_avg_sq": t, "step": t}) maps strings to tensors
    but is not a model state_dict: it must not be reported (or renamed) as one.
    """
    model = make_mlp()
    sd, osd = model.state_dict(), _adam_state(model)
    names = [n for n, _ in model.named_parameters()]
    light = tmp_path / "epoch=3.ckpt"
    torch.save({"epoch": 3, "global_step": 300, "pytorch-lightning_version": "2.4.0",
                "state_dict": {f"model.{k}": v for k, v in sd.items()},
                "callbacks": {"ModelCheckpoint{'monitor': 'val_loss'}": {"best_model_score": torch.tensor(0.5),
                                                                         "best_model_path": "x.ckpt"}},
                "optimizer_states": [osd], "hyper_parameters": {"lr": 1e-3}}, light)
    named = tmp_path / "named_optim.pt"
    torch.save({"model": {f"module.{k}": v for k, v in sd.items()},
                "optimizer": {"state": {f"module.{names[i]}": s for i, s in osd["state"].items()},
                              "param_groups": [dict(g, params=[f"module.{names[i]}" for i in g["params"]])
                                               for g in osd["param_groups"]]}}, named)
    rep = json.loads(cli(["ckpt", "inspect", str(light), "--json", "-"]).stdout)
    assert [s["location"] for s in rep["state_dicts"]] == ["state_dict"]
    res = cli(["ckpt", "diff", str(light), "--model", MODEL])
    assert res.returncode == 1 and "loads with strict=True after: remove 'model.'" in res.stdout
    rep = json.loads(cli(["ckpt", "inspect", str(named), "--json", "-"]).stdout)
    assert [s["location"] for s in rep["state_dicts"]] == ["model"]
    others = {e["key"]: e["summary"] for e in rep["other_entries"]}
    assert others["optimizer"].startswith("optimizer state: 6 parameter states, 1 param group(s)")
    out = tmp_path / "o.pt"
    rep = json.loads(cli(["ckpt", "strip", str(named), "-o", str(out), "--json", "-"]).stdout)
    assert [s["location"] for s in rep["state_dicts"]] == ["model"] and rep["renamed_keys"] == 9
    new = torch.load(out, weights_only=True)
    assert list(new["optimizer"]["state"]) == [f"module.{n}" for n in names]  # kept exactly
    MLP().load_state_dict(new["model"], strict=True)


def test_prefixes_are_reported_in_the_order_found() -> None:
    """Not in a set's order, which changes with PYTHONHASHSEED from run to run."""
    _, counts = plan_renames(["module._orig_mod.a", "_orig_mod.module.b"])
    assert list(counts) == ["module.", "_orig_mod."]


def _copy_zip_without(src: Path, dst: Path, drop: str, cut_to: int | None = None) -> Path:
    """``src`` re-zipped (stored, as torch writes) without the record ending in ``drop``, or with it cut to
    ``cut_to`` bytes: what a copy or an edit that loses a zip member leaves."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith(drop):
                if cut_to is None:
                    continue
                data = data[:cut_to]
            zout.writestr(info.filename, data)
    return dst


def test_a_lost_or_cut_storage_record_is_a_damaged_checkpoint(ex: Path, tmp_path: Path, cli: Any) -> None:
    """ddp.pt without its `ddp/data/0` record: `inspect` said nothing (exit 0) and `strip` reported "wrote ...:
    9 keys renamed" for a file that fails torch.load with "PytorchStreamReader failed locating file data/0"
    (an explorer's find). A record cut short loads wrong with mmap=True, silently. One line, exit 2."""
    lost = _copy_zip_without(ex / "ddp.pt", tmp_path / "lost.pt", "/data/0")
    with pytest.raises(RuntimeError, match="failed locating file data/0"):
        torch.load(lost, weights_only=True)
    cut = _copy_zip_without(ex / "ddp.pt", tmp_path / "cut.pt", "/data/0", cut_to=4)
    with pytest.raises(RuntimeError, match="does not match expected size"):
        torch.load(cut, weights_only=True)
    for src, expected in ((lost, "names the tensor storage data/0, which is not in the zip"),
                          (cut, "its tensor storage data/0 holds 4 bytes where data.pkl says 256")):
        for args in (["ckpt", "inspect", str(src)], ["ckpt", "strip", str(src), "-o", str(tmp_path / "out.pt")],
                     ["ckpt", "diff", str(src), "--model", MODEL]):
            res = cli(args)
            assert res.returncode == 2, (args, res.stdout)
            assert res.stderr.startswith(f"ddpdoctor: error: {src} is damaged: ") and expected in res.stderr
            assert res.stderr.count("\n") == 1 and res.stderr.rstrip().endswith("use another copy of the checkpoint")
        with pytest.raises(DoctorError, match="is damaged"):
            load_checkpoint_into(make_mlp(), src)
    assert not (tmp_path / "out.pt").exists()


def test_inspect_and_diff_name_the_state_dict_strip_can_rename(tmp_path: Path, cli: Any) -> None:
    """`{"net": {"module.w", "w"}, "ema": {"module.w"}}`: inspect suggested `ckpt strip FILE -o OUT` for ema,
    which fails on net's duplicate (an explorer's find). The command names --key ema, and it works."""
    import shlex

    t = torch.ones(2)
    src = tmp_path / "mixed2.pt"
    torch.save({"net": {"module.w": t, "w": t}, "ema": {"module.w": t}}, src)
    res = cli(["ckpt", "inspect", str(src)])
    assert res.returncode == 1
    fix = next(line for line in res.stdout.splitlines() if "fix: ddpdoctor ckpt strip" in line)
    command = fix.split("fix: ", 1)[1].split("   (or in Python")[0]
    assert command == f"ddpdoctor ckpt strip {src} -o {tmp_path / 'mixed2.stripped.pt'} --key ema"
    assert "load_checkpoint_into(model, " in fix and "key='ema'" in fix
    assert cli(shlex.split(command)[1:]).returncode == 0
    out = torch.load(tmp_path / "mixed2.stripped.pt", weights_only=True)
    assert list(out["ema"]) == ["w"] and list(out["net"]) == ["module.w", "w"]
    # diff compares the state_dict that fits (not the one holding every key twice) and names it too
    sd = make_mlp().state_dict()
    ddp = {f"module.{k}": v for k, v in sd.items()}
    src = tmp_path / "mixed3.pt"
    torch.save({"net": {**ddp, **sd}, "ema": ddp}, src)
    res = cli(["ckpt", "diff", str(src), "--model", MODEL])
    assert res.returncode == 1 and "ema does not load as is" in res.stdout, res.stdout
    fix = next(line for line in res.stdout.splitlines() if "fix: ddpdoctor ckpt strip" in line)
    command = fix.split("fix: ", 1)[1].split("   (or in Python")[0]
    assert command.endswith(" --prefix module. --key ema")
    assert cli(shlex.split(command)[1:]).returncode == 0
    make_mlp().load_state_dict(torch.load(tmp_path / "mixed3.stripped.pt", weights_only=True)["ema"])


@pytest.mark.parametrize("command", [["inspect", ""], ["strip", "", "-o", "x.pt"], ["diff", "", "--model", MODEL]])
def test_an_empty_checkpoint_path_is_named_as_such(command: list[str], cli: Any) -> None:
    """`ckpt inspect "$CKPT"` with CKPT unset said ". is a directory; give the checkpoint file inside it"
    (an explorer's find): Path("") is the current folder."""
    res = cli(["ckpt", *command])
    assert res.returncode == 2
    assert res.stderr == ("ddpdoctor: error: the checkpoint path is empty (an unset shell variable?); give a "
                          "checkpoint file or folder\n")
    assert not (REPO / "x.pt").exists()


@pytest.mark.parametrize("command", ["strip", "diff"])
def test_a_repeated_key_is_refused(ex: Path, tmp_path: Path, cli: Any, command: str) -> None:
    """`strip --key net --key epoch` kept only the last --key, silently (click's rule for a repeated option)."""
    more = ["-o", str(tmp_path / "out.pt")] if command == "strip" else ["--model", MODEL]
    res = cli(["ckpt", command, str(ex / "ddp.pt"), "--key", "net", "--key", "epoch", *more])
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("ddpdoctor: error: --key given 2 times ('net', 'epoch'): give it once")
    assert not (tmp_path / "out.pt").exists()
