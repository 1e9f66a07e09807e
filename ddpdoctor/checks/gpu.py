"""`gpu`: which GPU each rank really uses, and whether those GPUs are healthy and alike.

What fails in real life, and how it shows up:

* **Two ranks on one GPU.** ``torch.cuda.set_device(local_rank)`` was forgotten (every rank uses
  ``cuda:0``), or the launcher gives every task the same ``CUDA_VISIBLE_DEVICES``. NCCL refuses at the
  first collective::

      torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:1727, invalid usage
      ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
      Last error:
      Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000

  Reproduce by hand on a 2-GPU node: ``CUDA_VISIBLE_DEVICES=0 torchrun --nproc-per-node 2 train.py``.
* **A rank on the wrong GPU**: more ranks per node than visible GPUs (``torchrun --nproc-per-node 8``
  on a 4-GPU node) gives ``RuntimeError: CUDA error: invalid device ordinal``; a rank that never called
  ``set_device`` allocates on ``cuda:0`` and runs out of memory there (``torch.OutOfMemoryError: CUDA out
  of memory. Tried to allocate ...``) while its own GPU idles.
* **Mixed driver / CUDA / NCCL versions across hosts**: hangs or ``NCCL error ... unhandled system
  error`` at the first collective between hosts that were upgraded at different times.
* **One GPU unlike its peers**: an NVLink down, a PCIe link trained at x8 instead of x16 or a lower
  generation, uncorrectable ECC errors (``CUDA error: uncorrectable ECC error encountered``), retired
  pages or pending row remaps, thermal/hardware slowdown. The whole job runs at the slowest GPU's speed,
  or dies with an Xid in ``dmesg``. Compare by hand: ``nvidia-smi -q -d ECC,PCIE,PERFORMANCE,PAGE_RETIREMENT``
  and ``nvidia-smi nvlink --status``.
* **Another process on the GPU** (a stale job, a notebook): less memory, slower steps; ``nvidia-smi``
  lists it.

Without CUDA (CPU-only PyTorch, no driver, no GPU, ``CUDA_VISIBLE_DEVICES=""``) the check reports
``skip`` with the reason -- never ``pass``.

Layout: the facts are gathered on each rank by :func:`ddpdoctor.env.gpu_facts.gather_rank_facts` (PyTorch,
NVML, sysfs, the kernel log); this file is the verdict: :func:`analyze`, a pure function of every rank's
plain-dict facts, run by rank 0.

Xids are judged, not just counted (NVIDIA's catalog, :mod:`ddpdoctor.env.xid`): an application's fault
(Xid 13, 31, 43, 45: a device-side assert leaves 13 and 43) from another process or long ago is a note,
since the GPU itself is fine; a hardware or driver Xid (48, 63, 64, 74, 79, 92, 94, 95, 119, 120, ...)
during this run or in the last hour fails the check with NVIDIA's action (drain the node, reset the GPU,
RMA if it repeats), and an older one warns. Each names the process (pid and name from the kernel line)
and the time it belongs to.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from ddpdoctor.check import Check, CheckContext
from ddpdoctor.env import gather_rank_facts, normalize_uuid, sysfs, xid, xid_info
from ddpdoctor.findings import FAIL, PASS, SKIP, WARN, Finding, RankInfo
from ddpdoctor.ranks import rank_phrase

CHECK_ID = "gpu"

# Clock-event reasons that mean the GPU is running slower than it should (nvml.h ClocksEventReasons);
# gpu_idle, sw_power_cap and applications_clocks_setting are normal.
BAD_THROTTLE_REASONS = frozenset(
    {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})


# An Xid this recent (seconds) is about the GPU as it is now; older ones may predate a reset or repair.
RECENT_XID_S = 3600.0


def preflight_problems(pre: Mapping[str, Any], job_pids: Iterable[int] = ()) -> list[tuple[str, str, str, str]]:
    """(status, problem, remedy, kind) from one rank's preflight facts (``gather_preflight``); pure.

    ``job_pids`` are this job's ranks on that host: an Xid naming one of them is this run's own.
    """
    found = xid_problems(pre, job_pids)
    gpu_node = pre.get("gpu_numa_node")
    numa = {int(n): set(c) for n, c in (pre.get("numa_cpus") or {}).items()}
    affinity = set(pre.get("cpu_affinity") or [])
    if gpu_node is not None and len(numa) > 1 and affinity and gpu_node in numa and not affinity & numa[gpu_node]:
        nodes = sorted(n for n, c in numa.items() if affinity & c)
        found.append((WARN, f"the process may run only on CPUs of NUMA node{'s' if len(nodes) > 1 else ''} "
                            f"{', '.join(map(str, nodes))} but its GPU is on node {gpu_node}: every host-device "
                            "copy crosses the socket link",
                      f"bind each rank to its GPU's NUMA node (numactl --cpunodebind={gpu_node}, or the "
                      "launcher's CPU binding, e.g. srun --cpu-bind)", "numa_placement"))
    # The same list as the env check's "(have: ...)" (env.facts.usable_interfaces): one host, one list.
    net_names = list(pre.get("interfaces") or [])
    ib = pre.get("ib") or []
    ifname = pre.get("nccl_socket_ifname")
    if ifname and (missing := sysfs.unmatched_names(ifname, net_names)):
        found.append((FAIL, f"NCCL_SOCKET_IFNAME={ifname!r} names {', '.join(missing)}, which match no network "
                            f"interface here (interfaces: {', '.join(net_names) or 'none'}); NCCL fails with "
                            "\"no socket interface found\"",
                      "set NCCL_SOCKET_IFNAME to an interface this host has (ip -br link), or unset it",
                      "nccl_socket_ifname"))
    hca = pre.get("nccl_ib_hca")
    ib_names = [d["name"] for d in ib]
    if hca and (missing := sysfs.unmatched_names(hca, ib_names)):
        found.append((FAIL, f"NCCL_IB_HCA={hca!r} names {', '.join(missing)}, which match no InfiniBand device "
                            f"here (devices: {', '.join(ib_names) or 'none'})",
                      "set NCCL_IB_HCA to devices ibv_devinfo lists, or unset it", "nccl_ib_hca"))
    if str(pre.get("nccl_ib_disable") or "0") != "1" and ib:
        wanted = _selected_ib(hca, ib_names)
        down = [f"{d['name']}:{port} {state}" for d in ib if d["name"] in wanted
                for port, state in sorted((d.get("ports") or {}).items()) if state and state != "ACTIVE"]
        active = [d for d in ib if d["name"] in wanted and "ACTIVE" in (d.get("ports") or {}).values()]
        if down:
            found.append((WARN if active else FAIL,
                          f"InfiniBand port{'s' if len(down) > 1 else ''} not ACTIVE: {', '.join(down)}"
                          + ("" if active else "; NCCL has no usable IB port and falls back to sockets (slow)"),
                          "check the cable and the switch port (ibstat); or leave the port out with NCCL_IB_HCA",
                          "ib_port"))
        ib_nodes = {d.get("numa_node") for d in active} - {None}
        if gpu_node is not None and ib_nodes and gpu_node not in ib_nodes and len(numa) > 1:
            found.append((WARN, f"no active InfiniBand device on the GPU's NUMA node {gpu_node} (active HCAs are on "
                                f"node{'s' if len(ib_nodes) > 1 else ''} {', '.join(map(str, sorted(ib_nodes)))}): "
                                "inter-node traffic crosses the socket link",
                          "check the NIC placement (nvidia-smi topo -m); on such hosts set NCCL_IB_HCA per rank "
                          "to the closest HCA", "numa_placement"))
    return found


def _selected_ib(hca: str | None, names: list[str]) -> set[str]:
    """The HCAs NCCL would use under NCCL_IB_HCA (all of them when unset)."""
    if not hca:
        return set(names)
    exclude, exact, items = sysfs.nccl_device_filter(hca)
    match = {n for n in names for name, _ in items if (n == name if exact else n.startswith(name))}
    return set(names) - match if exclude else match


DURING_RUN, LAST_HOUR, SINCE_BOOT = "during this run", "in the last hour", "since boot"


def xid_problems(pre: Mapping[str, Any], job_pids: Iterable[int] = ()) -> list[tuple[str, str, str, str]]:
    """The Xids of this rank's GPU, judged by origin and recency: one (status, problem, remedy, kind) per Xid
    number and time bucket, naming the latest event's time, process and message.

    Hardware/driver Xids during this run or in the last hour fail, older ones warn; application Xids are a
    note (a pass that says so) unless this run caused them (during the run, from one of ``job_pids`` or a
    process the log does not name); unknown ones warn when recent.
    """
    pids = set(job_pids)
    uptime = pre.get("uptime_s")
    started = pre.get("job_started_s")
    groups: dict[tuple[int, str], list[Mapping[str, Any]]] = defaultdict(list)
    for event in pre.get("xid_events") or []:
        groups[(int(event["xid"]), _bucket(event, uptime, started, pids))].append(event)
    found = []
    for (number, bucket), events in sorted(groups.items(), key=lambda kv: (kv[0][0], _BUCKETS.index(kv[0][1]))):
        info = xid_info(number)
        last = events[-1]
        recent = bucket in (DURING_RUN, LAST_HOUR)
        if info.origin == xid.APPLICATION:
            # During this run and this job's own (or nobody's named): warn. Another process's fault (a test
            # job beside this one: the first H100 run of the GPU suite) is that process's, not the GPU's.
            ours = any(e.get("pid") is None or int(e["pid"]) in pids for e in events)
            status = WARN if bucket == DURING_RUN and ours else PASS
        elif info.origin == xid.UNKNOWN:
            status = WARN if recent else PASS
        else:
            status = FAIL if recent else WARN
        times = f"{len(events)} time{'s' if len(events) > 1 else ''} {bucket}"
        problem = (f"Xid {number} ({info.meaning}) {times}, last {_when(last, uptime, pre.get('boot_epoch'))}"
                   f"{_by_whom(last, pids)}" + (f": {last['message']}" if last.get("message") else ""))
        if status == PASS:
            problem = f"note: {problem}; " + ("an application's fault, not the GPU's: nothing to do"
                                              if info.origin == xid.APPLICATION else "old: nothing to do now")
            remedy = ""
        elif status == WARN and info.origin not in (xid.APPLICATION, xid.UNKNOWN):
            remedy = f"unless the GPU was reset or the node rebooted since: {info.action}"
        else:
            remedy = info.action
        found.append((status, problem, remedy, f"xid_{info.origin}"))
    return found


_BUCKETS = (DURING_RUN, LAST_HOUR, SINCE_BOOT)


def _bucket(event: Mapping[str, Any], uptime: float | None, started: float | None, pids: set[int]) -> str:
    """When an Xid happened, relative to this run: during it, in the last hour, or earlier since boot."""
    at = event.get("at_s")
    if at is None:  # a line without a time: it names this job's process, or its time is unknown
        return DURING_RUN if event.get("pid") in pids else SINCE_BOOT
    if started is not None and at >= started - 1.0:  # the stamps of two clocks: a second of slack
        return DURING_RUN
    if uptime is not None and uptime - at <= RECENT_XID_S:
        return LAST_HOUR
    return SINCE_BOOT


def _when(event: Mapping[str, Any], uptime: float | None, boot_epoch: float | None) -> str:
    """"12 min ago (at 14:03:22)", "3 d 4 h ago (on Feb 14 05:03:41)", or the log's own stamp."""
    at = event.get("at_s")
    if at is None or uptime is None:
        return f"at {event['when']}" if event.get("when") else "at an unknown time"
    age = max(0.0, uptime - float(at))
    text = f"{_age(age)} ago"
    if boot_epoch is not None:
        stamp = time.localtime(float(boot_epoch) + float(at))
        text += " (at " + time.strftime("%H:%M:%S" if age < 20 * 3600 else "%b %d %H:%M:%S", stamp) + ")"
    return text


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    hours = minutes // 60
    if hours < 48:
        return f"{hours} h {minutes % 60} min"
    return f"{hours // 24} d {hours % 24} h"


def _by_whom(event: Mapping[str, Any], pids: set[int]) -> str:
    """" from pid 1234 (python3), a rank of this job" -- what the kernel line says about the process."""
    pid, name = event.get("pid"), event.get("process")
    if not pid:  # pid=0 is the kernel itself (a GPU falling off the bus): no process to name
        pid = None
    if pid is None and not name:
        return ""
    who = f" from pid {pid}" if pid is not None else " from"
    who += f" ({name})" if name and pid is not None else f" {name}" if name else ""
    return who + (", a rank of this job" if pid in pids else "")


# --------------------------------------------------------------------------------------------------
# The verdict: plain dicts in, findings out.
# --------------------------------------------------------------------------------------------------

def expected_device_index(local_rank: int, local_world_size: int, device_count: int) -> int | None:
    """The device a rank should use: cuda:LOCAL_RANK, or cuda:0 when each rank sees only its own GPU.

    None when there are more local ranks than visible GPUs (no right answer: ranks must share).
    """
    if device_count == 1:
        return 0
    if 0 <= local_rank < device_count:
        return local_rank
    return None


def analyze(facts_by_rank: Mapping[int, Mapping[str, Any]],
            ranks: Mapping[int, RankInfo] | None = None) -> list[Finding]:
    """Every GPU finding for the job, from each rank's :func:`gather_rank_facts` dict."""
    ranks = ranks or {}
    tags = {r: _tag(r, f, ranks) for r, f in facts_by_rank.items()}
    gpu_ranks = {r: f for r, f in facts_by_rank.items() if f.get("cuda_available") and not f.get("skip_reason")}
    skipped = {r: f for r, f in facts_by_rank.items() if r not in gpu_ranks}
    findings: list[Finding] = []
    if not gpu_ranks:
        by_reason: dict[str, list[int]] = defaultdict(list)
        for r, f in sorted(skipped.items()):
            by_reason[str(f.get("skip_reason") or "no usable GPU")].append(r)
        return [_finding(SKIP, f"no GPU check: {reason}", rs, kind="no_gpu",
                         nvml_available=any(facts_by_rank[r].get("nvml_available") for r in rs))
                for reason, rs in by_reason.items()]
    if skipped:
        findings.append(_finding(
            FAIL,
            f"{rank_phrase(skipped)} cannot use a GPU while {rank_phrase(gpu_ranks)} can: "
            + "; ".join(sorted({f"{tags[r]} {f.get('skip_reason')}" for r, f in skipped.items()})),
            sorted(skipped),
            "install the CUDA build of PyTorch and the NVIDIA driver on every host, and check "
            "CUDA_VISIBLE_DEVICES on the ranks named", kind="ranks_without_gpu"))
    findings += _duplicates(gpu_ranks, tags)
    findings += _wrong_devices(gpu_ranks, tags)
    findings += _version_mismatches(gpu_ranks)
    findings += _unhealthy(gpu_ranks, tags)
    findings += _models(gpu_ranks)
    findings += _preflight(gpu_ranks, tags)
    findings += _other_processes(gpu_ranks, tags, ranks)
    problems = [f for f in findings if f.status != PASS]
    if not problems:
        findings.append(_all_good(gpu_ranks))
    findings += _p2p_summaries(gpu_ranks)
    return findings


def _duplicates(gpu_ranks: Mapping[int, Mapping[str, Any]], tags: Mapping[int, str]) -> list[Finding]:
    """Ranks sharing one physical GPU: NCCL's 'Duplicate GPU detected'."""
    by_gpu: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for r, f in gpu_ranks.items():
        if f.get("uuid"):
            by_gpu[("uuid", normalize_uuid(str(f["uuid"])))].append(r)
        elif f.get("pci_bus_id"):
            by_gpu[("pci", str(f.get("host")), str(f["pci_bus_id"]))].append(r)
    out = []
    for key, rs in sorted(by_gpu.items(), key=lambda kv: min(kv[1])):
        if len(rs) < 2:
            continue
        rs.sort()
        first = gpu_ranks[rs[0]]
        named = ", ".join(f"rank {r} {tags[r]} (cuda:{gpu_ranks[r].get('device_index')})" for r in rs)
        out.append(_finding(
            FAIL,
            f"{rank_phrase(rs)} share one GPU {key[-1]} "
            f"({first.get('device_name')}): {named}; NCCL fails with \"Duplicate GPU detected : rank "
            f"{rs[1]} and rank {rs[0]} both on CUDA device ...\"",
            rs,
            "give each rank its own GPU: call torch.cuda.set_device(local_rank) before "
            "init_process_group, run at most one rank per GPU (--nproc-per-node <= number of GPUs), and "
            "do not give every task the same CUDA_VISIBLE_DEVICES",
            kind="duplicate_gpu", uuid=key[-1], cuda_visible_devices={r: gpu_ranks[r].get("cuda_visible_devices") for r in rs}))
    return out


def _wrong_devices(gpu_ranks: Mapping[int, Mapping[str, Any]], tags: Mapping[int, str]) -> list[Finding]:
    """Ranks whose device is not cuda:LOCAL_RANK (or cuda:0 when they see one GPU each)."""
    out = []
    for r, f in sorted(gpu_ranks.items()):
        count = int(f.get("device_count") or 0)
        local_rank = int(f.get("local_rank", -1))
        index = f.get("device_index")
        expected = expected_device_index(local_rank, int(f.get("local_world_size") or 1), count)
        cvd = f.get("cuda_visible_devices")
        seen = f"CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"
        if expected is None:
            out.append(_finding(
                FAIL,
                f"rank {r} {tags[r]} is local rank {local_rank} but sees only {count} GPUs ({seen}): "
                "more ranks per host than GPUs (\"CUDA error: invalid device ordinal\")",
                [r], "launch at most one rank per GPU: --nproc-per-node <= number of GPUs on the host",
                kind="more_ranks_than_gpus", device_count=count, local_rank=local_rank))
        elif index != expected:
            out.append(_finding(
                FAIL,
                f"rank {r} {tags[r]} uses cuda:{index} but local rank {local_rank} should use "
                f"cuda:{expected} ({count} GPUs visible, {seen})",
                [r], "call torch.cuda.set_device(local_rank) (LOCAL_RANK from the launcher) before "
                "init_process_group and before creating any CUDA tensor",
                kind="wrong_device", device_index=index, expected_device_index=expected))
    return out


def _version_mismatches(gpu_ranks: Mapping[int, Mapping[str, Any]]) -> list[Finding]:
    """Driver versions that differ between ranks (between hosts, in practice).

    PyTorch's CUDA build and NCCL versions are the env check's (torch/cuda/nccl, a fail there).
    """
    fields = (
        ("driver_version", "NVIDIA driver", WARN),
        ("cuda_driver_version", "CUDA driver API", WARN),
    )
    out = []
    for field, label, status in fields:
        groups: dict[str, list[int]] = defaultdict(list)
        for r, f in gpu_ranks.items():
            if f.get(field) is not None:
                groups[str(f[field])].append(r)
        if len(groups) < 2:
            continue
        parts = []
        for value, rs in sorted(groups.items(), key=lambda kv: min(kv[1])):
            hosts = sorted({str(gpu_ranks[r].get("host")) for r in rs})
            parts.append(f"{value} on {rank_phrase(rs)} (host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)})")
        out.append(_finding(
            status, f"mixed {label} versions: " + "; ".join(parts),
            sorted(r for rs in groups.values() for r in rs),
            f"install the same {label} version on every host (mixed versions hang or fail at the first "
            "collective between hosts)",
            kind="mixed_driver", field=field, versions={v: sorted(rs) for v, rs in groups.items()}))
    return out


def _models(gpu_ranks: Mapping[int, Mapping[str, Any]]) -> list[Finding]:
    """GPUs of different models in one job: the job runs at the slowest one's speed (and NCCL may pick
    different algorithms per host)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for r, f in gpu_ranks.items():
        if f.get("device_name"):
            groups[str(f["device_name"])].append(r)
    if len(groups) < 2:
        return []
    parts = "; ".join(f"{name} on {rank_phrase(rs)}" for name, rs in sorted(groups.items(), key=lambda kv: min(kv[1])))
    return [_finding(WARN, f"ranks use different GPU models: {parts}", sorted(gpu_ranks),
                     "run the job on one GPU model (the slowest GPU sets the pace of every step)",
                     kind="mixed_models", models={k: sorted(v) for k, v in groups.items()})]


def _preflight(gpu_ranks: Mapping[int, Mapping[str, Any]], tags: Mapping[int, str]) -> list[Finding]:
    """Kernel-log Xids, NUMA placement and NIC problems; ranks with the same problem share one finding."""
    pids_by_host: dict[str, set[int]] = defaultdict(set)
    for f in gpu_ranks.values():
        pids_by_host[str(f.get("host"))].add(int(f.get("pid", -1)))
    grouped: dict[tuple[str, str, str, str, str], list[int]] = defaultdict(list)
    for r, f in sorted(gpu_ranks.items()):
        pre = f.get("preflight")
        if not isinstance(pre, Mapping):
            continue
        for status, problem, remedy, kind in preflight_problems(pre, pids_by_host[str(f.get("host"))]):
            # The same Xid text on two hosts is two GPUs: the host is part of the key.
            grouped[(str(f.get("host")), status, problem, remedy, kind)].append(r)
    return [_finding(status, f"{', '.join(tags[r] for r in rs)} {problem}", rs, remedy, kind=kind)
            for (_, status, problem, remedy, kind), rs in grouped.items()]


def _unhealthy(gpu_ranks: Mapping[int, Mapping[str, Any]], tags: Mapping[int, str]) -> list[Finding]:
    """Per-GPU health problems, and GPUs whose links are worse than their peers of the same model."""
    by_uuid: dict[str, tuple[dict[str, Any], list[int]]] = {}
    for r, f in sorted(gpu_ranks.items()):
        gpu = f.get("gpu")
        if not gpu:
            continue
        key = str(gpu.get("uuid") or f"{f.get('host')}/{gpu.get('pci_bus_id')}")
        by_uuid.setdefault(key, (dict(gpu), []))[1].append(r)
    peers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for gpu, _ in by_uuid.values():
        peers[str(gpu.get("name"))].append(gpu)
    out = []
    for gpu, rs in by_uuid.values():
        where = f"{', '.join(tags[r] for r in rs)} GPU {gpu.get('uuid')} ({gpu.get('name')}, PCI {gpu.get('pci_bus_id')})"
        for status, problem, remedy in gpu_problems(gpu, peers[str(gpu.get("name"))]):
            out.append(_finding(status, f"{where}: {problem}", rs, remedy, kind="gpu_health", gpu=gpu))
    return out


def gpu_problems(gpu: Mapping[str, Any],
                 peers: Iterable[Mapping[str, Any]] = ()) -> list[tuple[str, str, str]]:
    """(status, problem, remedy) for one GPU's NVML facts, judged alone and against same-model peers."""
    found: list[tuple[str, str, str]] = []
    drain = ("drain the host and have the GPU checked (nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER; "
             "dmesg | grep -i xid)")
    if gpu.get("error"):
        found.append((FAIL, f"NVML cannot reach this GPU: {gpu['error']}",
                      "the GPU may have fallen off the bus (Xid 79): " + drain))
    if (gpu.get("ecc_volatile_uncorrected") or 0) > 0:
        found.append((FAIL, f"{gpu['ecc_volatile_uncorrected']} uncorrectable ECC errors since the last "
                            "driver reload (\"CUDA error: uncorrectable ECC error encountered\")", drain))
    elif (gpu.get("ecc_aggregate_uncorrected") or 0) > 0:
        found.append((WARN, f"{gpu['ecc_aggregate_uncorrected']} uncorrectable ECC errors over its lifetime",
                      "watch this GPU; " + drain))
    if gpu.get("row_remap_failure"):
        found.append((FAIL, "row remapping failed: the memory cannot be repaired", drain))
    elif gpu.get("row_remap_pending"):
        found.append((WARN, "a memory row remap is pending and takes effect only after a GPU reset",
                      "reset the GPU when it is idle (nvidia-smi -r -i <index>) or reboot the host"))
    if (gpu.get("retired_pages") or 0) > 0:
        found.append((WARN, f"{gpu['retired_pages']} memory pages retired after ECC errors", drain))
    up, total = gpu.get("nvlink_up"), gpu.get("nvlink_total")
    peer_list = [p for p in peers if p is not gpu and p.get("uuid") != gpu.get("uuid")]
    peer_up = [p["nvlink_up"] for p in peer_list if p.get("nvlink_up") is not None]
    if up is not None and total and up < total:
        found.append((WARN, f"only {up} of {total} NVLinks up", "check nvidia-smi nvlink --status; "
                      "NCCL falls back to slower paths through this GPU; " + drain))
    elif up is not None and peer_up and up < max(peer_up):
        found.append((WARN, f"{up} NVLinks up where its peers have {max(peer_up)}",
                      "check nvidia-smi nvlink --status on this host; " + drain))
    link_errors = gpu.get("nvlink_errors") or {}
    if link_errors.get("recovery") or link_errors.get("crc_data"):
        # Recoveries mean a link went down and retrained; CRC data errors mean corrupted payloads were
        # resent. Both slow NCCL and often precede Xid 74 (nvidia-smi nvlink -e shows the same counters).
        found.append((WARN, f"NVLink errors since the driver loaded: {link_errors.get('recovery', 0)} link "
                            f"recoveries, {link_errors.get('crc_data', 0)} CRC data errors, "
                            f"{link_errors.get('replay', 0)} replays",
                      "check nvidia-smi nvlink -e over time; if the counts grow, " + drain))
    width, width_max = gpu.get("pcie_link_width"), gpu.get("pcie_link_width_max")
    peer_width = [p["pcie_link_width"] for p in peer_list if p.get("pcie_link_width") is not None]
    if width is not None and width_max and width < width_max:
        found.append((WARN, f"PCIe link trained at x{width} of x{width_max}",
                      "reseat the GPU or its riser; check nvidia-smi -q -d PCIE"))
    elif width is not None and peer_width and width < max(peer_width):
        found.append((WARN, f"PCIe link x{width} where its peers have x{max(peer_width)}",
                      "reseat the GPU or its riser; check nvidia-smi -q -d PCIE"))
    gen = gpu.get("pcie_link_gen")
    peer_gen = [p["pcie_link_gen"] for p in peer_list if p.get("pcie_link_gen") is not None]
    if gen is not None and peer_gen and gen < min(peer_gen):
        # Idle GPUs drop their link generation to save power, so only a GPU slower than *every* peer
        # at the same moment is suspicious (nvidia-smi docs: "Current link generation ... may be reduced
        # when the GPU is not in use").
        found.append((WARN, f"PCIe gen {gen} where its peers run gen {min(peer_gen)}",
                      "re-check under load (nvidia-smi -q -d PCIE); if it stays low, check BIOS PCIe "
                      "settings and the slot"))
    bad = sorted(set(gpu.get("throttle_reasons") or ()) & BAD_THROTTLE_REASONS)
    if bad:
        found.append((WARN, f"clocks slowed down: {', '.join(bad)} (SM {gpu.get('clocks_sm_mhz')} of "
                            f"{gpu.get('clocks_max_sm_mhz')} MHz)",
                      "check cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER)"))
    return found


def _other_processes(gpu_ranks: Mapping[int, Mapping[str, Any]], tags: Mapping[int, str],
                     ranks: Mapping[int, RankInfo]) -> list[Finding]:
    """Processes on a rank's GPU that are not ranks of this job."""
    ours: dict[str, set[int]] = defaultdict(set)
    for r, f in gpu_ranks.items():
        info = ranks.get(r)
        ours[str(f.get("host"))].add(int(f.get("pid", info.pid if info else -1)))
    out, seen = [], set()
    for r, f in sorted(gpu_ranks.items()):
        gpu = f.get("gpu") or {}
        key = (str(f.get("host")), str(gpu.get("uuid")))
        if key in seen:
            continue
        seen.add(key)
        others = [p for p in (gpu.get("processes") or []) if int(p.get("pid", -1)) not in ours[key[0]]]
        if not others:
            continue
        users = [rr for rr, ff in gpu_ranks.items()
                 if (str(ff.get("host")), str((ff.get("gpu") or {}).get("uuid"))) == key]
        listed = ", ".join(
            f"pid {p['pid']}" + (f" ({_gib(p['used_memory_bytes'])})" if p.get("used_memory_bytes") else "")
            for p in others)
        out.append(_finding(
            WARN, f"{tags[r]} GPU {gpu.get('uuid')} is also used by other processes: {listed}",
            sorted(users),
            "stop the other processes (nvidia-smi shows them) or move this job to free GPUs; inside a "
            "container the pids are the host's",
            kind="other_processes", processes=others))
    return out


def _p2p_summaries(gpu_ranks: Mapping[int, Mapping[str, Any]]) -> list[Finding]:
    """One pass finding per host: which GPU pairs can access each other directly."""
    out = []
    for r, f in sorted(gpu_ranks.items()):
        p2p = f.get("p2p")
        if not p2p or len(p2p.get("matrix") or []) < 2:
            continue
        matrix = p2p["matrix"]
        n = len(matrix)
        missing = [(i, j) for i in range(n) for j in range(n) if i != j and not matrix[i][j]]
        if not missing:
            text = f"all {n} GPUs can access each other peer-to-peer"
        elif len(missing) == n * (n - 1):
            text = f"no peer-to-peer access between its {n} GPUs (NCCL goes through host memory)"
        else:
            pairs = ", ".join(f"{i}->{j}" for i, j in missing[:12]) + (" ..." if len(missing) > 12 else "")
            text = f"{len(missing)} of {n * (n - 1)} GPU pairs lack peer-to-peer access: {pairs}"
        out.append(_finding(PASS, f"host {f.get('host')}: {text}", [r], kind="p2p",
                            host=f.get("host"), p2p=p2p, pairs_without_p2p=[list(p) for p in missing]))
    return out


def _all_good(gpu_ranks: Mapping[int, Mapping[str, Any]]) -> Finding:
    f0 = gpu_ranks[min(gpu_ranks)]
    names = sorted({str(f.get("device_name")) for f in gpu_ranks.values()})
    nvml_note = "" if all(f.get("gpu") for f in gpu_ranks.values()) else \
        " (NVML health facts unavailable on some ranks)"
    return _finding(
        PASS,
        f"{len(gpu_ranks)} ranks on {len(gpu_ranks)} distinct GPUs ({', '.join(names)}); driver "
        f"{f0.get('driver_version')}, CUDA {f0.get('cuda_driver_version')}, NCCL {f0.get('nccl_version')}"
        + nvml_note,
        sorted(gpu_ranks))


# --------------------------------------------------------------------------------------------------
# Wiring into the check runtime.
# --------------------------------------------------------------------------------------------------

def _run(ctx: CheckContext) -> list[Finding]:
    """Gather this rank's facts; rank 0's combine judges them all together."""
    facts = gather_rank_facts(host=ctx.host, local_rank=ctx.local_rank, local_world_size=ctx.local_world_size,
                              pid=ctx.pid, device=ctx.device, backend=ctx.backend,
                              deadline_s=min(2.0, max(0.2, ctx.remaining_s() / 4)),
                              job_started_epoch=ctx.started_epoch)
    if facts["skip_reason"]:
        return [ctx.finding(SKIP, f"no GPU check: {facts['skip_reason']}", facts=facts)]
    summary = f"cuda:{facts['device_index']} {facts['device_name']} {facts['uuid']}"
    return [ctx.finding(PASS, summary, facts=facts)]


def _combine(findings: Mapping[int, list[Finding]], ranks: Mapping[int, RankInfo]) -> list[Finding]:
    """Rank 0: turn every rank's facts into the job's GPU findings; other findings pass through."""
    facts: dict[int, Mapping[str, Any]] = {}
    passthrough: list[Finding] = []
    for rank, rank_findings in findings.items():
        for finding in rank_findings:
            if isinstance(finding.details.get("facts"), Mapping):
                facts[rank] = finding.details["facts"]
            else:
                passthrough.append(finding)  # an error/timeout the runtime recorded
    return passthrough + (analyze(facts, ranks) if facts else [])


CHECK = Check(id=CHECK_ID, title="GPUs: rank-to-GPU mapping, versions and health (NVML)",
              run=_run, combine=_combine)


# --------------------------------------------------------------------------------------------------
# Small helpers.
# --------------------------------------------------------------------------------------------------

def _finding(status: str, summary: str, ranks: Iterable[int], remedy: str = "", **details: Any) -> Finding:
    return Finding(check=CHECK_ID, status=status, summary=summary, ranks=sorted(ranks), remedy=remedy,
                   details=dict(details))


def _tag(rank: int, facts: Mapping[str, Any], ranks: Mapping[int, RankInfo]) -> str:
    info = ranks.get(rank)
    if info is not None:
        return info.tag
    return f"[{facts.get('host', '?')}:{facts.get('local_rank', '?')}]"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
