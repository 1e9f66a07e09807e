"""Wrapper segments anywhere in a key: FSDP, activation checkpointing, torch.compile of one layer.

The checkpoints come from ``examples/ckpt_make.py`` (see its docstring): the torch.compile-wrapped layer and
the activation-checkpointing names are saved from real wrappers run on CPU; FSDP1 needs an accelerator here,
so its ``_fsdp_wrapped_module.`` segments are placed where FSDP puts them (Lightning-AI/litgpt#1613 shows
real keys of that shape: ``_fsdp_wrapped_module.transformer.h.16._fsdp_wrapped_module.
_checkpoint_wrapped_module.attn.proj.weight``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

import ddpdoctor
from ddpdoctor.ckpt import strip_file
from examples.ckpt_models import make_stack
from tests.ckpt.conftest import sha

STACK = "examples.ckpt_models:make_stack"


def _inspect(cli: Any, path: Path) -> dict[str, Any]:
    res = cli(["ckpt", "inspect", str(path), "--json", "-"])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def test_inspect_names_each_wrapper_segment_where_it_sits(ex: Path, cli: Any) -> None:
    rep = _inspect(cli, ex / "fsdp_ac.pt")
    (sd,) = rep["state_dicts"]
    wrappers = {w["segment"]: w for w in sd["wrappers"]}
    # _fsdp_wrapped_module.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.attn.weight
    assert wrappers["_fsdp_wrapped_module."]["keys"] == 14
    assert wrappers["_fsdp_wrapped_module."]["positions"] == [0, 3]
    assert wrappers["_fsdp_wrapped_module."]["inner_positions"] == [3]
    assert wrappers["_checkpoint_wrapped_module."]["keys"] == 12  # the head is not checkpointed
    assert wrappers["_checkpoint_wrapped_module."]["inner_positions"] == [4]
    summaries = [f["summary"] for f in rep["findings"]]
    assert any("'_fsdp_wrapped_module.' on 14 (segment 3), '_checkpoint_wrapped_module.' on 12 (segment 4)" in s
               and "activation checkpointing" in s for s in summaries), summaries
    assert rep["status"] == "warn"


def test_inspect_text_names_a_compiled_layer(ex: Path, cli: Any) -> None:
    res = cli(["ckpt", "inspect", str(ex / "compiled_layer.pt")])
    assert res.returncode == 0
    assert "'_orig_mod.' on 4 (segment 2)" in res.stdout
    assert "e.g. layers.1._orig_mod.attn.weight" in res.stdout and "torch.compile" in res.stdout


@pytest.mark.parametrize("name", ["fsdp_ac.pt", "ac_params.pt", "compiled_layer.pt", "fpw_legacy.pt"])
def test_strip_removes_wrappers_at_any_depth_and_the_result_loads(ex: Path, tmp_path: Path, cli: Any,
                                                                  name: str) -> None:
    src, out = ex / name, tmp_path / "plain.pt"
    before = sha(src)
    res = cli(["ckpt", "strip", str(src), "-o", str(out)])
    assert res.returncode == 0, res.stderr
    assert sha(src) == before
    loaded = torch.load(out, weights_only=True)
    sd = loaded.get("model", loaded)
    model = make_stack()
    model.load_state_dict(sd, strict=True)  # what the user wanted: the plain model loads it
    original = torch.load(src, weights_only=True)
    original = original.get("model", original)
    # Same tensors, same order: only the names changed.
    assert all(torch.equal(a, b) for a, b in zip(sd.values(), original.values(), strict=True))
    diff = cli(["ckpt", "diff", str(out), "--model", STACK])
    assert diff.returncode == 0 and "loads into the model with strict=True (14 keys)" in diff.stdout


def test_strip_only_the_named_wrapper(ex: Path, tmp_path: Path) -> None:
    out = tmp_path / "no_ac.pt"
    rep = strip_file(ex / "fsdp_ac.pt", out, prefixes=["_checkpoint_wrapped_module."])
    assert rep.renamed_keys == 12
    keys = list(torch.load(out, weights_only=True)["model"])
    assert "_fsdp_wrapped_module.layers.0._fsdp_wrapped_module.attn.weight" in keys
    assert not any("_checkpoint_wrapped_module" in k for k in keys)


def test_diff_names_every_wrapper_to_remove(ex: Path, cli: Any) -> None:
    res = cli(["ckpt", "diff", str(ex / "fsdp_ac.pt"), "--model", STACK, "--json", "-"])
    assert res.returncode == 1
    fix = json.loads(res.stdout)["fix"]
    assert fix["strip_prefixes"] == ["_fsdp_wrapped_module.", "_checkpoint_wrapped_module."]
    assert fix["loads_strict_after"] is True


def test_module_inside_a_key_is_kept_unless_it_starts_the_key() -> None:
    # `module` is a common attribute name (EMA wrappers keep `self.module`): only DDP's leading one goes.
    sd = OrderedDict([("module.ema.module.fc.weight", torch.ones(1)), ("module.layers.0._orig_mod.w", torch.ones(1))])
    assert list(ddpdoctor.strip_prefix(sd)) == ["ema.module.fc.weight", "layers.0.w"]


def test_collision_between_depths_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "both.pt"
    torch.save({"layers.0._checkpoint_wrapped_module.w": torch.ones(1), "layers.0.w": torch.zeros(1)}, src)
    with pytest.raises(ddpdoctor.errors.DoctorError, match=r"duplicate key 'layers\.0\.w'"):
        strip_file(src, tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


def test_metadata_module_paths_lose_inner_wrappers(ex: Path, tmp_path: Path) -> None:
    out = tmp_path / "plain.pt"
    strip_file(ex / "compiled_layer.pt", out)
    meta = torch.load(out, weights_only=True)["model"]._metadata
    assert "layers.1" in meta and not any("_orig_mod" in k for k in meta)


def test_module_inside_a_key_goes_only_when_named() -> None:
    """`module.` deep in a key is an EMA's or a user's attribute by default, a wrapper when the user says so."""
    import torch

    from ddpdoctor.ckpt import strip_prefix

    sd = {"module.encoder.module.weight": torch.zeros(1), "ema.module.bias": torch.zeros(1)}
    assert list(strip_prefix(sd)) == ["encoder.module.weight", "ema.module.bias"]
    assert list(strip_prefix(sd, ["module."])) == ["encoder.weight", "ema.bias"]
