"""``ddpdoctor env`` and the facts behind the ``env``, ``port`` and ``gpu`` checks.

- :mod:`~ddpdoctor.env.facts`: variables, versions, network interfaces, ``/dev/shm`` of this process.
- :mod:`~ddpdoctor.env.nvml`: a plain-dict snapshot of this host's NVIDIA GPUs through NVML.
- :mod:`~ddpdoctor.env.report`: the paste-ready block (or JSON) of ``ddpdoctor env``.
"""

from __future__ import annotations

from ddpdoctor.env import facts, nvml
from ddpdoctor.env.facts import nccl_version
from ddpdoctor.env.nvml import collect_host_gpu_facts
from ddpdoctor.env.report import collect, render

__all__ = ["collect", "collect_host_gpu_facts", "facts", "nccl_version", "nvml", "render"]
