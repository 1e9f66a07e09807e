"""A rank tears its process group down before it leaves (issue 35): PyTorch's NCCL group prints "WARNING:
destroy_process_group() was not called before program exit" from its destructor otherwise.

Real gloo groups in this process (world size 1); the NCCL paths (an init that fails inside NCCL's eager
connect, a group a check broke) run in tests/gpu/test_gpu_check.py, which reads the ranks' stderr.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import torch.distributed as dist

from ddpdoctor.check import RankRun, RunConfig
from ddpdoctor.check.runner import abort_half_made_groups
from ddpdoctor.runtime.launcher import detect

ONE_RANK = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "teardown"}


def _run(tmp_path: Path, name: str) -> RankRun:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / name}", rank=0, world_size=1)
    run = RankRun(detect(ONE_RANK), RunConfig(checks=[], backend="gloo", show_waits=False))
    run.backend = "gloo"
    return run


def test_a_healthy_group_is_destroyed_and_a_broken_gloo_group_is_left_to_the_exit(tmp_path: Path) -> None:
    try:
        assert _run(tmp_path, "a").close() == "destroyed"
        assert not dist.is_initialized()
        broken = _run(tmp_path, "b")
        broken.pg_problem = "the connectivity check failed"
        # Gloo's shutdown can wait on a peer that already left; its destructor prints nothing and the rank
        # leaves through os._exit: nothing to do, and no time spent.
        assert broken.close() == "left" and dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert RankRun(detect(ONE_RANK), RunConfig(checks=[])).close() == "none"


def test_a_group_left_in_a_failed_inits_frames_is_aborted_and_freed() -> None:
    def half_made() -> None:  # what _new_process_group_helper holds when NCCL's eager connect raises
        backend = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))
        raise RuntimeError(f"connect failed: {type(backend).__name__}")

    try:
        half_made()
    except RuntimeError as exc:
        error = exc
    assert abort_half_made_groups(error) == ["ProcessGroupGloo"]
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    # Its frame no longer holds it: the destructor ran now, after the abort, not at some later exit.
    assert frames[-1].f_code.co_name == "half_made" and frames[-1].f_locals == {}
    assert abort_half_made_groups(RuntimeError("no frames")) == []
