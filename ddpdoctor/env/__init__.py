"""``ddpdoctor env`` and the facts behind the ``env``, ``port`` and ``gpu`` checks.

- :mod:`~ddpdoctor.env.facts`: variables, versions, network interfaces, ``/dev/shm`` of this process.
- :mod:`~ddpdoctor.env.nvml`: a plain-dict snapshot of this host's NVIDIA GPUs through NVML.
- :mod:`~ddpdoctor.env.kernel_log`: NVIDIA Xid events from the kernel log (bounded reader, pure parser).
- :mod:`~ddpdoctor.env.xid`: what each Xid means and whose fault it usually is (NVIDIA's Xid catalog).
- :mod:`~ddpdoctor.env.gpu_facts`: one rank's GPU facts for the ``gpu`` check (PyTorch, NVML, sysfs, Xids).
- :mod:`~ddpdoctor.env.links`: the facts of a rank's data path (interface speed and qdiscs, IB/RoCE ports, PCIe
  link state, NUMA placement, NCCL's chosen transports) that bandwidth expectations are derived from.
- :mod:`~ddpdoctor.env.sysfs`: NUMA nodes of GPUs, NICs and CPUs; InfiniBand port states (sysfs readers).
- :mod:`~ddpdoctor.env.report`: the paste-ready block (or JSON) of ``ddpdoctor env``.
"""

from __future__ import annotations

from ddpdoctor.env import facts, gpu_facts, kernel_log, links, load, nvml, sysfs, xid
from ddpdoctor.env.facts import nccl_version
from ddpdoctor.env.gpu_facts import gather_preflight, gather_rank_facts, match_nvml_gpu, normalize_uuid
from ddpdoctor.env.kernel_log import XidEvent, bus_key, parse_xid_events, read_kernel_log
from ddpdoctor.env.links import cpu_numa_nodes, gpu_of, parse_nccl_info, pcie_link, placement, rank_link_facts
from ddpdoctor.env.load import other_runnable
from ddpdoctor.env.nvml import collect_host_gpu_facts
from ddpdoctor.env.report import collect, render
from ddpdoctor.env.xid import XidInfo, xid_info

__all__ = [
           "XidEvent",
           "XidInfo",
           "bus_key",
           "collect",
           "collect_host_gpu_facts",
           "cpu_numa_nodes",
           "facts",
           "gather_preflight",
           "gather_rank_facts",
           "gpu_facts",
           "gpu_of",
           "kernel_log",
           "links",
           "load",
           "match_nvml_gpu",
           "nccl_version",
           "normalize_uuid",
           "nvml",
           "other_runnable",
           "parse_nccl_info",
           "parse_xid_events",
           "pcie_link",
           "placement",
           "rank_link_facts",
           "read_kernel_log",
           "render",
           "sysfs",
           "xid",
           "xid_info",
]
