"""`barrier`: every rank arrives within the deadline; the ones that do not are named with host and pid.

What fails in real life: one rank is still loading data, stuck in a filesystem call, or dead, and the
others wait in ``barrier()``/the first all_reduce until NCCL's watchdog fires after 10-30 minutes
(``Watchdog caught collective operation timeout``) or gloo says ``Timed out waiting 1800000ms``. This is
``monitored_barrier``'s idea, but on the control plane (the c10d store), so it works for any backend and
even when the process group under test is broken.
Reproduce by hand: under torchrun, make one rank ``sleep 600`` instead of running ddpdoctor; the report
names it (the runtime records ranks that never joined or never reported under this check id too).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

from ddpdoctor.check_api import Check, CheckContext, all_findings, collapse, format_rank_list
from ddpdoctor.findings import FAIL, PASS, Finding, RankInfo

ARRIVED = "arrived"
POLL_S = 0.02


def _run(ctx: CheckContext) -> list[Finding]:
    ctx.store.set(f"arrived/{ctx.rank}", json.dumps({"t": time.time()}))
    ctx.store.add("count", 1)
    # A deadline shorter than the check's own leaves time to write the finding before the runtime gives up.
    deadline = time.monotonic() + max(0.1, ctx.remaining_s() * 0.8)
    while int(ctx.store.add("count", 0)) < ctx.world_size and time.monotonic() < deadline:
        time.sleep(POLL_S)
    keys = [f"arrived/{r}" for r in range(ctx.world_size)]
    present = [r for r, key in enumerate(keys) if ctx.store.check([key])]
    missing = [r for r in range(ctx.world_size) if r not in present]
    if missing:
        return [ctx.finding(FAIL, f"barrier: rank{'s' if len(missing) > 1 else ''} {format_rank_list(missing)} "
                            "did not arrive", "see which ranks did not arrive below; they are stuck or dead",
                            missing=missing)]
    times = [json.loads(ctx.store.get(key))["t"] for key in keys]
    return [ctx.finding(PASS, ARRIVED, skew_ms=round((max(times) - min(times)) * 1000, 1), world_size=ctx.world_size,
                        last=int(max(range(len(times)), key=lambda r: times[r])))]


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    findings = all_findings(findings_by_rank)
    arrived = [f for f in findings if f.summary == ARRIVED]
    late = [f for f in findings if f.summary != ARRIVED]
    result: list[Finding] = []
    missing = sorted({r for f in late for r in f.details.get("missing", [])})
    if missing:
        named = ", ".join(
            f"rank {r} {peers[r].tag} pid {peers[r].pid}" if r in peers else f"rank {r}" for r in missing)
        result.append(Finding("barrier", FAIL, f"{named} did not reach the barrier in time", missing,
                              "find what those ranks are doing: `ddpdoctor stacks` on their hosts "
                              "(data loading, a filesystem call, a crash in the training script)",
                              {"waiting": sorted(r for f in late for r in f.ranks)}))
    elif arrived:
        skew = max(float(f.details["skew_ms"]) for f in arrived)
        result.append(Finding("barrier", PASS, f"all {arrived[0].details['world_size']} ranks arrived; skew {skew:.1f} ms "
                              f"(last: rank {arrived[0].details['last']})", sorted(r for f in arrived for r in f.ranks),
                              details={"skew_ms": skew}))
    return result + collapse([f for f in late if not f.details.get("missing")])


CHECK = Check(id="barrier", title="Every rank arrives within the deadline", run=_run, combine=_combine)
