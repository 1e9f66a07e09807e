"""`ckpt strip` outputs under the policy: what --in-place replaces, what a copy carries, what a kill leaves.

Real checkpoints (torch.save, safetensors, a DCP folder from a 2-rank gloo job), the real CLI, real
SIGKILL; ownership cases change a file's owner for real, so they need root (CI runs as root) and skip
otherwise.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from ddpdoctor.outputs import PARTIAL_SUFFIX, TORCH_FILE
from examples.ckpt_models import make_mlp
from tests.safety.conftest import OTHER_UID, snapshot
from tests.support import REPO, clean_env, run_cli

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")


def _ddp_ckpt(path: Path) -> Path:
    torch.save({"net": {f"module.{k}": v for k, v in make_mlp().state_dict().items()}}, path)
    return path


def _cli(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return run_cli(args, cwd=REPO, timeout=180, **kwargs)


def test_in_place_on_a_symlink_rewrites_the_checkpoint_it_points_to_and_keeps_the_link(tmp_path: Path) -> None:
    """`latest.pt -> step_900.pt`: before, the link became a regular file and step_900.pt stayed unstripped."""
    target = _ddp_ckpt(tmp_path / "step_900.pt")
    link = tmp_path / "latest.pt"
    link.symlink_to("step_900.pt")
    res = _cli(["ckpt", "strip", str(link), "--in-place"])
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and os.readlink(link) == "step_900.pt"
    assert next(iter(torch.load(target, weights_only=True)["net"])) == "fc1.weight"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt", "step_900.pt"]


def test_in_place_on_a_read_only_checkpoint_is_refused(tmp_path: Path) -> None:
    src = _ddp_ckpt(tmp_path / "ddp.pt")
    src.chmod(0o444)
    before = snapshot(tmp_path)
    res = _cli(["ckpt", "strip", str(src), "--in-place"])
    assert res.returncode == 2 and "read-only" in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert snapshot(tmp_path) == before


@needs_root
def test_in_place_as_root_keeps_the_users_owner_group_and_mode(tmp_path: Path) -> None:
    """The container-on-a-bind-mount case: root strips a user's 0640 file; it stays the user's."""
    src = _ddp_ckpt(tmp_path / "ddp.pt")
    os.chown(src, OTHER_UID, OTHER_UID)
    src.chmod(0o640)
    res = _cli(["ckpt", "strip", str(src), "--in-place"])
    assert res.returncode == 0, res.stderr
    st = src.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (OTHER_UID, OTHER_UID, 0o640)
    assert next(iter(torch.load(src, weights_only=True)["net"])) == "fc1.weight"


def test_a_new_output_follows_the_umask_and_is_never_more_open_than_its_input(tmp_path: Path) -> None:
    src = _ddp_ckpt(tmp_path / "ddp.pt")
    for input_mode, umask, expected in ((0o644, 0o022, 0o644), (0o644, 0o027, 0o640), (0o600, 0o002, 0o600),
                                        (0o664, 0o002, 0o664)):
        src.chmod(input_mode)
        out = tmp_path / f"out_{input_mode:o}_{umask:o}.pt"
        res = subprocess.run([sys.executable, "-m", "ddpdoctor", "ckpt", "strip", str(src), "-o", str(out)],
                             cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=180,
                             preexec_fn=lambda m=umask: os.umask(m))
        assert res.returncode == 0, res.stderr
        assert out.stat().st_mode & 0o777 == expected, (oct(input_mode), oct(umask), oct(out.stat().st_mode))


def test_strip_never_replaces_a_checkpoint_that_is_not_its_input(tmp_path: Path) -> None:
    src = _ddp_ckpt(tmp_path / "ddp.pt")
    other = _ddp_ckpt(tmp_path / "best.pt")
    before = snapshot(tmp_path)
    res = _cli(["ckpt", "strip", str(src), "-o", str(other)])
    assert res.returncode == 2 and "already exists" in res.stderr and "-o" in res.stderr, res.stderr
    assert snapshot(tmp_path) == before


def test_dcp_output_clashing_with_json_is_refused_before_any_work(dcp_dirs: Path, tmp_path: Path) -> None:
    """`ckpt strip dcp -o od --json od` wrote 200 MB into od/ and only then refused --json od."""
    before = snapshot(tmp_path)
    for args in (["-o", str(tmp_path / "od"), "--json", str(tmp_path / "od")],
                 ["-o", str(tmp_path / "od.json"), "--json", str(tmp_path / "od.json")],
                 ["-o", str(tmp_path / "x.safetensors")]):
        res = _cli(["ckpt", "strip", str(dcp_dirs / "dcp_ddp"), *args])
        assert res.returncode == 2 and res.stderr.count("\n") == 1, (args, res.stderr)
        after = snapshot(tmp_path)
        new = set(after) - set(before)
        # Nothing written but, for the second, the error document of the --json it had accepted.
        assert new <= {"od.json"}, new
        if new:
            assert json.loads((tmp_path / "od.json").read_text())["status"] == "error"
            (tmp_path / "od.json").unlink()
    # (the last one) the refusal names every one-file name the policy takes
    assert f"one torch.save file ({'/'.join(TORCH_FILE.extensions)}); not safetensors" in res.stderr


def test_a_shard_set_copy_carries_every_other_file_and_folder(shard_sets: Path, tmp_path: Path) -> None:
    """`tokenizer/` was dropped while "wrote st_out" was printed."""
    src = tmp_path / "st"
    shutil.copytree(shard_sets / "st", src)
    (src / "tokenizer").mkdir()
    (src / "tokenizer" / "tokenizer.json").write_text('{"model": "bpe"}\n')
    (src / "tokenizer" / "special").mkdir()
    (src / "tokenizer" / "special" / "map.txt").write_text("<s>\n")
    (src / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (src / "README.md").write_text("a model card\n")
    (src / "generation_config.json").symlink_to("config.json")  # a link is followed (an HF cache is all links)
    out = tmp_path / "st_out"
    res = _cli(["ckpt", "strip", str(src), "-o", str(out)])
    assert res.returncode == 0, res.stderr
    carried = ["README.md", ".gitattributes", "config.json", "generation_config.json", "tokenizer/tokenizer.json",
               "tokenizer/special/map.txt"]
    for name in carried:
        assert (out / name).read_bytes() == (src / name).read_bytes(), name
    assert not (out / "generation_config.json").is_symlink()
    got = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    want = {str(p.relative_to(src)) for p in src.rglob("*") if p.is_file()}
    assert got == want


def test_a_shard_set_with_what_strip_cannot_carry_is_refused_and_listed(shard_sets: Path, tmp_path: Path) -> None:
    src = tmp_path / "st"
    shutil.copytree(shard_sets / "st", src)
    os.mkfifo(src / "pipe")
    res = _cli(["ckpt", "strip", str(src), "-o", str(tmp_path / "o1")])
    assert res.returncode == 2 and "pipe (not a file or folder)" in res.stderr, res.stderr
    (src / "pipe").unlink()
    shutil.copy(shard_sets / "bin" / "pytorch_model.bin.index.json", src)
    for name in ("pytorch_model-00001-of-00003.bin",):
        shutil.copy(shard_sets / "bin" / name, src)
    res = _cli(["ckpt", "strip", str(src), "-o", str(tmp_path / "o2")])
    assert res.returncode == 2, res.stderr
    assert "pytorch_model-00001-of-00003.bin" in res.stderr and "pytorch_model.bin.index.json" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"]


def _kill_mid_write(src: Path, out: Path) -> bool:
    """Start a real `ckpt strip`, SIGKILL it once its partial output exists; False if it finished first."""
    proc = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "ckpt", "strip", str(src), "-o", str(out)],
                            cwd=REPO, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if any(p.name.endswith(PARTIAL_SUFFIX) for p in out.parent.iterdir()):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.0005)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    return proc.returncode == -signal.SIGKILL


def test_the_partial_file_of_a_killed_strip_is_removed_by_the_next_run(tmp_path: Path) -> None:
    """A SIGKILLed strip left a hidden 240 MB `*.ddpdoctor-partial` that no later run removed or named."""
    src, out = tmp_path / "in" / "big.pt", tmp_path / "out" / "big.pt"
    src.parent.mkdir()
    out.parent.mkdir()
    for size in (1 << 25, 1 << 27, 1 << 28):  # more data when the copy beat the kill on this machine
        out.unlink(missing_ok=True)
        torch.save({f"module.w{i}": torch.zeros(size // 4 // 4) for i in range(4)}, src)
        if _kill_mid_write(src, out):
            break
    else:
        pytest.fail("strip always finished before it could be killed")
    [partial] = [p for p in out.parent.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
    assert not out.exists() and partial.name.startswith(".big.pt.")
    res = _cli(["ckpt", "strip", str(src), "-o", str(tmp_path / "out" / "other.pt")])
    assert res.returncode == 0, res.stderr
    assert not partial.exists(), "the stale partial of the killed run is gone"
    assert f"removed {partial}" in res.stderr and "killed" in res.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["other.pt"]


def test_partials_that_may_still_be_written_or_are_not_ours_are_left(tmp_path: Path) -> None:
    """Removed only when provably ours and dead: our user's, our name pattern, pid gone, no lock held."""
    src = _ddp_ckpt(tmp_path / "ddp.pt")
    live = tmp_path / f".x.pt.{os.getpid()}-0123abcd{PARTIAL_SUFFIX}"  # this test process is alive
    live.write_bytes(b"half")
    dead_but_locked = tmp_path / f".y.pt.999999999-0123abcd{PARTIAL_SUFFIX}"  # pid gone, lock still held
    dead_but_locked.write_bytes(b"half")
    old_format = tmp_path / f".z.pt.k3j4h5{PARTIAL_SUFFIX}"  # an older ddpdoctor's name: no pid in it
    old_format.write_bytes(b"half")
    with open(dead_but_locked, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        res = _cli(["ckpt", "strip", str(src), "-o", str(tmp_path / "out.pt")])
    assert res.returncode == 0, res.stderr
    assert live.exists() and dead_but_locked.exists() and old_format.exists()
    assert f"{old_format}" in res.stderr and "older ddpdoctor run" in res.stderr
    # A writer that is alive and has not locked its fresh file yet (watch's ranks dump into one folder at once:
    # one rank's sweep met another's new file, and named it "a partial output of an older run that was killed").
    assert f"{live}" not in res.stderr
    # Unlocked, its pid alive but started after the file's last write: the pid went to another process, the
    # writer is dead (this test process stands for the process that got the pid).
    reused = tmp_path / f".v.pt.{os.getpid()}-0123abcd{PARTIAL_SUFFIX}"
    reused.write_bytes(b"half")
    an_hour_before = psutil.Process().create_time() - 3600
    os.utime(reused, (an_hour_before, an_hour_before))
    res = _cli(["ckpt", "strip", str(src), "-o", str(tmp_path / "out3.pt")])
    assert res.returncode == 0 and not reused.exists(), res.stderr
    assert f"removed {reused}" in res.stderr and live.exists() and f"{live}" not in res.stderr
    if os.geteuid() == 0:
        stale = tmp_path / f".w.pt.999999999-0123abcd{PARTIAL_SUFFIX}"
        stale.write_bytes(b"half")
        os.chown(stale, OTHER_UID, OTHER_UID)  # another user's: not ours to judge
        res = _cli(["ckpt", "strip", str(src), "-o", str(tmp_path / "out2.pt")])
        assert res.returncode == 0 and stale.exists(), res.stderr
