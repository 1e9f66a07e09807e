"""`env`: the environment every rank runs in, compared across ranks.

What fails in real life: one node exports ``NCCL_SOCKET_IFNAME=eth0`` while the others have ``ib0``; a
rank runs another torch version from a stale venv; ``NCCL_SOCKET_IFNAME`` names an interface the host does
not have; ``/dev/shm`` is Docker's 64 MB. How it shows up: NCCL hangs at the first collective, or
``NCCL WARN Bootstrap : no socket interface found``, ``ncclSystemError: ... unhandled system error``,
``Error while creating shared memory segment``; old ``NCCL_ASYNC_ERROR_HANDLING`` prints a deprecation
warning and will stop working.
Reproduce by hand: ``NCCL_SOCKET_IFNAME=nosuch0 ddpdoctor check --only env``, or under torchrun give one
rank a different value of any ``NCCL_*`` variable.

On NCCL it also warns when an NCCL timeout would leave no Flight Recorder dump (``ddpdoctor fr`` has
nothing to read then): the recorder off (``TORCH_FR_BUFFER_SIZE`` / ``TORCH_NCCL_TRACE_BUFFER_SIZE`` 0, or
unset before torch 2.7) or no dump on timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT`` 0, or unset before 2.7).
Reproduce: ``TORCH_NCCL_DUMP_ON_TIMEOUT=0 ddpdoctor check --only env`` on a GPU machine.

It also measures each rank's wall clock against rank 0's (a host without NTP, a VM restored from a
snapshot): training does not notice -- PyTorch's timeouts run on monotonic clocks (``WorkNCCL::checkTimeout``
in torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp compares ``std::chrono::steady_clock`` times), as do
ddpdoctor's deadlines and durations -- but every wall-clock stamp does: log lines, ``time_created_ns`` in Flight Recorder dumps
(``c10::getTime()``, CLOCK_REALTIME unless asked for a monotonic one: c10/util/ApproximateClock.h), the
ranks' own "ended at" stamps. Merged across hosts they put events in the wrong order. Reproduce: run one
node's ranks under libfaketime (``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1
FAKETIME=+90s``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping
from typing import Any

from ddpdoctor.check import Check, CheckContext, all_findings, collapse
from ddpdoctor.env import facts as envinfo
from ddpdoctor.findings import FAIL, PASS, WARN, Finding, RankInfo
from ddpdoctor.ranks import rank_phrase

FACTS = "environment collected"

# Variables that legitimately differ per rank: per-task GPU binding (SLURM --gpus-per-task sets a
# different CUDA_VISIBLE_DEVICES on every rank; the gpu check verifies no two ranks share a GPU) and
# per-host thread pools. Telling users to make them equal would break working jobs.
PER_RANK_OK = {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}

# Logging and cache locations: different values change what is printed or where files go, not how ranks
# talk to each other.
INFORMATIONAL = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "TORCH_CPP_LOG_LEVEL",
                 "TORCH_SHOW_CPP_STACKTRACES", "TORCH_HOME", "TORCH_EXTENSIONS_DIR", "TORCH_LOGS"}

# Interface names are per host: a cluster whose nodes name their NICs differently sets different values
# on purpose. Within one host they must agree; across hosts a difference is only worth a look.
PER_HOST = {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}


# A clock further than this from rank 0's is reported. chrony's shipped configuration steps a clock that is
# more than 1 s off at start rather than slewing it (Debian's chrony 4.3, /usr/share/chrony/chrony.conf:
# ``makestep 1 3``): a host still beyond that is not being kept in time, and logs stamped to the second no
# longer line up between it and the others.
CLOCK_WARN_S = 1.0
CLOCK_ROUNDS = 3  # exchanges per rank; the one with the shortest round trip is kept (the tightest bound)
CLOCK_SERVE_S = 5.0  # rank 0 answers for this long at most (the ranks start the check within moments)
CLOCK_ASK_S = 10.0  # a rank waits this long at most for rank 0's answer (rank 0 may start the check later)
CLOCK_POLL_S = 0.002


def _run(ctx: CheckContext) -> list[Finding]:
    variables = envinfo.watched_env()
    clock = measure_clock(ctx)
    findings = [ctx.finding(PASS, FACTS, vars=variables, versions=envinfo.versions(),
                            world_size=ctx.world_size, local_world_size=ctx.local_world_size, host=ctx.host,
                            clock=clock)]
    names = envinfo.usable_interfaces()
    multi_host = len({peer.host for peer in ctx.peers.values()}) > 1
    for var, problem_of in (("NCCL_SOCKET_IFNAME", envinfo.nccl_ifname_problem),
                            ("GLOO_SOCKET_IFNAME", envinfo.gloo_ifname_problem)):
        if var in variables:
            problem = problem_of(variables[var], names)
            if not problem and multi_host and variables[var].strip() in ("lo", "=lo"):
                problem = "selects only the loopback interface, which cannot reach the other hosts"
            if problem:
                findings.append(ctx.finding(
                    FAIL, f"{var}={variables[var]} {problem}",
                    f"set {var} to an interface this host has (see `ip -br addr` on {ctx.host}), "
                    "or unset it to let the library choose", kind=var.lower(), variable=var))
    for old, new in envinfo.DEPRECATED_VARS.items():
        if old in variables:
            findings.append(ctx.finding(WARN, f"{old} is deprecated", f"use {new}={variables[old]} instead"))
    if ctx.backend == "nccl":
        import torch

        problem = flight_recorder_problem(os.environ, str(torch.__version__))
        if problem is not None:
            findings.append(ctx.finding(WARN, problem, FR_REMEDY))
    shm = envinfo.shm_bytes()
    if shm is not None and shm < envinfo.MIN_SHM_BYTES and ctx.backend == "nccl" and ctx.local_world_size > 1:
        findings.append(ctx.finding(
            WARN, f"/dev/shm is only {shm // (1 << 20)} MiB",
            "NCCL needs shared memory between local ranks: run the container with --shm-size=8g "
            "(or --ipc=host), or mount a larger /dev/shm", shm_bytes=shm))
    return findings


def measure_clock(ctx: CheckContext) -> dict[str, float] | None:
    """This rank's wall-clock offset from rank 0's (seconds, + = ahead), with its error bound; None on rank 0
    or when rank 0 did not answer in time.

    An exchange through the check's store: the rank posts its wall clock ``t1``; rank 0, seeing it, answers
    with its own ``t2``; the rank reads the answer at ``t3``. Rank 0's ``t2`` was taken between the two in
    real time, so the offset lies within ``[t1 - t2, t3 - t2]``: its middle is reported and half the round
    trip is the bound (however slowly rank 0 polled). Rank 0 serves every joined rank at once.
    """
    store = ctx.store
    if ctx.rank == 0:
        _serve_clock(store, [r for r in ctx.peers if r != 0], time.monotonic() + min(CLOCK_SERVE_S, ctx.remaining_s()))
        return None
    best: dict[str, float] | None = None
    give_up = time.monotonic() + min(CLOCK_ASK_S, max(0.0, ctx.remaining_s() - 1.0))
    for attempt in range(CLOCK_ROUNDS):
        answer = f"clock/answer/{ctx.rank}/{attempt}"
        began, t1 = time.monotonic(), time.time()
        store.set(f"clock/ask/{ctx.rank}/{attempt}", repr(t1))
        while not store.check([answer]):
            if store.check(["clock/closed"]) or time.monotonic() > give_up:
                return best
            time.sleep(CLOCK_POLL_S)
        rtt = time.monotonic() - began
        t2 = float(store.get(answer))
        offset = t1 + rtt / 2 - t2
        if best is None or rtt / 2 < best["error_s"]:
            best = {"offset_s": round(offset, 4), "error_s": round(rtt / 2, 4)}
    return best


def _serve_clock(store: Any, ranks: list[int], until: float) -> None:
    """Rank 0's side of :func:`measure_clock`: answer each rank's asks with this clock until ``until``."""
    next_ask = {rank: 0 for rank in ranks}
    try:
        while next_ask and time.monotonic() < until:
            answered = False
            for rank, attempt in list(next_ask.items()):
                if store.check([f"clock/ask/{rank}/{attempt}"]):
                    store.set(f"clock/answer/{rank}/{attempt}", repr(time.time()))
                    answered = True
                    if attempt + 1 >= CLOCK_ROUNDS:
                        del next_ask[rank]
                    else:
                        next_ask[rank] = attempt + 1
            if not answered:
                time.sleep(CLOCK_POLL_S)
    finally:
        store.set("clock/closed", "1")  # a rank that comes later stops waiting at once


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def clock_offsets(facts: Mapping[int, Mapping[str, Any]]) -> tuple[str, dict[str, float], dict[str, float]]:
    """Rank 0's host, and per host the median offset of its measured ranks against it and the tightest bound."""
    reference = str(facts[min(facts)].get("host", "")) if facts else ""
    by_host: dict[str, list[dict[str, float]]] = {}
    for _rank, details in sorted(facts.items()):
        clock = details.get("clock")
        if isinstance(clock, dict) and "offset_s" in clock:
            by_host.setdefault(str(details.get("host", "")), []).append(clock)
    offsets = {host: round(statistics.median(c["offset_s"] for c in clocks), 3) for host, clocks in by_host.items()}
    errors = {host: round(min(c["error_s"] for c in clocks), 3) for host, clocks in by_host.items()}
    return reference, offsets, errors


def clock_finding(facts: Mapping[int, Mapping[str, Any]]) -> Finding | None:
    """WARN naming each host whose clock is more than :data:`CLOCK_WARN_S` from rank 0's host's (beyond the
    measurement's own error bound), or None. One finding: the cause (clocks not kept in time) is one."""
    reference, offsets, errors = clock_offsets(facts)
    off = {host: value for host, value in offsets.items()
           if abs(value) - errors[host] > CLOCK_WARN_S and host != reference}
    if not off:
        return None
    ranks = sorted(r for r, d in facts.items() if str(d.get("host", "")) in off)
    parts = [f"{host}: clock {_seconds(abs(value))} {'ahead of' if value > 0 else 'behind'} {reference}"
             for host, value in sorted(off.items())]
    hosts = ", ".join(sorted(off))
    return Finding(
        "env", WARN, "; ".join(parts) + " (rank 0's host)", ranks,
        f"run chrony or ntpd on {hosts} (`chronyc tracking` shows the offset); training is unaffected "
        "(timeouts use monotonic clocks) but logs and Flight Recorder times do not line up across hosts",
        {"kind": "clock_offset", "reference_host": reference, "offsets_s": offsets, "error_s": errors,
         "threshold_s": CLOCK_WARN_S})


# Both on by default since torch 2.7 (pytorch/pytorch#143446: dumps on timeout or exception without opt-in,
# buffer 2000 entries); before that the buffer defaulted to 0 and TORCH_NCCL_DUMP_ON_TIMEOUT to false.
FR_DEFAULT_ON_SINCE = (2, 7)
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # FlightRecorder.hpp reads both
FR_REMEDY = ("export TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 on every rank (and "
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/shared/fr/nccl_trace_rank_ to collect the dumps in one folder); "
             "after a timeout, `ddpdoctor fr /shared/fr` names the rank that diverged")


def _torch_at_least(version: str, wanted: tuple[int, int]) -> bool:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= wanted


def flight_recorder_problem(env: Mapping[str, str], torch_version: str) -> str | None:
    """Why an NCCL timeout would leave no Flight Recorder dump, or None when it would leave one."""
    default_on = _torch_at_least(torch_version, FR_DEFAULT_ON_SINCE)
    buffer_var = next((v for v in FR_BUFFER_VARS if env.get(v, "").strip()), None)
    if buffer_var is not None:
        text = env[buffer_var].strip()
        if not text.isdigit() or int(text) <= 0:
            return f"Flight Recorder off ({buffer_var}={text}): an NCCL timeout leaves no record of the collectives"
    elif not default_on:
        return (f"Flight Recorder off (TORCH_FR_BUFFER_SIZE unset; torch {torch_version} defaults to 0): an NCCL "
                "timeout leaves no record of the collectives")
    dump = env.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "").strip().lower()
    if dump in ("0", "false", "no", "off") or (not dump and not default_on):
        shown = f"TORCH_NCCL_DUMP_ON_TIMEOUT={env['TORCH_NCCL_DUMP_ON_TIMEOUT']}" if dump else \
            f"TORCH_NCCL_DUMP_ON_TIMEOUT unset; torch {torch_version} defaults to off"
        return f"no Flight Recorder dump on an NCCL timeout ({shown})"
    return None


def _holders(values_by_rank: Mapping[int, object]) -> dict[str, list[int]]:
    holders: dict[str, list[int]] = {}
    for rank, value in sorted(values_by_rank.items()):
        holders.setdefault(repr(value) if value is not None else "(unset)", []).append(rank)
    return holders


def _differences(label: str, values_by_rank: Mapping[int, object],
                 hosts: Mapping[int, str] | None = None) -> str | None:
    """'X differs across ranks: 'a' on ranks 0-2; 'b' on rank 3' when values differ, else None. With
    ``hosts`` and ranks on several hosts, each value names its hosts too: 'b' on rank 3 (nodeb)."""
    holders = _holders(values_by_rank)
    if len(holders) <= 1:
        return None
    several = hosts is not None and len({hosts.get(r, "") for r in values_by_rank}) > 1

    def where(ranks: list[int]) -> str:
        if not several or hosts is None:
            return rank_phrase(ranks)
        names = sorted({hosts.get(r, "") or "?" for r in ranks})
        return f"{rank_phrase(ranks)} ({', '.join(names)})"

    parts = [f"{value} on {where(r)}"
             for value, r in sorted(holders.items(), key=lambda item: (-len(item[1]), item[1][0]))]
    return f"{label} differs across ranks: " + "; ".join(parts)


def _outliers(values_by_rank: Mapping[int, object]) -> list[int]:
    """Ranks whose value differs from the lowest rank's (rank 0's when it reported): the reference."""
    reference = values_by_rank[min(values_by_rank)]
    return sorted(r for r, v in values_by_rank.items() if v != reference)


def _variable_finding(name: str, values: Mapping[int, object], hosts: Mapping[int, str]) -> Finding | None:
    message = _differences(name, values)
    if message is None or name in INFORMATIONAL or name in PER_RANK_OK:
        return None
    status = FAIL
    remedy = (f"export the same {name} on every rank (set it in the launch script, not per node)")
    if name in PER_HOST:
        differs_within_a_host = any(
            len({values[r] for r in values if hosts.get(r) == host}) > 1 for host in set(hosts.values()))
        if not differs_within_a_host:
            status = WARN
            remedy = (f"fine if the hosts name their NICs differently; otherwise export the same {name} "
                      "everywhere (a wrong NIC on one host hangs the first collective)")
    return Finding("env", status, message, _outliers(values), remedy,
                   {"variable": name, "values": {str(r): v for r, v in values.items()}})


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    facts = {f.ranks[0]: f.details for f in all_findings(findings_by_rank) if f.summary == FACTS}
    others = [f for f in all_findings(findings_by_rank) if f.summary != FACTS]
    result: list[Finding] = []
    if facts:
        hosts = {r: str(d.get("host", "")) for r, d in facts.items()}
        all_vars = sorted({name for d in facts.values() for name in d["vars"]})
        for name in all_vars:
            finding = _variable_finding(name, {r: d["vars"].get(name) for r, d in facts.items()}, hosts)
            if finding is not None:
                result.append(finding)
        clock = clock_finding(facts)
        if clock is not None:
            result.append(clock)
        for key in ("torch", "python", "cuda", "nccl"):
            values = {r: d["versions"].get(key) for r, d in facts.items()}
            message = _differences(f"{key} version", values, hosts)
            if message:
                outliers = _outliers(values)
                on = sorted({hosts[r] for r in outliers if hosts.get(r)})
                there = (f": on {', '.join(on)}, check which interpreter and environment the launch starts "
                         "(`which python` there; a stale venv?)") if on else ""
                result.append(Finding(
                    "env", FAIL, message, outliers,
                    f"install the same {key} version on every node (same container image or venv){there}",
                    {"kind": "version_mismatch", "component": key, "values": {str(r): v for r, v in values.items()},
                     "by_host": {h: sorted({str(values[r]) for r in values if hosts.get(r) == h})
                                 for h in sorted(set(hosts.values()))}}))
        sizes = {r: d["world_size"] for r, d in facts.items()}
        message = _differences("WORLD_SIZE", sizes)
        if message:
            result.append(Finding("env", FAIL, message, _outliers(sizes), "launch every node with the same world size"))
        if not result and not [f for f in others if f.status != PASS]:
            versions = next(iter(facts.values()))["versions"]
            allowed = [name for name in all_vars
                       if len({repr(d["vars"].get(name)) for d in facts.values()}) > 1]
            note = f"; {', '.join(allowed)} differ per rank, as allowed" if allowed else ""
            result.append(Finding(
                "env", PASS, f"{len(all_vars)} watched variables and versions agree "
                f"(torch {versions.get('torch')}, python {versions.get('python')}){note}", sorted(facts),
                details={"vars": next(iter(facts.values()))["vars"], "versions": versions,
                         "clock_offsets_s": clock_offsets(facts)[1]}))
    return result + collapse(others)


CHECK = Check(id="env", title="Environment and versions consistent across ranks", run=_run, combine=_combine)
