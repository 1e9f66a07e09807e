"""`ckpt inspect/strip/diff` on Hugging Face style shard sets written by safetensors and torch.save.

The layout (``model-0000N-of-0000M.safetensors`` + ``model.safetensors.index.json`` with ``metadata`` and
``weight_map``; ``pytorch_model-*.bin`` + ``pytorch_model.bin.index.json``) is what ``transformers``'
``save_pretrained`` writes; the example writes it with ``safetensors.torch.save_file`` and ``torch.save``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from examples.ckpt_models import make_stack
from tests.ckpt.conftest import tree_digest

STACK = "examples.ckpt_models:make_stack"


def _load_through_index(d: Path, index: str) -> dict[str, torch.Tensor]:
    """What transformers does: read the index, then every shard it names."""
    weight_map = json.loads((d / index).read_text())["weight_map"]
    sd: dict[str, torch.Tensor] = {}
    for name in sorted(set(weight_map.values())):
        part = load_file(d / name) if name.endswith(".safetensors") else torch.load(d / name, weights_only=True)
        sd.update(part)
    assert set(sd) == set(weight_map)
    return sd


def test_inspect_covers_every_shard(shard_sets: Path, cli: Any) -> None:
    res = cli(["ckpt", "inspect", str(shard_sets / "st"), "--json", "-"])
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["format"] == "sharded" and rep["tensor_count"] == 14
    lay = rep["layout"]
    assert lay["index"] == "model.safetensors.index.json"
    assert [s["file"] for s in lay["shards"]] == [f"model-0000{n}-of-00003.safetensors" for n in (1, 2, 3)]
    assert sum(s["keys"] for s in lay["shards"]) == 14
    assert lay["missing_shards"] == [] and lay["index_missing_tensors"] == []
    assert rep["state_dicts"][0]["prefixes"][0] == {"prefix": "module.", "keys": 14,
                                                    "examples": rep["state_dicts"][0]["prefixes"][0]["examples"]}


def test_bin_and_safetensors_shards_of_one_state_dict_count_the_same_bytes(shard_sets: Path, cli: Any) -> None:
    """Each torch.save shard numbers its storages from "0": counted by that key alone, the .bin set's tensors
    were a third of the bytes the safetensors copy of the same state_dict reported (an explorer's find)."""
    reports = {kind: json.loads(cli(["ckpt", "inspect", str(shard_sets / kind), "--json", "-"]).stdout)
               for kind in ("st", "bin")}
    expected = sum(t.numel() * t.element_size() for t in _load_through_index(shard_sets / "st",
                                                                             "model.safetensors.index.json").values())
    assert reports["bin"]["tensor_bytes"] == reports["st"]["tensor_bytes"] == expected
    assert reports["bin"]["state_dicts"][0]["tensor_bytes"] == expected


def test_strip_keeps_the_sharding_and_loads(shard_sets: Path, tmp_path: Path, cli: Any) -> None:
    src, out = shard_sets / "st", tmp_path / "plain"
    before = tree_digest(src)
    res = cli(["ckpt", "strip", str(src), "-o", str(out)])
    assert res.returncode == 0, res.stderr
    assert tree_digest(src) == before
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # same shards, index, config.json
    old_map = json.loads((src / "model.safetensors.index.json").read_text())
    new_map = json.loads((out / "model.safetensors.index.json").read_text())
    assert new_map["metadata"] == old_map["metadata"]
    assert new_map["weight_map"] == {k.removeprefix("module."): v for k, v in old_map["weight_map"].items()}
    sd = _load_through_index(out, "model.safetensors.index.json")
    make_stack().load_state_dict(sd, strict=True)
    old = _load_through_index(src, "model.safetensors.index.json")
    assert all(torch.equal(sd[k.removeprefix("module.")], v) for k, v in old.items())
    assert cli(["ckpt", "diff", str(out), "--model", STACK]).returncode == 0


def test_strip_torch_bin_shards_given_the_index_file(shard_sets: Path, tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "plain_bin"
    res = cli(["ckpt", "strip", str(shard_sets / "bin" / "pytorch_model.bin.index.json"), "-o", str(out)])
    assert res.returncode == 0, res.stderr
    make_stack().load_state_dict(_load_through_index(out, "pytorch_model.bin.index.json"), strict=True)


def test_shards_without_an_index(shard_sets: Path, tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "plain_noindex"
    assert cli(["ckpt", "strip", str(shard_sets / "noindex"), "-o", str(out)]).returncode == 0
    sd: dict[str, torch.Tensor] = {}
    for p in sorted(out.iterdir()):
        sd.update(load_file(p))
    make_stack().load_state_dict(sd, strict=True)


def test_diff_names_the_rename(shard_sets: Path, cli: Any) -> None:
    res = cli(["ckpt", "diff", str(shard_sets / "bin"), "--model", STACK, "--json", "-"])
    assert res.returncode == 1
    assert json.loads(res.stdout)["fix"]["strip_prefixes"] == ["module."]


def test_missing_shard_is_named_and_strip_refuses(shard_sets: Path, tmp_path: Path, cli: Any) -> None:
    d = tmp_path / "gap"
    shutil.copytree(shard_sets / "st", d)
    (d / "model-00002-of-00003.safetensors").unlink()
    res = cli(["ckpt", "inspect", str(d)])
    assert res.returncode == 1
    assert "FAIL  shard file(s) missing: model-00002-of-00003.safetensors" in res.stdout
    res = cli(["ckpt", "strip", str(d), "-o", str(tmp_path / "out")])
    assert res.returncode == 2 and "shard model-00002-of-00003.safetensors is missing" in res.stderr
    assert not (tmp_path / "out").exists()
    # without an index the -of-00003 names say a shard is missing too
    d2 = tmp_path / "gap_noindex"
    shutil.copytree(shard_sets / "noindex", d2)
    (d2 / "model-00003-of-00003.safetensors").unlink()
    res = cli(["ckpt", "inspect", str(d2)])
    assert res.returncode == 1 and "model-00003-of-00003.safetensors" in res.stdout


def test_an_unreadable_file_the_stripped_set_carries_is_named_not_blamed_on_the_output(shard_sets: Path,
                                                                                       tmp_path: Path) -> None:
    """config.json this user may not read (copied as root, mode 0600): strip failed half-way through the copy
    with "could not write OUT" (the fixing helper's find). One line, exit 2, naming the file; nothing written."""
    import subprocess
    import sys

    import pytest

    from tests.support import REPO, can_drop_root_read, without_root_read

    if not can_drop_root_read():
        pytest.skip("as root, needs setpriv (util-linux) to drop the capabilities that skip permission checks")
    d = tmp_path / "set"
    shutil.copytree(shard_sets / "st", d)
    (d / "config.json").chmod(0)
    try:
        res = subprocess.run(without_root_read([sys.executable, "-m", "ddpdoctor", "ckpt", "strip", str(d), "-o",
                                                str(tmp_path / "out")]), capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        assert res.returncode == 2, (res.stdout[-1000:], res.stderr[-1000:])
        assert res.stderr == f"ddpdoctor: error: cannot read {d / 'config.json'}: Permission denied\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]
    finally:
        (d / "config.json").chmod(0o644)


def test_index_entries_pointing_at_absent_tensors_and_extra_shards(shard_sets: Path, tmp_path: Path,
                                                                   cli: Any) -> None:
    d = tmp_path / "stale"
    shutil.copytree(shard_sets / "st", d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["module.layers.3.attn.weight"] = "model-00001-of-00003.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(d / "model-00001-of-00003.safetensors", d / "model-00004-of-00004.safetensors")
    res = cli(["ckpt", "inspect", str(d), "--json", "-"])
    assert res.returncode == 1
    lay = json.loads(res.stdout)["layout"]
    assert lay["index_missing_tensors"] == [{"key": "module.layers.3.attn.weight",
                                             "file": "model-00001-of-00003.safetensors"}]
    assert lay["extra_shards"] == ["model-00004-of-00004.safetensors"]
    text = cli(["ckpt", "inspect", str(d)]).stdout
    assert "1 index entry points at tensors the shard does not hold: module.layers.3.attn.weight" in text
    assert "WARN  shard file(s) not in the index: model-00004-of-00004.safetensors" in text


def test_corrupt_index_is_one_line_exit_2(shard_sets: Path, tmp_path: Path, cli: Any) -> None:
    d = tmp_path / "badindex"
    shutil.copytree(shard_sets / "st", d)
    (d / "model.safetensors.index.json").write_text('{"weight_map": ')
    res = cli(["ckpt", "inspect", str(d)])
    assert res.returncode == 2 and "not a valid shard index" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_deeply_nested_or_unreadable_index_is_one_line_exit_2(tmp_path: Path) -> None:
    """The index is user JSON: nesting past the recursion limit, or a folder we may not list, is bad input."""
    from tests.support import run_cli

    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text("[" * 100_000 + "]" * 100_000)
    done = run_cli(["ckpt", "inspect", str(folder / "model.safetensors.index.json")], timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0 and "shard index" in done.stderr


def test_strip_trust_of_legacy_bin_shards_writes_loadable_shards(tmp_path: Path) -> None:
    """`strip --trust` converts legacy (pre-1.6) .bin shards with torch.save: it needs the real objects.
    Before: the shards were opened as shadow graphs and torch.save pickled ddpdoctor's own records."""
    from ddpdoctor.cli import main

    src = tmp_path / "s"
    src.mkdir()
    names = [f"pytorch_model-0000{i}-of-00002.bin" for i in (1, 2)]
    for name, key in zip(names, ("module.a", "module.b"), strict=True):
        torch.save({key: torch.ones(2)}, src / name, _use_new_zipfile_serialization=False)
    (src / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 16}, "weight_map": {"module.a": names[0], "module.b": names[1]}}))
    assert main(["ckpt", "strip", str(src), "-o", str(tmp_path / "o"), "--trust"]) == 0
    assert list(torch.load(tmp_path / "o" / names[0], weights_only=True)) == ["a"]
    assert list(torch.load(tmp_path / "o" / names[1], weights_only=True)) == ["b"]


def test_diff_names_a_missing_shard_and_does_not_blame_the_architecture(shard_sets: Path, tmp_path: Path,
                                                                        cli: Any) -> None:
    """Shard 2 of 3 gone: `diff` said "(top level) does not match the model: 5 missing ... the checkpoint is
    for a different architecture" and never named the shard (an explorer's find). The shard is the cause,
    named with the keys it held; the keys left are judged as they are (here: the 'module.' prefix)."""
    d = tmp_path / "gap"
    shutil.copytree(shard_sets / "st", d)
    (d / "model-00002-of-00003.safetensors").unlink()
    res = cli(["ckpt", "diff", str(d), "--model", STACK])
    assert res.returncode == 1
    assert "different architecture" not in res.stdout, res.stdout
    assert ("FAIL  shard file(s) missing: model-00002-of-00003.safetensors; loading fails on the 5 key(s) the "
            "index places there: module.layers.1.attn.bias") in res.stdout
    assert "fix: download or copy the missing shard(s) again" in res.stdout
    assert "it loads with strict=True after: remove 'module.'" in res.stdout
    # strip refuses an incomplete set: its command is for once the shard is back
    assert f"fix: once the missing file(s) are back: ddpdoctor ckpt strip {d} -o" in res.stdout
    rep = json.loads(cli(["ckpt", "diff", str(d), "--model", STACK, "--json", "-"]).stdout)
    assert rep["status"] == "fail" and rep["loads_as_is"] is False and len(rep["unavailable_keys"]) == 5
    assert rep["fix"]["loads_strict_after"] is True and rep["checkpoint_keys"] == 14
    assert [f["details"].get("kind") for f in rep["findings"]] == ["missing_shards", None]
    # Once stripped, the keys fit: the missing shard is the only failure.
    plain = tmp_path / "plain"
    assert cli(["ckpt", "strip", str(shard_sets / "st"), "-o", str(plain)]).returncode == 0
    (plain / "model-00002-of-00003.safetensors").unlink()
    res = cli(["ckpt", "diff", str(plain), "--model", STACK])
    assert res.returncode == 1 and res.stdout.count("FAIL") == 1 and "FAIL  shard file(s) missing" in res.stdout
    assert "PASS  (top level): keys and shapes fit the model (14 keys;" in res.stdout
    # Without an index nothing says which keys the shard held: the model's keys found in no shard are put there.
    bare = tmp_path / "bare"
    shutil.copytree(plain, bare)
    (bare / "model.safetensors.index.json").unlink()
    res = cli(["ckpt", "diff", str(bare), "--model", STACK])
    assert res.returncode == 1 and "different architecture" not in res.stdout, res.stdout
    assert ("shard file(s) missing: model-00002-of-00003.safetensors; the model's 5 key(s) found in no shard "
            "present must be there") in res.stdout
