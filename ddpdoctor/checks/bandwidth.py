"""`bandwidth`: a quick all_reduce sweep and pairwise link test; fails below ``--min-busbw``, warns on slow hosts.

What fails in real life: the job runs, but slowly, because the collectives take a slow path: NCCL picked
the management NIC or fell back to TCP sockets instead of InfiniBand/RoCE (``NCCL INFO NET/Socket :
Using [0]eth0`` in an ``NCCL_DEBUG=INFO`` log where ``NET/IB`` was expected), one node's NIC negotiated a
lower link speed, a cable or switch port drops packets, or GPUs talk through the CPU instead of
NVLink/P2P (``NCCL_P2P_DISABLE=1`` left in a script). Nothing errors; the step time is just 2-10x worse,
and it is the same on every rank because every collective waits for the slowest link.
Reproduce by hand: ``tc qdisc add dev eth0 root tbf rate 1gbit burst 64kb latency 50ms`` on one node of a
multi-node job, then ``ddpdoctor check --only bandwidth`` (or ``ddpdoctor bench --pairs``) names it.

Steps (a few seconds at most): all_reduce at 256 KiB, 1 MiB and 4 MiB (busbw as nccl-tests defines it),
then bidirectional sendrecv between pairs of ranks at 1 MiB (every pair of hosts up to 16 hosts, else a
stride plan of ceil(log2 hosts) rounds; within each host a stride plan of ceil(log2 ranks) rounds). A pair
that looks slow is measured again, with the other pairs of its round beside it, and is blamed only when its
best sample stays below typical by more than the run's own spread. Where ranks outnumber the cores they may
run on (or share a GPU), that is said once, with the numbers, as the likely cause of any slowness; the sweep
is cut to 1 MiB there, since it would only measure the contention. The full sweep is ``ddpdoctor bench``.
Other processes' runnable threads on the ranks' cores count toward that crowding (and a --min-busbw failure
on such cores says so), but do not cut the sweep: they come and go.

Every figure is also set against what its path should give (:mod:`ddpdoctor.bench.expect`: NCCL's topology
model of the NIC, IB port, PCIe link or NVLink each rank's facts show): below ``--min-busbw-pct`` (50) of it
is a FAIL, below ``--warn-busbw-pct`` (80) a WARN, each with the bottleneck the facts show (a shaping qdisc,
a NIC or IB port down, sockets where IB is ACTIVE, PCIe trained below its maximum, P2P off, NUMA, crowding).
Where no model applies (gloo between processes of one host: loopback TCP) the report says so. The sweep is
short (4 MiB at most), so a fast path's peak is not reached here: ``ddpdoctor bench -e 1G`` measures it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ddpdoctor.bench import (
    MIB,
    PairResult,
    Row,
    Thresholds,
    Verdict,
    analyse_pairs,
    assess,
    avg_busbw,
    crowding,
    failure_text,
    fmt_pct,
    gather,
    human_bytes,
    measure_pairs,
    measure_row,
    remedy,
)
from ddpdoctor.check import Check, CheckContext, all_findings, collapse
from ddpdoctor.env import placement, rank_link_facts
from ddpdoctor.findings import FAIL, PASS, SKIP, WARN, Finding, RankInfo
from ddpdoctor.ranks import format_rank_list

MEASURED = "measured"
SIZES = (256 << 10, MIB, 4 * MIB)
# Ranks that outnumber their cores measure CPU contention, not links: a short sweep says as much.
OVERSUBSCRIBED_SIZES = (MIB,)
ITERS, WARMUP = 5, 2
PAIR_BYTES, PAIR_ITERS, PAIR_WARMUP = MIB, 3, 1
# A rank that is slowest at every size and this much slower than the average is named.
OUTLIER_RATIO = 1.5


def _placement(ctx: CheckContext) -> dict[str, Any]:
    """Where this rank may run (host, affinity CPUs, device, other processes' runnable threads on them)."""
    ours = {p.pid for p in ctx.peers.values() if p.host == ctx.host}
    if ctx.launcher in ("local", "torchrun"):
        ours.add(os.getppid())  # the launcher's agent is this job's too
    return placement(ctx.host, ctx.device, ours)


def _facts(ctx: CheckContext, cpus: list[int]) -> dict[str, Any] | None:
    """This rank's link facts for the expectation model; None when they cannot be read (then: no model)."""
    from ddpdoctor.env import gpu_of

    try:
        ours = {p.pid for p in ctx.peers.values() if p.host == ctx.host} | {os.getppid()}
        return rank_link_facts(ctx.backend, os.environ, cpus, gpu_of(ctx.device), our_pids=ours)
    except Exception:  # a fact we cannot read must not cost the measurement; its paths get "no model"
        return None


__all__ = ["CHECK", "ONE_RANK", "crowding"]


ONE_RANK = "nothing crosses a link with one rank: no bandwidth to measure (run 2 or more ranks, or `ddpdoctor bench`)"


def _run(ctx: CheckContext) -> list[Finding]:
    if ctx.world_size == 1:
        # A one-rank all_reduce copies nothing anywhere: its "busbw" is 0 by definition, not a measurement.
        return [ctx.finding(SKIP, ONE_RANK, kind="one_rank")]
    import torch

    device = torch.device(ctx.device)
    mine = _placement(ctx)
    gathered = gather({"placement": mine, "facts": _facts(ctx, mine["cpus"])})
    placements = {r: g["placement"] for r, g in enumerate(gathered)}
    facts = {r: g["facts"] for r, g in enumerate(gathered) if g.get("facts")}
    # Every rank computes the same from the same gathered data, so all run the same collectives.
    crowded = crowding(placements)
    # Only our own ranks outnumbering the cores (or sharing a GPU) make the full sweep pointless; other
    # processes come and go, so the sweep stays whole and the findings say they were there.
    oversubscribed = any((e["cores"] and len(e["ranks"]) > e["cores"]) or e["shared_gpus"] for e in crowded)
    sizes = OVERSUBSCRIBED_SIZES if oversubscribed else SIZES
    rows = [measure_row("all_reduce", size, "float", ITERS, WARMUP, True, device) for size in sizes]
    hosts = {r: ctx.peers[r].host if r in ctx.peers else f"rank{r}" for r in range(ctx.world_size)}
    pairs = measure_pairs(hosts, PAIR_BYTES, "float", PAIR_ITERS, PAIR_WARMUP, device)
    # Every rank has the combined numbers (they were gathered); one copy is enough in the report.
    if ctx.rank != 0:
        return [ctx.finding(PASS, MEASURED)]
    return [ctx.finding(PASS, MEASURED, rows=[r.to_json() for r in rows], pairs=[p.to_json() for p in pairs],
                        world_size=ctx.world_size, min_busbw_gbps=ctx.options.min_busbw_gbps, crowded=crowded,
                        facts={str(r): f for r, f in facts.items()}, hosts={str(r): h for r, h in hosts.items()},
                        thresholds=Thresholds(ctx.options.min_busbw_pct, ctx.options.warn_busbw_pct).to_json())]


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    findings = all_findings(findings_by_rank)
    measured = next((f for f in findings if f.summary == MEASURED and "rows" in f.details), None)
    others = [f for f in findings if f.summary != MEASURED]
    if measured is None:
        return collapse(others)
    rows = [Row.from_json(r) for r in measured.details["rows"]]
    pairs = [PairResult.from_json(p) for p in measured.details["pairs"]]
    world = int(measured.details["world_size"])
    ranks = sorted(int(r) for r in findings_by_rank)
    min_busbw = measured.details.get("min_busbw_gbps")
    facts = {int(r): f for r, f in (measured.details.get("facts") or {}).items()}
    hosts = {int(r): str(h) for r, h in (measured.details.get("hosts") or {}).items()}
    thresholds = Thresholds(**measured.details["thresholds"]) if measured.details.get("thresholds") else Thresholds()
    result = _judge(rows, pairs, world, ranks, peers, min_busbw, measured.details.get("crowded") or [],
                    facts=facts, hosts=hosts, thresholds=thresholds)
    return result + collapse(others)


def _crowding_finding(crowded: list[dict[str, Any]], looked_slow: int, blamed: bool) -> Finding:
    """One finding for all crowded hosts: the likely cause of any slowness, with the numbers.

    A warning when something looked slow (the crowding is then the likely cause, or sits beside a real
    culprit); otherwise a note on the pass: nothing was slow, so there is nothing to warn about.
    """
    parts = crowding_text(crowded)
    noted = (f"; {looked_slow} link{'s' if looked_slow != 1 else ''} looked slow, which on crowded cores "
             "measures the turn-taking, so no link is blamed") if looked_slow else ""
    ranks = sorted({r for e in crowded for r in e["ranks"]})
    status = WARN if looked_slow or blamed else PASS
    return Finding("bandwidth", status, f"{'; '.join(parts)}: the ranks take turns, so timings measure that "
                   f"contention, not the links{noted}", ranks,
                   "run at most one rank per core (or per GPU): fewer ranks (--nproc / torchrun "
                   "--nproc-per-node), or give each rank its own cores (taskset, numactl, srun --cpu-bind=cores) "
                   "and set OMP_NUM_THREADS to the cores per rank", {"crowded": crowded})


def _oversubscribed(entry: Mapping[str, Any]) -> bool:
    """More runnable work (our ranks and other processes' threads) than the cores it may run on."""
    return bool(entry["cores"]) and len(entry["ranks"]) + int(entry.get("others") or 0) > entry["cores"]


def crowding_text(crowded: list[dict[str, Any]]) -> list[str]:
    """'2 ranks and 3 runnable threads of other processes share 2 CPU cores on vm (affinity 0-1)', per host."""
    parts = []
    for entry in crowded:
        if _oversubscribed(entry):
            others = int(entry.get("others") or 0)
            also = (f" and {others} runnable thread{'s' if others != 1 else ''} of other processes (not this job's)"
                    if others else "")
            parts.append(f"{len(entry['ranks'])} ranks{also} share {entry['cores']} CPU core"
                         f"{'s' if entry['cores'] != 1 else ''} on {entry['host']} (affinity {entry['affinity']})")
        for device, on in entry["shared_gpus"].items():
            parts.append(f"ranks {format_rank_list(on)} share {device} on {entry['host']}")
    return parts


def _judge(typed: list[Row], pairs: list[PairResult], world: int, ranks: list[int],
           peers: Mapping[int, RankInfo], min_busbw: float | None,
           crowded: list[dict[str, Any]] | None = None, *, facts: Mapping[int, Mapping[str, Any]] | None = None,
           hosts: Mapping[int, str] | None = None, thresholds: Thresholds | None = None) -> list[Finding]:
    """The findings rank 0 reports from the combined numbers; with ``facts`` (every rank's link facts), each
    figure against what its path should give."""
    crowded = crowded or []
    avg = avg_busbw(typed) or 0.0
    largest = max(typed, key=lambda r: r.bytes)
    # busbw by size, e.g. "256 KiB 0.21, 1 MiB 0.40, 4 MiB 0.56": latency vs bandwidth at a glance.
    table = ", ".join(f"{human_bytes(r.bytes)} {r.busbw_gbps:.2f}" for r in typed)
    analysis = analyse_pairs(pairs)
    details: dict[str, Any] = {"rows": [r.to_json() for r in typed], "avg_busbw_gbps": avg, **analysis.to_json()}
    result: list[Finding] = []
    thresholds = thresholds or Thresholds()
    verdict: Verdict | None = None
    below: list[Finding] = []
    if facts is not None:
        placed = dict(hosts or {r: peers[r].host if r in peers else f"rank{r}" for r in ranks})
        assessment = assess({"all_reduce": typed}, pairs, facts, placed, thresholds, crowded)
        details["expected"] = assessment.to_json()
        verdict = assessment.per_op.get("all_reduce")
        below = _below_expected(verdict, assessment.pairs, thresholds, ranks, details)
    wrong = sum(r.wrong or 0 for r in typed)
    if wrong:
        result.append(Finding("bandwidth", FAIL, f"all_reduce returned {wrong} wrong values", ranks,
                              "data is corrupted in transit: check NCCL_PROTO/NCCL_ALGO overrides, NIC offloads "
                              "and GPU memory errors (ddpdoctor bench -c 1 shows at which sizes)", details))
    if min_busbw is not None and avg < min_busbw:
        network = ("find the slow part with `ddpdoctor bench --pairs`; with NCCL, run with NCCL_DEBUG=INFO and "
                   "check that NET/IB (not NET/Socket) and P2P are used")
        if crowded:
            # The number measured the turn-taking on shared cores: say so before any advice about the network.
            result.append(Finding("bandwidth", FAIL, f"all_reduce busbw {avg:.2f} GB/s is below --min-busbw "
                                  f"{min_busbw:g} GB/s while the cores were shared ({'; '.join(crowding_text(crowded))}"
                                  "): the number measures that contention as much as the links", ranks,
                                  "rerun when nothing else runs on those cores (or give the ranks their own cores); "
                                  "if it stays low then, " + network, {**details, "crowded": crowded}))
        else:
            result.append(Finding("bandwidth", FAIL, f"all_reduce busbw {avg:.2f} GB/s is below --min-busbw "
                                  f"{min_busbw:g} GB/s", ranks, network, details))
    by_host: dict[str, list[int]] = {}
    for p in pairs:
        by_host.setdefault(p.host_a, []).append(p.a)
        by_host.setdefault(p.host_b, []).append(p.b)
    repeated = (f" (best of {max(len(p.samples_gbps) for p in pairs)} measurements, "
                f"margin {analysis.margin:.1f}x)") if pairs and max(len(p.samples_gbps) for p in pairs) > 1 else ""
    for host in analysis.slow_hosts:
        on_host = sorted(r for r, info in peers.items() if info.host == host) or sorted(set(by_host[host]))
        result.append(Finding("bandwidth", WARN, f"host {host} is slow: its best link reaches "
                              f"{analysis.host_best_gbps[host]:.2f} GB/s, other hosts "
                              f"{analysis.typical_host_gbps():.2f} GB/s{repeated}", on_host,
                              f"check {host}'s NIC link speed (ethtool), cable and switch port, and that "
                              "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME name the fast interface there",
                              {"host": host, **analysis.to_json()}))
    for rank in analysis.slow_ranks:
        tag = f" {peers[rank].tag}" if rank in peers else ""
        result.append(Finding("bandwidth", WARN, f"rank {rank}{tag} is slow: its best link within its host "
                              f"reaches {analysis.rank_best_gbps[rank]:.2f} GB/s, the host's other ranks "
                              f"{analysis.typical_rank_gbps():.2f} GB/s{repeated}", [rank],
                              "that rank is throttled or crowded: check what else runs on its cores or GPU "
                              "(top, nvidia-smi), its CPU quota and affinity (taskset -p PID), its clocks; "
                              "with GPUs, whether it sits behind another PCIe switch/NUMA node "
                              "(`nvidia-smi topo -m`)", {"rank": rank, **analysis.to_json()}))
    # Within a crowded host a link's time is the scheduler's turn-taking, never a cable or a PCIe switch: such
    # a link is counted under the crowding finding, not blamed. (A rank slow on all its links is still named.)
    crowded_hosts = {str(e["host"]) for e in crowded if _oversubscribed(e)}
    not_judged = [p for p in analysis.slow_links if p.host_a == p.host_b and p.host_a in crowded_hosts]
    for p in analysis.slow_links:
        if p in not_judged:
            continue
        where = f"within host {p.host_a}" if p.host_a == p.host_b else f"between {p.host_a} and {p.host_b}"
        result.append(Finding("bandwidth", WARN, f"link rank {p.a} <-> rank {p.b} ({where}) is slow: "
                              f"{p.busbw_gbps:.2f} GB/s{repeated}", [p.a, p.b],
                              "a bad cable/switch port between hosts, or within a host a GPU on another "
                              "PCIe switch/NUMA node: compare `nvidia-smi topo -m`", p.to_json()))
    slowest = {r.slowest_rank for r in typed}
    # On crowded hosts which rank is slowest is the scheduler's choice; the repeated pair test decides instead.
    if (not crowded and world > 2 and len(slowest) == 1 and len(typed) > 1
            and largest.max_time_us > OUTLIER_RATIO * largest.time_us):
        rank = slowest.pop()
        tag = f" {peers[rank].tag}" if rank in peers else ""
        result.append(Finding("bandwidth", WARN, f"rank {rank}{tag} is the slowest at every size "
                              f"({largest.max_time_us:.0f} us vs {largest.time_us:.0f} us average at "
                              f"{human_bytes(largest.bytes)})", [rank],
                              "that rank's host or GPU is busy or throttled: check other processes on it "
                              "(nvidia-smi, top) and its clocks", {"rank": rank}))
    if crowded:
        looked_slow = len({(p.a, p.b) for p in pairs if p.suspect}
                          - {(p.a, p.b) for p in analysis.slow_links if p not in not_judged}
                          - {(p.a, p.b) for p in pairs if {p.a, p.b} & set(analysis.slow_ranks)
                             or {p.host_a, p.host_b} & set(analysis.slow_hosts)})
        blamed = any(f.status == WARN for f in result)
        result.append(_crowding_finding(crowded, looked_slow, blamed))
    result = below + result
    if not result or all(f.status in (WARN, PASS) for f in result):
        result.insert(0, Finding("bandwidth", PASS, f"all_reduce busbw {avg:.2f} GB/s over {world} ranks "
                                 f"({table} GB/s){_expected_note(verdict)}", ranks, details=details))
    return result


def _expected_note(v: Verdict | None) -> str:
    """What the pass line adds: '; 96 % of the 1.25 GB/s expected on ...', or why there is no expected figure."""
    if v is None:
        return ""
    if v.path.expected_gbps is None:
        return f"; no expected figure: no model for {v.path.description}"
    nominal = " (a virtual interface's nominal speed: not judged)" if v.status == "note" else ""
    return (f"; peak {v.measured_gbps:.3g} GB/s is {fmt_pct(v.pct)} % of the {v.path.expected_gbps:.3g} GB/s expected "
            f"on {v.path.description}{nominal}")


def _below_expected(v: Verdict | None, pairs: Mapping[tuple[int, int], Verdict], thresholds: Thresholds,
                    ranks: list[int], details: dict[str, Any]) -> list[Finding]:
    """A FAIL or WARN for the collective below its expectation, with its bottleneck; pairs below theirs get
    their own finding only when the collective is not already below (one cause, one finding)."""
    out: list[Finding] = []
    if v is not None and v.status in ("fail", "warn"):
        level = FAIL if v.status == "fail" else WARN
        text = failure_text(v, thresholds)
        if v.status == "warn":
            text = text.replace(f"below --min-busbw-pct {thresholds.fail_pct:g}",
                                f"below --warn-busbw-pct {thresholds.warn_pct:g}")
        out.append(Finding("bandwidth", level, f"all_reduce peak {text}", ranks, remedy(v.causes()),
                           {**details, "verdict": v.to_json()}))
        return out
    for (a, b), pv in sorted(pairs.items()):
        if pv.status in ("fail", "warn"):
            text = failure_text(pv, thresholds)
            if pv.status == "warn":
                text = text.replace(f"below --min-busbw-pct {thresholds.fail_pct:g}",
                                    f"below --warn-busbw-pct {thresholds.warn_pct:g}")
            out.append(Finding("bandwidth", FAIL if pv.status == "fail" else WARN,
                               f"link rank {a} <-> rank {b}: {text}", [a, b], remedy(pv.causes()),
                               {"verdict": pv.to_json()}))
    return out


CHECK = Check(id="bandwidth", title="Collective bandwidth and slow hosts/links",
              run=_run, combine=_combine, needs_process_group=True)
