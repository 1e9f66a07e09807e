"""`ddpdoctor bench` on NCCL on a real GPU: the sweep runs, results are verified, and timing uses CUDA events.

Needs one NVIDIA GPU (``requires_cuda``); nothing here is faked.
"""

from __future__ import annotations

import json

import pytest

from tests.support import PG_NOT_DESTROYED, clean_env, run_cli

pytestmark = pytest.mark.requires_cuda


def test_bench_nccl_one_rank_sweep_is_correct() -> None:
    res = run_cli(["bench", "--backend", "nccl", "--nproc", "1", "-b", "1M", "-e", "16M", "-f", "4", "-n", "5",
                   "-w", "2", "--json", "-"], env=clean_env({"CUDA_VISIBLE_DEVICES": "0"}), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert PG_NOT_DESTROYED not in res.stderr, res.stderr[-3000:]  # the rank destroyed its NCCL group
    doc = json.loads(res.stdout)
    assert doc["backend"] == "nccl"
    assert [r["bytes"] for r in doc["rows"]] == [1 << 20, 4 << 20, 16 << 20]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in doc["rows"])


def test_timing_waits_for_the_gpu_through_cuda_events() -> None:
    """A kernel that spins a known number of GPU cycles must be timed at least that long.

    Host timing without events would see only the microseconds of the asynchronous launch. The bound is
    physical, not a speed threshold: cycles / the GPU's maximum SM clock is the shortest the spin can take.
    """
    import torch

    from ddpdoctor.bench.ops import timed_loop
    from ddpdoctor.env import collect_host_gpu_facts

    cycles = 50_000_000
    facts = collect_host_gpu_facts()
    mhz = max(int(g.get("clocks_max_sm_mhz") or 0) for g in facts["gpus"])
    assert mhz > 0, facts
    device = torch.device("cuda", 0)
    per_call_us = timed_loop(lambda: torch.cuda._sleep(cycles), iters=3, warmup=1, device=device)
    shortest_us = cycles / mhz  # cycles / (MHz) = microseconds
    assert per_call_us >= 0.9 * shortest_us, (per_call_us, shortest_us)
