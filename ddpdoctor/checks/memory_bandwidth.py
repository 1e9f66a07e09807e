"""`memory_bandwidth`: a device-to-device copy against the GPU's memory bandwidth specification.

What fails in real life: a GPU whose memory runs slow: clocks held down (power or thermal capping, an
application-clock setting left by a benchmark: ``nvidia-smi -q -d CLOCK``), HBM with row remapping
pending, or another process (a leftover job, a monitoring agent) using the GPU at the same time. Training
is uniformly slower on that rank, and every collective waits for it. Reproduce by hand: time
``dst.copy_(src)`` for two 1 GiB CUDA tensors with CUDA events; bandwidth = 2 x size / time (read and
write, as STREAM's Copy counts it).

The expectation is the datasheet figure for the GPU's name (:data:`ddpdoctor.bench.expect.MEMORY_SPECS`: H100
SXM 3.35 TB/s, H200 4.8 TB/s, A100 80GB 2.04 TB/s, ...); a copy kernel reaches a large fraction of it, not
all. Below ``--min-busbw-pct`` (50) of it FAILs, below ``--warn-busbw-pct`` (80) WARNs, naming other
processes on the GPU and clock throttling reasons (NVML). A low figure while other processes or other ranks
of the job used the GPU only WARNs, folded under the finding that names them (the GPU may be fine). A GPU not
in the table: the figure with "no model". About 0.1 s per rank. Without a GPU on the rank: ``skip``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddpdoctor.bench import Evidence, LinkPath, Thresholds, fmt_pct, judge, memory_spec, remedy
from ddpdoctor.check import Check, CheckContext
from ddpdoctor.checks.pcie_bandwidth import (
    SHARED_NOTE,
    merge,
    no_gpu,
    rank_context,
    shared_outcome,
    sharing_evidence,
    worst,
)
from ddpdoctor.findings import PASS, Finding, RankInfo

# Throttle reasons (NVML clocks-event reasons) that hold memory clocks down; idle and app-clock settings are
# not faults by themselves.
_SLOWING = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")


def _run(ctx: CheckContext) -> list[Finding]:
    if not ctx.device.startswith("cuda"):
        return no_gpu(ctx, "device memory bandwidth")
    import torch

    from ddpdoctor.bench import device_memory

    figures = device_memory(torch.device(ctx.device))
    where = rank_context(ctx)
    gpu, others = where.gpu, where.others
    name = str(gpu.get("name") or torch.cuda.get_device_name(torch.device(ctx.device)))
    spec = memory_spec(name)
    path = (LinkPath("memory", f"{name} device memory", spec[0], spec[1]) if spec else
            LinkPath("memory", f"{name} device memory", why=f"{name} is not in the table of datasheet figures"))
    evidence: list[Evidence] = []
    if others:
        evidence.append(Evidence("crowded", f"other processes use this GPU: pid {', '.join(map(str, others))} (NVML)"))
    evidence += sharing_evidence(where)
    slowing = [r for r in gpu.get("throttle_reasons") or [] if any(s in str(r).lower() for s in _SLOWING)]
    if slowing:
        evidence.append(Evidence("clocks", f"clocks held down: {', '.join(map(str, slowing))} (NVML clocks-event "
                                 "reasons)"))
    verdict = judge(figures["copy_gbps"], path, evidence, Thresholds(ctx.options.min_busbw_pct,
                                                                    ctx.options.warn_busbw_pct))
    status, kind = shared_outcome(worst([verdict]), where)
    if spec is None:
        text = f"device-to-device copy {figures['copy_gbps']:.0f} GB/s; no expected figure: {path.why}"
    else:
        text = (f"device-to-device copy {figures['copy_gbps']:.0f} GB/s is {fmt_pct(verdict.pct)} % of the "
                f"{spec[0]:g} GB/s {name} datasheet figure (read + written bytes, {int(figures['bytes']) >> 20} MiB)")
        if status != PASS:
            text += f"; bottleneck: {verdict.cause()}" if verdict.cause() else "; no cause found in NVML's facts"
        text += SHARED_NOTE if kind else ""
    fix = (remedy(verdict.causes()) if verdict.causes() else
           "check the GPU's clocks and throttling (nvidia-smi -q -d CLOCK,PERFORMANCE), pending row remaps "
           "(ddpdoctor check --only gpu) and what else runs on it (nvidia-smi)") if status != PASS else ""
    return [ctx.finding(status, text, fix, copy=verdict.to_json(), bytes=figures["bytes"], gpu=name, **kind)]


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    return merge(findings_by_rank, lambda f: [float(f.details["copy"]["measured_busbw_gbps"])])


CHECK = Check(id="memory_bandwidth", title="GPU memory bandwidth against its datasheet figure", run=_run,
              combine=_combine)
