"""`pcie_bandwidth` and `memory_bandwidth` where no GPU exists: the skip is real (this machine's CPU ranks);
the judgement is checked on MOCK NVML facts (what nvmlDeviceGetCurr/MaxPcieLink* and the device name report),
since the measurements themselves run only on a GPU (tests/gpu/test_gpu_expect.py)."""

from __future__ import annotations

from ddpdoctor.bench.expect import Thresholds, host_device_evidence, host_device_path, judge, memory_spec
from ddpdoctor.checks import memory_bandwidth, pcie_bandwidth
from ddpdoctor.findings import PASS, SKIP, Finding
from tests.checks.test_gpu import make_ctx

H100 = {"name": "NVIDIA H100 80GB HBM3", "pcie_link_gen": 5, "pcie_link_gen_max": 5, "pcie_link_width": 16,
        "pcie_link_width_max": 16, "numa_node": 0}  # MOCK of NVML's answers for an H100 SXM


def test_cpu_ranks_skip_with_the_reason_never_pass() -> None:
    for check, what in ((pcie_bandwidth, "host-device bandwidth"), (memory_bandwidth, "device memory bandwidth")):
        [finding] = check.CHECK.run(make_ctx(device="cpu"))
        assert finding.status == SKIP
        assert finding.summary.startswith(f"this rank runs on cpu, not a GPU: {what} is measured only")


def test_mock_gen5_x16_expects_48_and_names_a_link_trained_lower() -> None:
    path = host_device_path(H100)
    assert path.expected_gbps == 48.0 and path.description == "PCIe Gen5 x16 of NVIDIA H100 80GB HBM3"
    assert host_device_path({**H100, "pcie_link_gen_max": 4}).expected_gbps == 24.0
    good = judge(52.4, path, host_device_evidence(H100), Thresholds())
    assert good.status == "pass" and round(good.pct or 0) == 109
    assert pcie_bandwidth.summary(good, good).startswith(
        "host-to-device 52.4 GB/s (109 %), device-to-host 52.4 GB/s (109 %) of the 48 GB/s expected on PCIe Gen5 x16")
    down = {**H100, "pcie_link_gen": 3, "pcie_link_width": 8}
    evidence = host_device_evidence(down, cpu_nodes=[1], others=[4242])
    slow = judge(5.6, path, evidence, Thresholds())
    assert slow.status == "fail" and [e.cause for e in evidence] == ["pcie_downtrained", "numa", "crowded"]
    text = pcie_bandwidth.summary(slow, slow)
    assert "bottleneck: the link trained at Gen3 x8 during the copies; GPU and slot support Gen5 x16" in text
    assert "measured 93 % of that" in text  # Gen3 x8 = 6 GB/s: the down-trained link explains the figure


def test_memory_specs_by_nvml_name() -> None:
    assert memory_spec("NVIDIA H100 80GB HBM3") == (3350.0, "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM 3.35 TB/s")
    assert memory_spec("NVIDIA H200")[0] == 4800.0  # type: ignore[index]
    assert memory_spec("NVIDIA H100 PCIe")[0] == 2000.0  # type: ignore[index]
    assert memory_spec("NVIDIA A100-SXM4-40GB")[0] == 1555.0  # type: ignore[index]
    assert memory_spec("NVIDIA GH200 480GB") is None  # not an H200: no model rather than a wrong one


def test_ranks_with_the_same_outcome_are_one_finding() -> None:
    def finding(rank: int, h2d: float) -> Finding:
        return Finding("pcie_bandwidth", PASS, f"host-to-device {h2d} GB/s", [rank], "",
                       {"h2d": {"measured_busbw_gbps": h2d}, "d2h": {"measured_busbw_gbps": h2d}})
    [merged] = pcie_bandwidth._combine({0: [finding(0, 52.0)], 1: [finding(1, 50.0)]}, {})
    assert merged.ranks == [0, 1] and merged.summary.startswith("host-to-device 50.0 GB/s [lowest of ranks 0-1")
    assert set(merged.details["per_rank"]) == {"0", "1"}


def test_a_low_figure_on_a_shared_gpu_warns_and_says_who_shared_it() -> None:
    from ddpdoctor.checks.pcie_bandwidth import RankGpu, shared_outcome, sharing_evidence

    alone = RankGpu(H100, [0], [], [])
    assert shared_outcome("fail", alone) == ("fail", {})  # nobody else there: the GPU's own figure
    assert shared_outcome("fail", RankGpu(H100, [0], [4242], [])) == ("warn", {"kind": "other_processes"})
    two = RankGpu(H100, [0], [4242], [1])
    assert shared_outcome("warn", two) == ("warn", {"kind": "shared_gpu"})  # the job's own ranks come first
    assert shared_outcome("pass", two) == ("pass", {})  # a good figure stays a pass whoever was there
    [evidence] = sharing_evidence(two)
    assert evidence.cause == "crowded" and evidence.text == "rank 1 of this job also uses this GPU (NVML)"
    assert sharing_evidence(RankGpu(H100, [0], [], [1, 2]))[0].text == "ranks 1-2 of this job also use this GPU (NVML)"


def test_ranks_that_shared_their_gpu_stay_one_foldable_finding() -> None:
    def finding(rank: int, gbps: float) -> Finding:
        return Finding("memory_bandwidth", "warn", f"device-to-device copy {gbps} GB/s", [rank], "own GPU",
                       {"copy": {"measured_busbw_gbps": gbps}, "kind": "shared_gpu"})
    [merged] = memory_bandwidth._combine({0: [finding(0, 1500.0)], 1: [finding(1, 1400.0)]}, {})
    assert merged.ranks == [0, 1] and merged.kind == "shared_gpu"  # the causal rule still finds it
    assert merged.summary.startswith("device-to-device copy 1400.0 GB/s [lowest of ranks 0-1")
