"""`pcie_bandwidth`: host-to-device and device-to-host copies from pinned memory against the GPU's PCIe link.

What fails in real life: a GPU whose PCIe link trained at a lower generation or width than card and slot
support (a riser or a dirty connector: ``nvidia-smi -q -d PCIE`` shows "Link Width Current x8, Max x16"),
BIOS settings that cap the slot at Gen3, a rank bound to the far NUMA node of its GPU, or another process
streaming over the same link. DCGM's ``dcgmi diag -r pcie`` measures the same. Nothing errors: data loading,
checkpoint saves and offloading are just 2-4x slower. Reproduce by hand: in ``python``, time
``gpu.copy_(pinned_host_tensor, non_blocking=True)`` for a 256 MiB tensor with CUDA events; a Gen5 x16 link
gives ~50 GB/s, Gen4 x16 ~25.

The expectation is NCCL's model of the link at the generation and width GPU and slot support (NVML's max;
Gen5 x16 48 GB/s, Gen4 x16 24 GB/s: :func:`ddpdoctor.bench.expect.host_device_path`); below
``--min-busbw-pct`` (50) of it FAILs, below ``--warn-busbw-pct`` (80) WARNs, naming a link trained below its
maximum (read from NVML right after the copies, since an idle GPU lowers its link generation to save power),
a NUMA mismatch or other processes on the GPU. A low figure while other processes or other ranks of the job
used the GPU only WARNs, folded under the finding that names them. About 0.2 s per rank. Without a GPU on the
rank: ``skip``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ddpdoctor.bench import (
    Evidence,
    Thresholds,
    Verdict,
    fmt_pct,
    host_device_evidence,
    host_device_path,
    judge,
    remedy,
)
from ddpdoctor.check import Check, CheckContext, all_findings, collapse
from ddpdoctor.findings import FAIL, PASS, SKIP, WARN, Finding, RankInfo
from ddpdoctor.ranks import format_rank_list

NO_GPU = ("this rank runs on {device}, not a GPU: host-device bandwidth is measured only on a rank with a GPU "
          "(run where CUDA is available, or with --backend nccl)")
_LEVEL = {"fail": FAIL, "warn": WARN}


def no_gpu(ctx: CheckContext, what: str) -> list[Finding]:
    """The skip of a GPU-only measurement on a rank without a GPU (never a pass: nothing was measured)."""
    return [ctx.finding(SKIP, NO_GPU.format(device=ctx.device).replace("host-device bandwidth", what), kind="no_gpu")]


class RankGpu(NamedTuple):
    """What NVML and sysfs say about a rank's GPU right after a measurement on it."""

    gpu: dict[str, Any]
    cpu_nodes: list[int]  # the NUMA nodes of the rank's CPUs
    others: list[int]  # pids of processes on the GPU that are not ranks of this job
    sharing: list[int]  # other ranks of this job with a context on the same GPU (two ranks, one GPU)


def rank_context(ctx: CheckContext) -> RankGpu:
    """This rank's GPU (NVML, read now), its CPUs' NUMA nodes, other processes' pids on the GPU, and the
    ranks of this job that share it."""
    from ddpdoctor.env import cpu_numa_nodes, gpu_of, pcie_link

    gpu = dict(gpu_of(ctx.device) or {})
    if gpu.get("pci_bus_id"):
        gpu["numa_node"] = pcie_link(str(gpu["pci_bus_id"]))["numa_node"]
    neighbours = {p.pid: p.rank for p in ctx.peers.values() if p.host == ctx.host and p.rank != ctx.rank}
    ours = set(neighbours) | {os.getpid()}
    on_gpu = {int(p.get("pid", -1)) for p in gpu.get("processes") or []}
    return RankGpu(gpu, cpu_numa_nodes(os.sched_getaffinity(0)), sorted(on_gpu - ours),
                   sorted(neighbours[pid] for pid in on_gpu & set(neighbours)))


# The ``details["kind"]`` of a low figure measured while the GPU was not the rank's alone: the figure says
# what the rank got, not what the GPU can do, so it warns (never fails) and is folded under the finding that
# names the sharing (check/causes.py: the gpu check's other processes, or two ranks on one GPU).
SHARED_WITH_OTHERS = "other_processes"
SHARED_WITH_RANKS = "shared_gpu"
MEASURED_KINDS = (SHARED_WITH_OTHERS, SHARED_WITH_RANKS)


def sharing_evidence(where: RankGpu) -> list[Evidence]:
    """The ranks of this job on the same GPU, as a bottleneck of a measurement on it."""
    if not where.sharing:
        return []
    return [Evidence("crowded", f"rank{'s' if len(where.sharing) > 1 else ''} "
                     f"{format_rank_list(where.sharing)} of this job also use{'' if len(where.sharing) > 1 else 's'} "
                     "this GPU (NVML)")]


def shared_outcome(status: str, where: RankGpu) -> tuple[str, dict[str, str]]:
    """A FAIL or WARN measured on a GPU that others used at the time: WARN, with the kind that folds it.

    A leftover job or a second rank on the GPU halves a copy's bandwidth; failing the GPU for it would send
    the user to the hardware when the fix is to stop the other process or give each rank its own GPU.
    """
    if status not in (FAIL, WARN) or not (where.others or where.sharing):
        return status, {}
    return WARN, {"kind": SHARED_WITH_RANKS if where.sharing else SHARED_WITH_OTHERS}


SHARED_NOTE = " (measured while the GPU was shared: what this rank got, not what the GPU can do)"


def worst(verdicts: list[Verdict]) -> str:
    """The check status of the worst verdict: fail, warn, else pass (no model is a measured figure too)."""
    statuses = {v.status for v in verdicts}
    return FAIL if "fail" in statuses else WARN if "warn" in statuses else PASS


def _run(ctx: CheckContext) -> list[Finding]:
    if not ctx.device.startswith("cuda"):
        return no_gpu(ctx, "host-device bandwidth")
    import torch

    from ddpdoctor.bench import host_device

    figures = host_device(torch.device(ctx.device))
    where = rank_context(ctx)  # right after the copies: the link as trained under load
    path = host_device_path(where.gpu)
    evidence = host_device_evidence(where.gpu, where.cpu_nodes, where.others) + sharing_evidence(where)
    thresholds = Thresholds(ctx.options.min_busbw_pct, ctx.options.warn_busbw_pct)
    h2d = judge(figures["h2d_gbps"], path, evidence, thresholds)
    d2h = judge(figures["d2h_gbps"], path, evidence, thresholds)
    status, kind = shared_outcome(worst([h2d, d2h]), where)
    details = {"h2d": h2d.to_json(), "d2h": d2h.to_json(), "bytes": figures["bytes"], "gpu": where.gpu.get("name"),
               "pcie": {k: where.gpu.get(k) for k in ("pcie_link_gen", "pcie_link_gen_max", "pcie_link_width",
                                                      "pcie_link_width_max")}, **kind}
    text = summary(h2d, d2h) + (SHARED_NOTE if kind else "")
    return [ctx.finding(status, text, remedy(h2d.causes() or d2h.causes()) if status != PASS else "", **details)]


def summary(h2d: Verdict, d2h: Verdict) -> str:
    """'host-to-device 52.1 GB/s (109 %), device-to-host 51.3 GB/s (107 %) of the 48 GB/s expected on PCIe ...'."""
    if h2d.path.expected_gbps is None:
        return (f"host-to-device {h2d.measured_gbps:.1f} GB/s, device-to-host {d2h.measured_gbps:.1f} GB/s (pinned); "
                f"no expected figure: {h2d.path.why}")
    text = (f"host-to-device {h2d.measured_gbps:.1f} GB/s ({fmt_pct(h2d.pct)} %), device-to-host "
            f"{d2h.measured_gbps:.1f} GB/s ({fmt_pct(d2h.pct)} %) of the {h2d.path.expected_gbps:g} GB/s expected "
            f"on {h2d.path.description} (pinned memory)")
    cause = (h2d if h2d.status in ("fail", "warn") else d2h).cause()
    return text + (f"; bottleneck: {cause}" if cause and worst([h2d, d2h]) != PASS else "")


def merge(findings_by_rank: Mapping[int, list[Finding]], figures: Callable[[Finding], list[float]],
          unit: str = "GB/s") -> list[Finding]:
    """One finding per outcome across ranks: the same status and path on many GPUs is one line with the
    range of each figure (every rank's numbers stay in ``details.per_rank``)."""
    findings = all_findings(findings_by_rank)
    measured = [f for f in findings if f.status in (PASS, WARN, FAIL) and f.details.get("kind") in (None, *MEASURED_KINDS)]
    rest = [f for f in findings if f not in measured]
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in measured:
        groups.setdefault((f.status, str(f.details.get("path_key", "")), f.kind), []).append(f)
    out: list[Finding] = []
    for (status, _, kind), group in groups.items():
        if len(group) == 1:
            out.append(group[0])
            continue
        ranks = sorted(r for f in group for r in f.ranks)
        lows = [min(vals) for vals in zip(*(figures(f) for f in group), strict=True)]
        first = min(group, key=lambda f: figures(f))
        out.append(Finding(first.check, status, f"{first.summary} [lowest of ranks {format_rank_list(ranks)}; "
                           f"ranges in details]", ranks, first.remedy,
                           {"per_rank": {str(f.ranks[0]): f.details for f in group},
                            "lowest": [round(x, 3) for x in lows], "unit": unit, **({"kind": kind} if kind else {})}))
    return out + collapse(rest)


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    return merge(findings_by_rank, lambda f: [float(f.details["h2d"]["measured_busbw_gbps"]),
                                              float(f.details["d2h"]["measured_busbw_gbps"])])


CHECK = Check(id="pcie_bandwidth", title="Host-to-device and device-to-host bandwidth against the GPU's PCIe link",
              run=_run, combine=_combine)
