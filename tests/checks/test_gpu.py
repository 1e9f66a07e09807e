"""The `gpu` check: the real no-GPU skip on this machine, and the cross-rank judgement on plain facts.

The cross-rank logic (:func:`analyze`, called by ``_combine`` on rank 0) is a pure function of each
rank's facts. The GPU facts fed to it here come from ``collect_host_gpu_facts`` run against the NVML
TEST DOUBLE (``FakeNvml`` in ``test_gpu_nvml.py``) -- a stand-in for GPUs this machine does not have.
Tests that need a real GPU live in ``tests/gpu/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from ddpdoctor.check import CheckContext, CheckOptions
from ddpdoctor.env import collect_host_gpu_facts, gpu_facts
from ddpdoctor.env import facts as envinfo
from ddpdoctor.findings import ERROR, FAIL, PASS, SKIP, WARN, Finding, RankInfo, overall_status
from tests.env.test_nvml import FakeNvml, healthy_gpu
from tests.support import REPO, clean_env, free_port, run_cli

try:
    from ddpdoctor.checks import gpu as gpu_check
except ImportError:  # running from the source tree: ddpdoctor.checks is mapped from checks/ on install
    from checks import gpu as gpu_check  # type: ignore[no-redef]

HOSTS = {"node-a": 0, "node-b": 1}


def make_ctx(rank: int = 0, local_rank: int = 0, device: str = "cpu", backend: str = "gloo",
             world_size: int = 1) -> CheckContext:
    return CheckContext(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=world_size,
                        host="testhost", pid=os.getpid(), launcher="none", backend=backend, device=device,
                        master_addr="127.0.0.1", master_port=29500, process_group=None, store=None,
                        options=CheckOptions())


def host_gpus(host: str, n: int = 2, **overrides_by_index: dict[str, Any]) -> list[dict[str, Any]]:
    """NVML facts for one host's GPUs, produced through the NVML TEST DOUBLE (not real hardware)."""
    base = HOSTS[host] * 10
    specs = [healthy_gpu(base + i, **overrides_by_index.get(f"gpu{i}", {})) for i in range(n)]
    facts = collect_host_gpu_facts(FakeNvml(specs))
    assert facts["available"]
    return list(facts["gpus"])


def rank_facts(rank: int, host: str, local_rank: int, gpus: list[dict[str, Any]], *,
               device_index: int | None = None, visible: list[int] | None = None,
               local_world_size: int = 2, driver: str = "550.54.15", nccl: str = "2.21.5",
               with_p2p: bool = True) -> dict[str, Any]:
    """What gather_rank_facts returns on a GPU rank, built from TEST DOUBLE NVML data."""
    visible = visible if visible is not None else list(range(len(gpus)))
    index = local_rank if device_index is None else device_index
    mine = gpus[visible[index]]
    p2p = None
    if local_rank == 0 and with_p2p:
        n = len(visible)
        p2p = {"devices": [{"index": i, "uuid": gpus[v]["uuid"]} for i, v in enumerate(visible)],
               "matrix": [[None if i == j else True for j in range(n)] for i in range(n)]}
    return {
        "host": host, "local_rank": local_rank, "local_world_size": local_world_size, "pid": 1000 + rank,
        "device": f"cuda:{index}", "backend": "nccl",
        "cuda_visible_devices": ",".join(str(v) for v in visible) if visible != list(range(len(gpus))) else None,
        "nvml_available": True, "nvml_reason": "", "driver_version": driver, "cuda_driver_version": "12.4",
        "cuda_available": True, "skip_reason": "", "torch_cuda_version": "12.4", "nccl_version": nccl,
        "device_count": len(visible), "device_index": index, "current_device": index,
        "device_name": mine["name"], "uuid": mine["uuid"].removeprefix("GPU-"),  # PyTorch's spelling
        "pci_bus_id": None, "gpu": gpu_facts.match_nvml_gpu(gpus, mine["uuid"].removeprefix("GPU-"), None),
        "p2p": p2p,
    }


def infos(facts: dict[int, dict[str, Any]]) -> dict[int, RankInfo]:
    return {r: RankInfo(r, f["local_rank"], f["host"], f["pid"]) for r, f in facts.items()}


def combine(facts: dict[int, dict[str, Any]]) -> list[Finding]:
    """Through the real entry point: each rank's run() finding shape, then rank 0's combine."""
    per_rank = {r: [Finding("gpu", PASS, "gathered", [r], "", {"facts": f})] for r, f in facts.items()}
    return gpu_check.CHECK.combine(per_rank, infos(facts))  # type: ignore[misc]


def problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status not in (PASS, SKIP)]


def two_hosts(**kw: Any) -> dict[int, dict[str, Any]]:
    a, b = host_gpus("node-a"), host_gpus("node-b")
    return {0: rank_facts(0, "node-a", 0, a), 1: rank_facts(1, "node-a", 1, a),
            2: rank_facts(2, "node-b", 0, b, **kw), 3: rank_facts(3, "node-b", 1, b, **kw)}


# -- the real thing on this machine: no GPU -> skip with the reason ---------------------------------

def test_real_run_here_skips_with_reason() -> None:
    findings = gpu_check.CHECK.run(make_ctx())
    assert [f.status for f in findings] == [SKIP]
    summary = findings[0].summary
    assert "CPU-only build" in summary and "libnvidia-ml.so.1 not found" in summary
    assert findings[0].details["facts"]["cuda_available"] is False


def test_real_run_here_skips_even_when_told_to_use_cuda() -> None:
    """A runtime that hands out cuda:1 on a machine without CUDA still gets a skip, not a traceback."""
    findings = gpu_check.CHECK.run(make_ctx(rank=1, local_rank=1, device="cuda:1", backend="nccl"))
    assert [f.status for f in findings] == [SKIP]
    assert "torch.version.cuda is None" in findings[0].summary


def test_real_combine_of_skipping_ranks_is_one_skip_not_pass() -> None:
    per_rank = {r: gpu_check.CHECK.run(make_ctx(rank=r, local_rank=r, world_size=2)) for r in (0, 1)}
    ranks = {r: RankInfo(r, r, "testhost", os.getpid()) for r in (0, 1)}
    merged = gpu_check.CHECK.combine(per_rank, ranks)  # type: ignore[misc]
    assert len(merged) == 1
    assert merged[0].status == SKIP and merged[0].ranks == [0, 1]
    assert merged[0].summary.startswith("no GPU check: PyTorch")
    # The JSON a tool reads: details.nvml_available, not details.details.nvml_available.
    assert merged[0].details == {"kind": "no_gpu", "nvml_available": False}
    assert overall_status(merged) == PASS  # a skip never fails the run (check's report says SKIP, not PASS)


def test_real_run_in_fresh_process_prints_no_traceback_or_warning() -> None:
    """What a rank does: import the check cold and run it; stderr stays clean (no torch CUDA warning)."""
    code = (
        "import json, os\n"
        "from ddpdoctor.check import CheckContext, CheckOptions\n"
        "from ddpdoctor.checks import gpu\n"
        "ctx = CheckContext(rank=0, world_size=1, local_rank=0, local_world_size=1, host='h', pid=os.getpid(),"
        " launcher='none', backend='gloo', device='cpu', master_addr='127.0.0.1', master_port=1,"
        " process_group=None, store=None, options=CheckOptions())\n"
        "print(json.dumps([f.to_json() for f in gpu.CHECK.run(ctx)]))\n"
    )
    # Run outside the source tree so the installed (strict editable) ddpdoctor.checks is what imports.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=clean_env(), cwd=str(REPO.parent))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr
    (finding,) = json.loads(proc.stdout)
    assert finding["status"] == "skip" and "no GPU check" in finding["summary"]


@pytest.mark.slow
def test_real_cli_check_only_gpu_reports_skip_on_every_rank() -> None:
    """`ddpdoctor check --only gpu` self-launches 2 ranks here: one skip row with the reason, a SKIP result."""
    port = free_port()
    proc = run_cli(["check", "--only", "gpu", "--nproc", "2", "--master-port", str(port), "--timeout", "60"],
                   timeout=240)
    if "unknown check id 'gpu'" in proc.stderr:
        pytest.skip("the gpu check is not registered in checks/__init__.py yet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("gpu ")]
    assert len(rows) == 1, proc.stdout
    assert "skip" in rows[0] and "all (0-1)" in rows[0] and "CPU-only build" in rows[0]
    assert "pass" not in rows[0]
    # Nothing was checked: the run says so instead of passing (the exit code stays 0: nothing is wrong).
    assert proc.stdout.rstrip().splitlines()[-1].startswith("Result: SKIP: nothing was checked")


def test_no_cuda_reason_names_the_cause() -> None:
    assert gpu_facts.no_cuda_reason("2.13.0", "12.4", "", "", []).startswith("CUDA_VISIBLE_DEVICES='' hides")
    reason = gpu_facts.no_cuda_reason(
        "2.13.0", "12.4", None, "the NVIDIA kernel driver is not loaded",
        ["CUDA initialization: The NVIDIA driver on your system is too old (found version 11040).\nmore"])
    assert reason == ("torch.cuda.is_available() is False; CUDA initialization: The NVIDIA driver on your "
                      "system is too old (found version 11040).; the NVIDIA kernel driver is not loaded")


# -- cross-rank judgement over facts from the NVML TEST DOUBLE --------------------------------------

def test_healthy_job_passes_and_summarises_p2p() -> None:
    findings = combine(two_hosts())
    assert problems(findings) == []
    main = findings[0]
    assert main.status == PASS and main.ranks == [0, 1, 2, 3]
    assert "4 ranks on 4 distinct GPUs (NVIDIA A100-SXM4-80GB)" in main.summary
    assert "driver 550.54.15, CUDA 12.4, NCCL 2.21.5" in main.summary
    p2p = [f for f in findings if "peer-to-peer" in f.summary]
    assert [f.summary for f in p2p] == ["host node-a: all 2 GPUs can access each other peer-to-peer",
                                        "host node-b: all 2 GPUs can access each other peer-to-peer"]


def test_same_cuda_visible_devices_on_every_task_is_duplicate_gpu() -> None:
    """SLURM/launcher gives both tasks CUDA_VISIBLE_DEVICES=0: both ranks are on one GPU."""
    a = host_gpus("node-a")
    facts = {r: rank_facts(r, "node-a", r, a, device_index=0, visible=[0]) for r in (0, 1)}
    found = problems(combine(facts))
    assert [f.status for f in found] == [FAIL]
    dup = found[0]
    assert dup.ranks == [0, 1]
    assert dup.summary.startswith("ranks 0-1 share one GPU GPU-00000000-0000-0000-0000-000000000000")
    assert "rank 0 [node-a:0] (cuda:0), rank 1 [node-a:1] (cuda:0)" in dup.summary
    assert "Duplicate GPU detected" in dup.summary
    assert "torch.cuda.set_device(local_rank)" in dup.remedy
    assert dup.details["cuda_visible_devices"] == {0: "0", 1: "0"}


def test_forgot_set_device_is_duplicate_and_wrong_device() -> None:
    a = host_gpus("node-a")
    facts = {r: rank_facts(r, "node-a", r, a, device_index=0) for r in (0, 1)}
    found = problems(combine(facts))
    assert [(f.status, f.ranks) for f in found] == [(FAIL, [0, 1]), (FAIL, [1])]
    wrong = found[1]
    assert wrong.summary == ("rank 1 [node-a:1] uses cuda:0 but local rank 1 should use cuda:1 "
                             "(2 GPUs visible, CUDA_VISIBLE_DEVICES unset)")
    assert "torch.cuda.set_device(local_rank)" in wrong.remedy


def test_more_ranks_than_gpus_is_named() -> None:
    a = host_gpus("node-a")
    facts = {r: rank_facts(r, "node-a", r, a, device_index=r % 2, local_world_size=3) for r in (0, 1, 2)}
    found = problems(combine(facts))
    ordinal = [f for f in found if "invalid device ordinal" in f.summary]
    assert len(ordinal) == 1 and ordinal[0].ranks == [2]
    assert "local rank 2 but sees only 2 GPUs" in ordinal[0].summary
    assert any(f.ranks == [0, 2] and "share one GPU" in f.summary for f in found)


def test_mixed_driver_versions_across_hosts_warn_and_nccl_is_left_to_the_env_check() -> None:
    """A mixed NCCL is one fail row from the env check (test_env_check), not a second one from here."""
    found = problems(combine(two_hosts(driver="535.104.05", nccl="2.19.3")))
    by_field = {f.details["field"]: f for f in found}
    assert by_field["driver_version"].status == WARN
    assert "535.104.05 on ranks 2-3 (host node-b)" in by_field["driver_version"].summary
    assert set(by_field) == {"driver_version"}


def test_degraded_pcie_link_and_nvlink_are_named_on_that_gpu_only() -> None:
    a = host_gpus("node-a", gpu1={"pcie": (4, 4, 8, 16), "nvlinks": [1] * 10 + [0, 0]})
    b = host_gpus("node-b")
    facts = {0: rank_facts(0, "node-a", 0, a), 1: rank_facts(1, "node-a", 1, a),
             2: rank_facts(2, "node-b", 0, b), 3: rank_facts(3, "node-b", 1, b)}
    found = problems(combine(facts))
    assert {f.status for f in found} == {WARN}
    assert all(f.ranks == [1] for f in found)
    texts = " | ".join(f.summary for f in found)
    assert "[node-a:1] GPU GPU-00000000-0000-0000-0000-000000000001" in texts
    assert "only 10 of 12 NVLinks up" in texts
    assert "PCIe link trained at x8 of x16" in texts


def test_lower_pcie_gen_than_every_peer_warns_but_idle_peers_at_same_gen_do_not() -> None:
    idle_all = host_gpus("node-a", gpu0={"pcie": (1, 4, 16, 16)}, gpu1={"pcie": (1, 4, 16, 16)})
    assert problems(combine({r: rank_facts(r, "node-a", r, idle_all) for r in (0, 1)})) == []
    one_low = host_gpus("node-a", gpu1={"pcie": (3, 4, 16, 16)})
    found = problems(combine({r: rank_facts(r, "node-a", r, one_low) for r in (0, 1)}))
    assert len(found) == 1 and found[0].ranks == [1]
    assert "PCIe gen 3 where its peers run gen 4" in found[0].summary


def test_ecc_errors_retired_pages_row_remap_and_thermal_slowdown() -> None:
    a = host_gpus("node-a", gpu0={"ecc": {0: 2, 1: 2}, "retired_pages": {0: [], 1: [0x1]},
                                  "remapped_rows": (0, 1, 0, 1)},
                  gpu1={"ecc": {0: 0, 1: 5}, "reasons": 0x1 | 0x40, "clocks": (705, 1410)})
    found = problems(combine({r: rank_facts(r, "node-a", r, a) for r in (0, 1)}))
    summaries = {(f.status, f.ranks[0], f.summary.split(": ", 1)[1]) for f in found}
    assert (FAIL, 0, '2 uncorrectable ECC errors since the last driver reload ("CUDA error: '
                     'uncorrectable ECC error encountered")') in summaries
    assert (FAIL, 0, "row remapping failed: the memory cannot be repaired") in summaries
    assert (WARN, 0, "1 memory pages retired after ECC errors") in summaries
    assert (WARN, 1, "5 uncorrectable ECC errors over its lifetime") in summaries
    assert (WARN, 1, "clocks slowed down: hw_thermal_slowdown (SM 705 of 1410 MHz)") in summaries
    assert all("nvidia-smi" in f.remedy for f in found)


def test_other_process_on_a_rank_gpu_is_reported_but_the_rank_itself_is_not() -> None:
    # pid 1000 is rank 0 itself; pid 777 is a stale job holding 12 GiB on GPU 1.
    a = host_gpus("node-a", gpu0={"procs": [(1000, 2**30)]}, gpu1={"procs": [(1001, 2**30), (777, 12 * 2**30)]})
    found = problems(combine({r: rank_facts(r, "node-a", r, a) for r in (0, 1)}))
    assert len(found) == 1
    assert found[0].status == WARN and found[0].ranks == [1]
    assert found[0].summary.endswith("is also used by other processes: pid 777 (12.0 GiB)")


def test_some_ranks_without_gpu_fail_next_to_gpu_ranks() -> None:
    a = host_gpus("node-a")
    facts = {0: rank_facts(0, "node-a", 0, a), 1: rank_facts(1, "node-a", 1, a),
             2: {"host": "node-c", "local_rank": 0, "pid": 5, "cuda_available": False,
                 "skip_reason": "torch.cuda.is_available() is False; the NVIDIA kernel driver is not loaded"}}
    found = problems(combine(facts))
    assert len(found) == 1 and found[0].status == FAIL and found[0].ranks == [2]
    assert found[0].summary.startswith("rank 2 cannot use a GPU while ranks 0-1 can: [node-c:0] torch.cuda")


def test_partial_p2p_matrix_lists_the_missing_pairs() -> None:
    a = host_gpus("node-a", n=4)
    facts = {r: rank_facts(r, "node-a", r, a, local_world_size=4) for r in range(4)}
    matrix = facts[0]["p2p"]["matrix"]
    for i in range(4):
        for j in range(4):
            if i != j and (i < 2) != (j < 2):
                matrix[i][j] = False  # two PCIe islands: 0-1 and 2-3 (e.g. two CPU sockets)
    p2p = [f for f in combine(facts) if "peer-to-peer" in f.summary]
    assert len(p2p) == 1 and p2p[0].status == PASS
    assert p2p[0].summary.startswith("host node-a: 8 of 12 GPU pairs lack peer-to-peer access: 0->2, 0->3")
    assert [0, 2] in p2p[0].details["pairs_without_p2p"]


def test_combine_passes_runtime_errors_through() -> None:
    a = host_gpus("node-a")
    per_rank = {0: [Finding("gpu", PASS, "gathered", [0], "", {"facts": rank_facts(0, "node-a", 0, a)})],
                1: [Finding("gpu", ERROR, "check did not finish in 30 s", [1], "", {})]}
    merged = gpu_check.CHECK.combine(per_rank, {})  # type: ignore[misc]
    assert merged[0].status == ERROR and merged[0].ranks == [1]
    assert any(f.status == PASS and f.ranks == [0] for f in merged)


def test_uuid_and_bus_id_matching_across_pytorch_and_nvml_spellings() -> None:
    gpus = host_gpus("node-a")
    assert gpu_facts.match_nvml_gpu(gpus, "00000000-0000-0000-0000-000000000001", None) == gpus[1]
    assert gpu_facts.match_nvml_gpu(gpus, None, "0000:11:00.0") == gpus[1]
    assert gpu_facts.match_nvml_gpu(gpus, "ffffffff-0000-0000-0000-000000000000", "0000:99:00.0") is None
    assert gpu_facts.normalize_uuid("MIG-AbC") == "MIG-abc"


# -- hardware preflight: Xids, NUMA placement, NICs (pure judgement; sysfs from a labelled stand-in) ---

def _preflight_for(bus: str, log_name: str, uptime_s: float, job_started_s: float | None = None) -> dict[str, Any]:
    """Preflight facts whose Xid events are parsed from real kernel-log text (tests/data/kernel_logs), read
    as if the host had been up ``uptime_s`` seconds (its clock is the test's choice: the log's is fixed)."""
    from ddpdoctor.env import bus_key, parse_xid_events

    text = (REPO / "tests" / "data" / "kernel_logs" / log_name).read_text()
    boot_epoch = 1_700_000_000.0
    return {"bus_id": bus, "kernel_log_source": "dmesg", "kernel_log_reason": "", "uptime_s": uptime_s,
            "boot_epoch": boot_epoch, "job_started_s": job_started_s,
            "xid_events": [{"xid": e.xid, "bus": e.bus, "pid": e.pid, "process": e.process, "message": e.message,
                            "when": e.when, "at_s": e.since_boot_s(boot_epoch, boot_epoch + uptime_s)}
                           for e in parse_xid_events(text) if e.bus == bus_key(bus)],
            "gpu_numa_node": None, "cpu_affinity": [0, 1], "numa_cpus": {"0": [0, 1]}, "interfaces": [], "net": [],
            "ib": [],
            "nccl_socket_ifname": None, "nccl_ib_hca": None, "nccl_ib_disable": None}


def test_xid_79_in_the_kernel_log_fails_the_rank_on_that_gpu() -> None:
    facts = two_hosts()
    # Ten minutes after the Xid 79 at 7301 s since boot (on 0000:44:00); the Xid 94 (on 0000:9b:00) at 5120 s.
    facts[2]["preflight"] = _preflight_for("00000000:44:00.0", "mixed.log", uptime_s=7901.0)
    facts[3]["preflight"] = _preflight_for("00000000:9B:00.0", "mixed.log", uptime_s=7901.0)
    found = problems(combine(facts))
    xid79 = next(f for f in found if "Xid 79" in f.summary)
    assert xid79.status == FAIL and xid79.ranks == [2]
    assert "GPU has fallen off the bus" in xid79.summary and "1 time in the last hour, last 10 min ago" in xid79.summary
    assert "drain the node and reboot it" in xid79.remedy and "RMA" in xid79.remedy
    xid94 = next(f for f in found if "Xid 94" in f.summary)
    assert xid94.ranks == [3] and "Contained ECC error" in xid94.summary
    assert not any("Xid" in f.summary and 0 in f.ranks for f in found)


def test_clean_preflight_keeps_the_pass() -> None:
    facts = two_hosts()
    for f in facts.values():
        f["preflight"] = _preflight_for("00000000:01:00.0", "mixed.log", uptime_s=8000.0)  # no Xid on this bus
    merged = combine(facts)
    assert not problems(merged)
    assert any(f.status == PASS and "4 ranks on 4 distinct GPUs" in f.summary for f in merged)


def test_different_gpu_models_across_ranks_warn() -> None:
    facts = two_hosts()
    facts[2]["device_name"] = facts[3]["device_name"] = "NVIDIA H100 80GB HBM3"
    warn = next(f for f in problems(combine(facts)) if "different GPU models" in f.summary)
    assert warn.status == WARN and "NVIDIA H100 80GB HBM3 on ranks 2-3" in warn.summary


def _two_socket_sys(root: Any) -> Any:
    """A STAND-IN /sys of a 2-socket GPU server (layout as the kernel's sysfs ABI docs give it)."""
    for rel, text in (("class/net/eth0/device/numa_node", "0"), ("class/net/ib0/device/numa_node", "1"),
                      ("class/infiniband/mlx5_0/device/numa_node", "0"),
                      ("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE"),
                      ("class/infiniband/mlx5_1/device/numa_node", "1"),
                      ("class/infiniband/mlx5_1/ports/1/state", "1: DOWN"),
                      ("bus/pci/devices/0000:3b:00.0/numa_node", "1"),
                      ("devices/system/node/node0/cpulist", "0-1"), ("devices/system/node/node1/cpulist", "2-3")):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def test_preflight_on_a_two_socket_tree_names_numa_and_nic_problems(tmp_path: Any) -> None:
    root = _two_socket_sys(tmp_path / "sys")
    env = {"NCCL_SOCKET_IFNAME": "enp", "NCCL_IB_HCA": "=mlx5_1"}
    pre = gpu_facts.gather_preflight("00000000:3B:00.0", env, root=str(root), deadline_s=1.0)
    assert pre["gpu_numa_node"] == 1 and pre["ib"][1]["ports"] == {"1": "DOWN"}
    pre["cpu_affinity"] = [0, 1]  # as if bound to socket 0 (this machine's real affinity varies)
    pre["interfaces"] = ["eth0", "ib0"]  # the stand-in host's (addresses are not in sysfs: psutil reads this one's)
    found = {p[1].split(" ")[0]: p for p in gpu_check.preflight_problems(pre)}
    assert found["the"][0] == WARN and "NUMA node 0 but its GPU is on node 1" in found["the"][1]
    assert found["NCCL_SOCKET_IFNAME='enp'"][0] == FAIL and "eth0, ib0" in found["NCCL_SOCKET_IFNAME='enp'"][1]
    assert found["InfiniBand"][0] == FAIL and "mlx5_1:1 DOWN" in found["InfiniBand"][1]


def test_preflight_ib_on_the_wrong_socket_and_good_names(tmp_path: Any) -> None:
    root = _two_socket_sys(tmp_path / "sys")
    pre = gpu_facts.gather_preflight("00000000:3B:00.0", {"NCCL_SOCKET_IFNAME": "eth", "NCCL_IB_HCA": "mlx5_0"},
                                     root=str(root), deadline_s=1.0)
    pre["interfaces"] = ["eth0", "ib0"]
    pre["cpu_affinity"] = [2, 3]  # bound to the GPU's socket: no NUMA complaint
    texts = [p[1] for p in gpu_check.preflight_problems(pre)]
    assert texts == ["no active InfiniBand device on the GPU's NUMA node 1 (active HCAs are on node 0): "
                     "inter-node traffic crosses the socket link"]


def test_preflight_on_this_machine_reads_real_sys_and_kernel_log() -> None:
    pre = gpu_facts.gather_preflight(None, dict(os.environ), deadline_s=1.0)
    assert [d["name"] for d in pre["net"]] == sorted(os.listdir("/sys/class/net"))
    assert pre["interfaces"] == envinfo.usable_interfaces()  # the list the env check shows
    assert pre["kernel_log_source"] or pre["kernel_log_reason"]
    assert pre["xid_events"] == []  # no bus: nothing is attributed to a GPU


def test_nvlink_recoveries_warn_on_that_gpu() -> None:
    a = host_gpus("node-a", gpu1={"nvlink_errors": {(2, 1): 3}})  # 3 recoveries on link 2 of GPU 1
    facts = {0: rank_facts(0, "node-a", 0, a), 1: rank_facts(1, "node-a", 1, a)}
    warn = next(f for f in problems(combine(facts)) if "NVLink errors" in f.summary)
    assert warn.status == WARN and warn.ranks == [1] and "3 link recoveries" in warn.summary
