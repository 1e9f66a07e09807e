"""``ddpdoctor env``: the local environment as one paste-ready block (or JSON) for a bug report.

No process group: this runs on one machine, in a second, and with ``--no-torch`` without importing torch
(useful when importing torch is itself what fails).
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
from typing import Any

from ddpdoctor import __version__
from ddpdoctor.env import facts as envinfo

PACKAGES = ("torch", "typer", "tabulate", "py-spy", "nvidia-ml-py", "psutil", "numpy", "safetensors")


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _launcher() -> dict[str, Any]:
    from ddpdoctor.errors import DoctorError
    from ddpdoctor.runtime.launcher import detect

    try:
        info = detect()
    except DoctorError as exc:
        return {"launcher": "invalid", "error": str(exc)}
    return {"launcher": info.launcher, "rank": info.rank, "world_size": info.world_size,
            "local_rank": info.local_rank, "master_addr": info.master_addr, "master_port": info.master_port}


def collect(with_torch: bool = True) -> dict[str, Any]:
    """Everything ``ddpdoctor env`` shows, as JSON-able data."""
    import psutil

    from ddpdoctor.env.nvml import collect_host_gpu_facts

    facts: dict[str, Any] = {
        "ddpdoctor": __version__,
        "host": socket.gethostname(),
        "versions": envinfo.versions(with_torch=with_torch),
        "packages": _package_versions(),
        "launcher": _launcher(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "shm_bytes": envinfo.shm_bytes(),
        "interfaces": envinfo.interfaces(),
        "vars": envinfo.watched_env(),
        "gpu": collect_host_gpu_facts(),
    }
    if with_torch:
        import torch

        facts["torch_devices"] = {
            "cuda_device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    return facts


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 30):.1f} GiB"


def _shown(value: str) -> str:
    """A variable's value for the block: as it is when printable, else Python's repr, quoted, so that its
    control characters show as escapes (``'INFO\\nfake line'``) and the value cannot be read as a value
    that holds the characters ``\\`` and ``n``."""
    return value if value.isprintable() else repr(value)


def _one_line(line: str) -> str:
    """One line of the block with any control character escaped (``\\n``, ``\\x1b``, ...).

    Every fact is written on its own line, and the values come from outside ddpdoctor (environment
    variables, host and interface names, paths, error texts that quote them): a newline in one would start
    a line of its own and could forge a line of a bug report, an escape sequence could rewrite the
    terminal. Only the text is escaped; the JSON keeps the values as they are."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in line)


def render(facts: dict[str, Any]) -> str:
    """The paste-ready block: short lines, one fact family each, never a line that a value wrote."""
    v = facts["versions"]
    lines = [f"ddpdoctor {facts['ddpdoctor']} environment on {facts['host']}",
             f"python       {v['python']} ({v['executable']})",
             f"platform     {v['platform']}"]
    if "torch" in v:
        lines.append(f"torch        {v['torch']}  cuda {v['cuda']}  nccl {v['nccl']}  "
                     f"gloo {'yes' if v['gloo_available'] else 'no'}  cuda available {v['cuda_available']}")
    else:
        lines.append("torch        not imported (--no-torch)")
    packages = ", ".join(f"{k} {val}" for k, val in facts["packages"].items() if val)
    lines.append(f"packages     {packages}")
    launch = facts["launcher"]
    if launch["launcher"] == "none":
        lines.append("launcher     none (not inside torchrun/srun/mpirun)")
    elif launch["launcher"] == "invalid":
        lines.append(f"launcher     invalid: {launch['error']}")
    else:
        lines.append(f"launcher     {launch['launcher']}: rank {launch['rank']}/{launch['world_size']} local rank "
                     f"{launch['local_rank']}, master {launch['master_addr']}:{launch['master_port']}")
    lines.append(f"machine      {facts['cpu_count']} cpus, {_gib(facts['memory_bytes'])} memory, "
                 f"/dev/shm {_gib(facts['shm_bytes'])}")
    nics = "; ".join(f"{name} {' '.join(addrs) or '-'}" for name, addrs in sorted(facts["interfaces"].items()))
    lines.append(f"interfaces   {nics}")
    gpu = facts["gpu"]
    if not gpu.get("available"):
        lines.append(f"gpus         none: {gpu.get('reason', 'unknown')}")
    else:
        lines.append(f"gpus         driver {gpu.get('driver_version')}, CUDA driver {gpu.get('cuda_driver_version')}")
        for g in gpu.get("gpus", []):
            lines.append(f"  [{g.get('index')}] {g.get('name')} {g.get('uuid')} bus {g.get('pci_bus_id')} "
                         f"mem {_gib(g.get('memory_used_bytes'))}/{_gib(g.get('memory_total_bytes'))} "
                         f"pcie gen{g.get('pcie_link_gen')}x{g.get('pcie_link_width')} "
                         f"nvlink {g.get('nvlink_up')}/{g.get('nvlink_total')} "
                         f"ecc(uncorrected, volatile) {g.get('ecc_volatile_uncorrected')}")
    variables = facts["vars"]
    lines.append("variables    " + ("(none of NCCL_*, TORCH_*, GLOO_*, MASTER_*, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS)"
                                    if not variables else ""))
    lines += [f"  {k}={_shown(val)}" for k, val in variables.items()]
    return "\n".join(_one_line(line) for line in lines)
