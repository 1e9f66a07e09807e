"""The control plane at scale, without torch: thousands of simulated ranks against rank 0's real code.

Nothing here runs on a user's job. It exists because no test machine has hundreds of nodes, and the part
of ``check`` whose cost grows with the rank count is the control plane: every rank's hello, the plan,
every rank's findings, rank 0's collection with its deadline, naming the ranks that never reported, and
the report. :func:`simulate` runs exactly that:

- rank 0 is the real :class:`~ddpdoctor.check.runner.RankRun` (``rendezvous``, ``collect`` with the real
  ``combine`` functions of the ``barrier`` and ``connectivity`` checks, :func:`render_table`);
- the other ranks are simulated by a few worker threads, each standing in for a node agent hosting many
  ranks. They speak the same protocol as :mod:`ddpdoctor.check.runner`, key for key: ``hello/R``,
  ``claims/R``, ``claimant/R/N``, wait for ``plan``, ``progress/R``, ``result/R``, ``done/R``, with the
  findings the real checks produce on a healthy rank (same summaries and details);
- some ranks misbehave: ``dead`` never says hello (a rank that never started), ``late`` says hello after
  rank 0's rendezvous deadline, ``silent`` joins and then stops during the connectivity check (a rank
  that hangs or is OOM-killed), ``slow`` posts its findings a moment after the others.

The store is any object with c10d's ``set/get/add/check``; :class:`LocalStore` is an in-process one (a
dict under a lock) so the harness needs no torch and runs in a CI test. It measures the protocol and rank
0's work, not a TCPStore server's network throughput; ``benchmarks/check_scale.py --tcpstore`` runs the
same over a real TCPStore.
"""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.check.api import Check, CheckOptions
from ddpdoctor.check.model import Report
from ddpdoctor.check.report import render_table
from ddpdoctor.check.runner import RankRun, RunConfig
from ddpdoctor.findings import PASS, Finding, RankInfo
from ddpdoctor.ranks import rank_phrase
from ddpdoctor.runtime.control import ControlPlane
from ddpdoctor.runtime.launcher import LaunchInfo

BEHAVIOURS = ("ok", "dead", "late", "silent", "slow")
# The summaries the real checks write on a healthy rank (checks/barrier.py ARRIVED, checks/connectivity.py
# HEALTHY): rank 0's combine functions recognise them by these exact strings.
_ARRIVED = "arrived"
_HEALTHY = "collectives and ring send/recv correct"


class LocalStore:
    """An in-process key/value store with the c10d ``Store`` methods the control plane uses.

    Values are stored as bytes, like c10d's; ``get`` of a missing key raises (the control plane always
    ``check``s first).
    """

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.bytes_in = 0
        self.bytes_out = 0
        self.ops = 0

    def set(self, key: str, value: str | bytes) -> None:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        with self._lock:
            self._data[key] = raw
            self.bytes_in += len(key) + len(raw)
            self.ops += 1

    def get(self, key: str) -> bytes:
        with self._lock:
            self.ops += 1
            raw = self._data[key]
            self.bytes_out += len(raw)
            return raw

    def add(self, key: str, amount: int) -> int:
        with self._lock:
            self.ops += 1
            value = int(self._data.get(key, b"0")) + amount
            self._data[key] = str(value).encode()
            return value

    def check(self, keys: list[str]) -> bool:
        with self._lock:
            self.ops += 1
            return all(key in self._data for key in keys)


class _Prefixed:
    """c10d's PrefixStore, for the keys the runner writes under ``ddpdoctor/<run_id>/``."""

    def __init__(self, prefix: str, store: Any) -> None:
        self.prefix, self.store = prefix, store

    def set(self, key: str, value: str | bytes) -> None:
        self.store.set(self.prefix + key, value)

    def get(self, key: str) -> bytes:
        return bytes(self.store.get(self.prefix + key))

    def add(self, key: str, amount: int) -> int:
        return int(self.store.add(self.prefix + key, amount))

    def check(self, keys: list[str]) -> bool:
        return bool(self.store.check([self.prefix + k for k in keys]))


@dataclass
class ScaleResult:
    """What a simulated run measured, and the report rank 0 produced."""

    world_size: int
    bad: dict[int, str]
    report: Report
    text: str
    json_bytes: int
    plan_bytes: int
    rendezvous_s: float
    collect_s: float
    # collect_s minus the time spent waiting for ranks that never finish (the deadline): rank 0's own work.
    merge_s: float
    render_s: float
    peak_mib: float
    store_ops: int
    store_bytes_out: int
    lines: int = 0
    width: int = 0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "bad": {str(r): b for r, b in sorted(self.bad.items())},
                "status": self.report.status, "json_bytes": self.json_bytes, "plan_bytes": self.plan_bytes,
                "rendezvous_s": round(self.rendezvous_s, 3), "collect_s": round(self.collect_s, 3),
                "merge_s": round(self.merge_s, 3), "render_s": round(self.render_s, 3),
                "peak_mib": round(self.peak_mib, 1), "store_ops": self.store_ops,
                "store_bytes_out": self.store_bytes_out, "lines": self.lines, "width": self.width}


def _host_of(rank: int, ranks_per_host: int) -> tuple[str, int]:
    return f"node{rank // ranks_per_host:04d}", rank % ranks_per_host


def _rank_findings(rank: int, expected: int, missing: list[int]) -> dict[str, list[dict[str, Any]]]:
    """What the real barrier and connectivity checks post on a healthy rank (their finding shapes)."""
    if missing:
        barrier = Finding("", "fail", f"barrier: {rank_phrase(missing)} did not arrive",
                          [rank], "see which ranks did not arrive below; they are stuck or dead",
                          {"missing": missing})
    else:
        barrier = Finding("", PASS, _ARRIVED, [rank], "", {"waited_ms": 1.0 + rank % 7, "expected": expected})
    connectivity = Finding("", PASS, _HEALTHY, [rank], "",
                           {"barrier_us": 80.0, "all_reduce_us": 120.0 + rank % 13, "broadcast_us": 90.0,
                            "all_gather_us": 150.0, "ring_us": 70.0})
    out: dict[str, list[dict[str, Any]]] = {}
    for check, finding in (("barrier", barrier), ("connectivity", connectivity)):
        finding.check = check
        out[check] = [finding.to_json()]
    return out


def _worker(store: Any, ranks: list[int], bad: Mapping[int, str], world_size: int, ranks_per_host: int,
            timeout_s: float, start: float, errors: list[str]) -> None:
    """One node agent's worth of simulated ranks, speaking the runner's protocol key for key."""
    try:
        control = ControlPlane(store)
        pid_base = 100_000
        joining = [r for r in ranks if bad.get(r) not in ("dead", "late")]
        for rank in joining:
            host, local = _host_of(rank, ranks_per_host)
            me = RankInfo(rank, local, host, pid_base + rank).to_json()
            control.put(f"hello/{rank}", me)
            claim = control.add(f"claims/{rank}", 1)
            control.put(f"claimant/{rank}/{claim}", me)
        late = [r for r in ranks if bad.get(r) == "late"]
        if late:
            time.sleep(max(0.0, start + timeout_s + 0.2 - time.monotonic()))
            for rank in late:
                host, local = _host_of(rank, ranks_per_host)
                control.put(f"hello/{rank}", RankInfo(rank, local, host, pid_base + rank).to_json())
        plan = control.wait_get("plan", start + 2 * timeout_s + 5)
        if plan is None:
            errors.append(f"ranks {ranks[0]}-{ranks[-1]}: no plan")
            return
        joined = set(plan["joined"])
        silent = sorted(r for r, b in bad.items() if b == "silent" and r in joined)
        slow = [r for r in ranks if bad.get(r) == "slow" and r in joined]
        for rank in (r for r in ranks if r in joined and r not in slow):
            control.put(f"progress/{rank}", "connectivity")
            if rank in silent:
                continue  # it stops here: no result, no done
            result = {"info": RankInfo(rank, _host_of(rank, ranks_per_host)[1],
                                       _host_of(rank, ranks_per_host)[0], pid_base + rank).to_json(),
                      "backend": "gloo", "checks": _rank_findings(rank, len(joined), silent), "runtime": [],
                      "phases": {"check:barrier": 0.01, "check:connectivity": 0.02}}
            control.put(f"result/{rank}", result)
            control.put(f"progress/{rank}", "done")
            control.put(f"done/{rank}", True)
        if slow:
            time.sleep(timeout_s / 4)
            for rank in slow:
                host, local = _host_of(rank, ranks_per_host)
                control.put(f"result/{rank}", {"info": RankInfo(rank, local, host, pid_base + rank).to_json(),
                                               "backend": "gloo", "checks": _rank_findings(rank, len(joined), silent),
                                               "runtime": []})
                control.put(f"done/{rank}", True)
    except Exception as exc:  # reported by simulate(): a broken worker must not look like a silent rank
        errors.append(f"worker for ranks {ranks[0]}-{ranks[-1]}: {type(exc).__name__}: {exc}")


def simulate(world_size: int, checks: Sequence[Check], bad: Mapping[int, str] | None = None, *,
             timeout_s: float = 2.0,
             ranks_per_host: int = 8, workers: int = 16, store: Any = None,
             measure_memory: bool = True) -> ScaleResult:
    """Run rank 0's real rendezvous, collection and report against ``world_size - 1`` simulated ranks.

    ``checks`` are the real ``barrier`` and ``connectivity`` checks (``ddpdoctor.checks``; passed in because
    the engine sits below the checks): rank 0 merges with their ``combine``. ``bad`` maps ranks (not 0)
    to one of :data:`BEHAVIOURS`. Every wait has a deadline derived from
    ``timeout_s`` (as ``--timeout`` in a real run), so a run with silent ranks takes about 2 x timeout_s.
    """
    bad = dict(bad or {})
    for rank, behaviour in bad.items():
        if behaviour not in BEHAVIOURS or not 0 < rank < world_size:
            raise ValueError(f"bad rank {rank}: {behaviour!r} (ranks 1..{world_size - 1}, one of {BEHAVIOURS})")
    raw = store if store is not None else LocalStore()
    run_id = "sim"
    info = LaunchInfo("torchrun", 0, world_size, 0, ranks_per_host, "127.0.0.1", 0, True, run_id)
    if sorted(c.id for c in checks) != ["barrier", "connectivity"]:
        raise ValueError("simulate() posts the findings of the barrier and connectivity checks: pass those two")
    config = RunConfig(checks=list(checks), backend="gloo",
                       options=CheckOptions(timeout_s=timeout_s), process_group=False, show_waits=False)
    run = RankRun(info, config)
    run.started_epoch = time.time()  # this process is rank 0: the user's command starts here
    run.me = RankInfo(0, 0, _host_of(0, ranks_per_host)[0], 100_000)
    run.control = ControlPlane(_Prefixed(f"ddpdoctor/{run_id}/", raw))
    errors: list[str] = []
    others = list(range(1, world_size))
    chunks = [others[i::workers] for i in range(workers) if others[i::workers]]
    threads = [threading.Thread(target=_worker, daemon=True, name=f"sim-{i}",
                                args=(run.control.store, sorted(chunk), bad, world_size, ranks_per_host,
                                      timeout_s, run.start, errors))
               for i, chunk in enumerate(chunks)]
    for thread in threads:
        thread.start()
    t0 = time.monotonic()
    plan = run.rendezvous()
    rendezvous_s = time.monotonic() - t0
    assert plan is not None
    plan_bytes = len(json.dumps(plan))
    # Rank 0's own findings, as a healthy rank 0 posts them.
    silent = sorted(r for r, b in bad.items() if b == "silent")
    run.check_findings = {cid: [Finding.from_json(f) for f in fs]
                          for cid, fs in _rank_findings(0, len(plan["joined"]), silent).items()}
    run.control.put("progress/0", "done")
    run.post()
    # On a real cluster the ranks post from their own machines while rank 0 collects. Here they share
    # this process's CPU and GIL, so they finish posting first: the collection then times rank 0's own
    # work, plus the deadline it waits for the silent ranks.
    for thread in threads:
        thread.join(timeout=2 * timeout_s + 10)
    if measure_memory:
        tracemalloc.start()
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    report = run.collect(deadline)
    collect_s = time.monotonic() - t0
    t1 = time.monotonic()
    text = render_table(report)
    render_s = time.monotonic() - t1
    json_bytes = len(json.dumps(report.to_json()))
    peak = 0.0
    if measure_memory:
        peak = tracemalloc.get_traced_memory()[1] / (1 << 20)
        tracemalloc.stop()
    waited = timeout_s if any(b == "silent" for b in bad.values()) else 0.0
    lines = text.splitlines()
    stats = raw if isinstance(raw, LocalStore) else None
    return ScaleResult(world_size, bad, report, text, json_bytes, plan_bytes, rendezvous_s, collect_s,
                       max(0.0, collect_s - waited), render_s, peak, stats.ops if stats else 0,
                       stats.bytes_out if stats else 0, len(lines), max((len(line) for line in lines), default=0),
                       errors)
