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

import time
from collections.abc import Mapping

from ddpdoctor.check import Check, CheckContext, all_findings, collapse
from ddpdoctor.findings import FAIL, PASS, Finding, RankInfo
from ddpdoctor.ranks import rank_phrase
from ddpdoctor.runtime.control import ControlPlane

ARRIVED = "arrived"


def _run(ctx: CheckContext) -> list[Finding]:
    # Only the ranks that joined the rendezvous are expected: ranks that never joined are already
    # reported by the runtime, and waiting for them here would only burn the deadline a second time.
    expected = sorted(ctx.peers) if ctx.peers else list(range(ctx.world_size))
    arrived_at = time.monotonic()
    ctx.store.set(f"arrived/{ctx.rank}", "1")
    # A deadline shorter than the check's own leaves time to write the finding before the runtime gives up.
    deadline = arrived_at + max(0.1, ctx.remaining_s() * 0.8)
    keys = [f"arrived/{r}" for r in expected]
    present = ControlPlane(ctx.store).wait_keys(keys, deadline)
    # How long this rank waited for the last one: host clocks need not agree, durations do.
    waited_ms = round((time.monotonic() - arrived_at) * 1000, 1)
    missing = [r for r, key in zip(expected, keys, strict=True) if key not in present]
    if missing:
        return [ctx.finding(FAIL, f"barrier: {rank_phrase(missing)} "
                            "did not arrive", "see which ranks did not arrive below; they are stuck or dead",
                            missing=missing)]
    return [ctx.finding(PASS, ARRIVED, waited_ms=waited_ms, expected=len(expected))]


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    findings = all_findings(findings_by_rank)
    arrived = [f for f in findings if f.summary == ARRIVED]
    late = [f for f in findings if f.summary != ARRIVED]
    result: list[Finding] = []
    missing = sorted({r for f in late for r in f.details.get("missing", [])})
    if missing:
        named = ", ".join(
            f"rank {r} {peers[r].tag} pid {peers[r].pid}" if r in peers else f"rank {r}" for r in missing[:4])
        if len(missing) > 4:  # one screen at scale: the JSON's ranks list has them all
            named = f"{len(missing)} ranks ({named}, ...)"
        result.append(Finding("barrier", FAIL, f"{named} did not reach the barrier in time", missing,
                              "find what those ranks are doing: `ddpdoctor stacks` on their hosts "
                              "(data loading, a filesystem call, a crash in the training script)",
                              {"waiting": sorted(r for f in late for r in f.ranks)}))
    elif arrived:
        # The first rank to arrive waited longest (the skew); the one that waited least came last.
        skew = max(float(f.details["waited_ms"]) for f in arrived)
        last = min(arrived, key=lambda f: float(f.details["waited_ms"])).ranks[0]
        result.append(Finding("barrier", PASS, f"all {arrived[0].details['expected']} ranks arrived; skew "
                              f"{skew:.1f} ms (last: rank {last})", sorted(r for f in arrived for r in f.ranks),
                              details={"skew_ms": skew, "waited_ms": {str(f.ranks[0]): f.details["waited_ms"]
                                                                       for f in arrived}}))
    return result + collapse([f for f in late if not f.details.get("missing")])


CHECK = Check(id="barrier", title="Every rank arrives within the deadline", run=_run, combine=_combine)
