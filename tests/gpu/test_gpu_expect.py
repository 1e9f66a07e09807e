"""On a real NVIDIA GPU: PCIe generation and width from NVML against the measured host-device bandwidth, the
device memory bandwidth against the GPU's datasheet figure, and the NVLink facts the model reads.

Nothing is faked. What is asserted holds on any healthy host: the checks measure, set each figure against
the expectation of the path NVML reports (NCCL's PCIe model, the datasheet), never call a healthy GPU a
failure, and stay within the pre-flight budget (<= 5 s). The measured figures are printed (run with -s, or
read the step's log) for the report: a Gen5 x16 link is expected at 48 GB/s, an H100 SXM's memory at 3.35
TB/s, an H200's at 4.8 TB/s.
"""

from __future__ import annotations

import json
import time

import pytest

from ddpdoctor.bench.expect import host_device_path, memory_spec, pcie_gbps
from ddpdoctor.checks import memory_bandwidth, pcie_bandwidth
from ddpdoctor.env.links import gpu_of, pcie_link
from ddpdoctor.findings import FAIL, PASS, WARN
from tests.checks.test_gpu import make_ctx
from tests.gpu.support import one_rank_env
from tests.support import run_cli

pytestmark = pytest.mark.requires_cuda


def test_real_pcie_facts_and_host_device_bandwidth() -> None:
    ctx = make_ctx(device="cuda:0", backend="nccl")
    start = time.monotonic()
    [finding] = pcie_bandwidth.CHECK.run(ctx)
    took = time.monotonic() - start
    gpu = gpu_of("cuda:0") or {}
    print(f"\nGPU {gpu.get('name')}: PCIe Gen{gpu.get('pcie_link_gen')} x{gpu.get('pcie_link_width')} now, "
          f"max Gen{gpu.get('pcie_link_gen_max')} x{gpu.get('pcie_link_width_max')}; sysfs "
          f"{pcie_link(str(gpu.get('pci_bus_id') or ''))}")
    print(f"pcie_bandwidth ({took:.2f} s): {finding.status}: {finding.summary}")
    assert took <= 5.0
    path = host_device_path(gpu)
    if gpu.get("pcie_link_gen_max") and gpu.get("pcie_link_width_max"):
        assert path.expected_gbps == pcie_gbps(int(gpu["pcie_link_gen_max"]), int(gpu["pcie_link_width_max"]))
        assert f"PCIe Gen{gpu['pcie_link_gen_max']} x{gpu['pcie_link_width_max']}" in finding.summary
        if (gpu["pcie_link_gen_max"], gpu["pcie_link_width_max"]) == (5, 16):
            assert path.expected_gbps == 48.0
    h2d, d2h = finding.details["h2d"], finding.details["d2h"]
    assert h2d["measured_busbw_gbps"] > 1 and d2h["measured_busbw_gbps"] > 1
    # A healthy link is not failed; a WARN must name what the facts show or say none was found.
    assert finding.status in (PASS, WARN, FAIL)
    if finding.status == FAIL:
        assert "bottleneck" in finding.summary or finding.remedy, finding


def test_real_device_memory_bandwidth_against_the_datasheet() -> None:
    ctx = make_ctx(device="cuda:0", backend="nccl")
    start = time.monotonic()
    [finding] = memory_bandwidth.CHECK.run(ctx)
    took = time.monotonic() - start
    print(f"\nmemory_bandwidth ({took:.2f} s): {finding.status}: {finding.summary}")
    assert took <= 5.0
    copy = finding.details["copy"]
    spec = memory_spec(finding.details["gpu"])
    if spec is not None:
        # Read + written bytes per second can approach the datasheet figure, never pass it by much: a larger
        # figure would mean the bytes or the time are miscounted.
        assert copy["measured_busbw_gbps"] <= spec[0] * 1.05, copy
        assert finding.status in (PASS, WARN), finding  # a healthy GPU's copy reaches well over half its spec
    else:
        assert "no expected figure" in finding.summary


def test_real_nvlink_facts_are_read() -> None:
    gpu = gpu_of("cuda:0") or {}
    print(f"\nNVLink: {gpu.get('nvlink_up')} of {gpu.get('nvlink_total')} links up; compute capability "
          f"{gpu.get('compute_capability')}")
    assert gpu.get("compute_capability") and len(gpu["compute_capability"]) == 2
    up, total = gpu.get("nvlink_up"), gpu.get("nvlink_total")
    assert (up is None and total is None) or (0 <= int(up) <= int(total))


def test_real_check_reports_both_figures() -> None:
    proc = run_cli(["check", "--only", "pcie_bandwidth,memory_bandwidth", "--json", "-"], timeout=180,
                   env=one_rank_env())
    report = json.loads(proc.stdout)
    found = {f["check"]: f for f in report["findings"]}
    print("\n" + "\n".join(f"{k}: {f['status']}: {f['summary']}" for k, f in found.items()))
    assert set(found) == {"pcie_bandwidth", "memory_bandwidth"}
    assert all(f["status"] in ("pass", "warn", "fail") for f in found.values())
    assert "expected" in found["pcie_bandwidth"]["summary"] or "no expected figure" in found["pcie_bandwidth"]["summary"]


def test_real_one_rank_nccl_bench_listens_to_nccl_without_printing_it() -> None:
    """bench sets NCCL_DEBUG=INFO into a private file (the user set none): NCCL's choice is in the JSON and
    none of its lines reach the user's stdout; one rank has no link, so no expectation is invented."""
    proc = run_cli(["bench", "--nproc", "1", "--backend", "nccl", "-b", "1M", "-e", "4M", "-n", "5", "-w", "1",
                    "--json", "-"], timeout=180, env=one_rank_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(proc.stdout)  # nothing but the JSON on stdout: NCCL's INFO lines went to the file
    print("\nNCCL said:", data["expectation"]["nccl"])
    assert "NCCL INFO" not in proc.stdout + proc.stderr
    assert set(data["expectation"]["nccl"]) == {"0"}
    assert data["per_op"]["all_reduce"]["expected"]["status"] == "none"
    assert "one rank" in data["per_op"]["all_reduce"]["expected"]["path"]["no_model"]
