"""`ddpdoctor bench --pairs` and the bandwidth check's link test: which pairs of ranks exchange in which round, and
which hosts, ranks and links the measured pairs show to be slow, by a margin the run's own noise justifies.

Pure (no torch at import); the exchanges run in :mod:`ddpdoctor.bench.measure`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A host (or link) is "slow" when it reaches less than this fraction of what the others reach.
SLOW_FRACTION = 0.5


def round_robin(items: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair once (the circle method): n-1 rounds, n/2 at a time.

    Running disjoint pairs together keeps the test to n-1 rounds instead of n(n-1)/2 steps, and no link
    carries two pairs at once.
    """
    players: list[int | None] = list(items)
    if len(players) < 2:
        return []
    if len(players) % 2:
        players.append(None)
    n = len(players)
    rounds: list[list[tuple[int, int]]] = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = players[i], players[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(pairs)
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


# Up to this many hosts every pair of hosts is tested (h-1 rounds); beyond, the stride plan (log2 h rounds).
ALL_PAIRS_MAX_HOSTS = 16


def stride_rounds(items: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Recursive-doubling rounds: in round k, the item at position i meets the one at i XOR 2^k.

    ceil(log2 n) rounds of disjoint pairs; every item is in a pair in at least one round (its highest set
    bit's round pairs it below n), and each item meets up to log2 n partners at distances 1, 2, 4, ...
    This is the partner pattern of recursive halving/doubling collectives: a slow endpoint (a throttled
    rank, a host whose NIC negotiated a low speed) shows in every one of its rounds, so it is told apart
    from a single bad link after ceil(log2 n) rounds instead of n - 1.
    """
    n = len(items)
    rounds: list[list[tuple[int, int]]] = []
    bit = 1
    while bit < n:
        pairs = []
        for i in range(n):
            j = i ^ bit
            if i < j < n:
                a, b = items[i], items[j]
                pairs.append((min(a, b), max(a, b)))
        rounds.append(pairs)
        bit <<= 1
    return rounds


def pair_schedule(hosts: Mapping[int, str],
                  all_pairs_max_hosts: int = ALL_PAIRS_MAX_HOSTS) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint rank pairs: first between hosts (their lowest ranks), then within each host.

    Between hosts: every pair of hosts (round robin, h - 1 rounds) while there are at most
    ``all_pairs_max_hosts``, else the stride plan (ceil(log2 h) rounds). Within a host: the stride plan
    over its ranks (ceil(log2 d) rounds for d ranks per host), all hosts in the same rounds. So the whole
    plan is O(log n) rounds at scale, each with at most n / 2 concurrent pairs: O(n log n) measurements.
    """
    by_host: dict[str, list[int]] = {}
    for rank in sorted(hosts):
        by_host.setdefault(hosts[rank], []).append(rank)
    leaders = [ranks[0] for ranks in by_host.values()]
    rounds = round_robin(leaders) if len(leaders) <= all_pairs_max_hosts else stride_rounds(leaders)
    per_host = [stride_rounds(ranks) for ranks in by_host.values()]
    depth = max((len(r) for r in per_host), default=0)
    for k in range(depth):
        step = [pair for host_rounds in per_host if k < len(host_rounds) for pair in host_rounds[k]]
        if step:
            rounds.append(step)
    return rounds


def plan_round_count(n_hosts: int, ranks_per_host: int, all_pairs_max_hosts: int = ALL_PAIRS_MAX_HOSTS) -> int:
    """Rounds of :func:`pair_schedule` for a regular layout (documented in docs/internals/check-runtime.md)."""
    between = (n_hosts - 1 if n_hosts <= all_pairs_max_hosts else (n_hosts - 1).bit_length()) if n_hosts > 1 else 0
    within = (ranks_per_host - 1).bit_length() if ranks_per_host > 1 else 0
    return between + within


@dataclass
class PairResult:
    a: int
    b: int
    host_a: str
    host_b: str
    busbw_gbps: float  # the best of the samples: noise (a descheduled rank, a busy core) only slows a link
    time_us: float
    # Every measurement of this pair, in GB/s: one, or more when the pair was suspect and measured again.
    samples_gbps: list[float] = field(default_factory=list)
    # A first look would have blamed it, so it was measured again (``samples_gbps`` holds the repeats).
    suspect: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "host_a": self.host_a, "host_b": self.host_b,
                "busbw_gbps": self.busbw_gbps, "time_us": self.time_us,
                "samples_gbps": list(self.samples_gbps) or [self.busbw_gbps], "suspect": self.suspect}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PairResult:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})

    @property
    def self_spread(self) -> float:
        """How well this link's figure reproduces against itself: best / second-best sample (1 if one).

        The figure is the best sample, so its uncertainty is how far the next-best fell short of it; the
        worst sample says only that the rank was once descheduled, which crowded ranks always are.
        """
        samples = sorted((s for s in self.samples_gbps if s > 0), reverse=True)
        return samples[0] / samples[1] if len(samples) > 1 else 1.0


@dataclass
class PairAnalysis:
    pairs: list[PairResult]
    slow_hosts: list[str] = field(default_factory=list)
    slow_links: list[PairResult] = field(default_factory=list)
    host_best_gbps: dict[str, float] = field(default_factory=dict)
    # Ranks whose every link within their host is slow (a throttled rank, a GPU behind another switch).
    slow_ranks: list[int] = field(default_factory=list)
    rank_best_gbps: dict[int, float] = field(default_factory=dict)
    # The factor an outlier had to be below typical by: max(1 / SLOW_FRACTION, the run's own spread).
    margin: float = 1 / SLOW_FRACTION
    spread: float = 1.0

    def typical_host_gbps(self) -> float:
        """The median best link of the hosts that are not slow: what a slow host is compared with."""
        others = [bw for h, bw in self.host_best_gbps.items() if h not in self.slow_hosts]
        return statistics.median(others) if others else 0.0

    def typical_rank_gbps(self) -> float:
        others = [bw for r, bw in self.rank_best_gbps.items() if r not in self.slow_ranks]
        return statistics.median(others) if others else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"pairs": [p.to_json() for p in self.pairs], "slow_hosts": list(self.slow_hosts),
                "slow_links": [p.to_json() for p in self.slow_links], "slow_ranks": list(self.slow_ranks),
                "margin": round(self.margin, 3), "spread": round(self.spread, 3)}


def run_spread(pairs: Sequence[PairResult]) -> float:
    """The run's own noise: the largest best/second-best ratio of a link that does not look slow, measured again.

    Links that look slow are left out: a throttled rank's link varies with the throttling, and letting
    that variation raise the bar would hide the very rank it comes from.
    On a quiet, well-provisioned machine a link repeats within a few percent; on a host where ranks
    outnumber cores, the same link can vary 2-5x between repeats. An outlier must be slower than typical
    by more than that before it is blamed.
    """
    return max((p.self_spread for p in pairs), default=1.0)


def _best_by(pairs: Sequence[PairResult], key: str) -> dict[Any, float]:
    best: dict[Any, float] = {}
    for p in pairs:
        for end in ((p.host_a, p.host_b) if key == "host" else (p.a, p.b)):
            best[end] = max(best.get(end, 0.0), p.busbw_gbps)
    return best


def analyse_pairs(pairs: Sequence[PairResult]) -> PairAnalysis:
    """Name the slow hosts, ranks and links, with a margin the run's own spread justifies.

    A host is slow when even its best link to another host is below typical / margin, typical being the
    median host's best: with three hosts where C's NIC is throttled, A-C and B-C are slow but A-B is not,
    so A and B are fine and C is named (two of three links are slow, so a plain median of links would not
    do). Within a host the same rule names a rank (all of its links slow). A link is slow when it is below
    1 / margin of what both its ends reach elsewhere (a bad cable or switch port between healthy ends).
    ``margin`` is max(1 / SLOW_FRACTION, :func:`run_spread`): a link measured twice at 1.0 and 0.3 GB/s
    says the run cannot tell 3x apart from noise. Best samples are compared (noise only slows).
    """
    median_best = statistics.median(p.busbw_gbps for p in pairs) if pairs else 0.0
    spread = run_spread([p for p in pairs if p.busbw_gbps >= SLOW_FRACTION * median_best])
    margin = max(1 / SLOW_FRACTION, spread)
    inter = [p for p in pairs if p.host_a != p.host_b]
    intra = [p for p in pairs if p.host_a == p.host_b]
    best = _best_by(inter, "host")
    slow_hosts: list[str] = []
    # With two hosts there is one link: nothing to tell which end is at fault.
    if len(best) >= 3:
        typical = statistics.median(best.values())
        slow_hosts = sorted(h for h, bw in best.items() if bw * margin < typical)
    slow_links = [p for p in inter if p.host_a not in slow_hosts and p.host_b not in slow_hosts
                  and p.busbw_gbps * margin < min(best[p.host_a], best[p.host_b])]
    rank_best = _best_by(intra, "rank")
    slow_ranks: list[int] = []
    by_host: dict[str, list[int]] = {}
    for p in intra:
        for r in (p.a, p.b):
            if r not in by_host.setdefault(p.host_a, []):
                by_host[p.host_a].append(r)
    for members in by_host.values():
        if len(members) < 3:  # two ranks, one link: no way to tell which end is slow
            continue
        typical = statistics.median(rank_best[r] for r in members)
        slow_ranks += [r for r in members if rank_best[r] * margin < typical]
    slow_ranks.sort()
    others = [p for p in intra if p.a not in slow_ranks and p.b not in slow_ranks]
    slow_links += [p for p in others
                   if p.busbw_gbps * margin < min(rank_best[p.a], rank_best[p.b])
                   and len(by_host.get(p.host_a, [])) >= 3]
    ordered = sorted(pairs, key=lambda p: p.busbw_gbps)
    return PairAnalysis(ordered, slow_hosts, sorted(slow_links, key=lambda p: p.busbw_gbps), best,
                        slow_ranks, rank_best, margin, spread)


def suspects(pairs: Sequence[PairResult]) -> list[tuple[int, int]]:
    """The pairs worth measuring again: those a first look would blame (slow links, links of slow hosts/ranks).

    Deterministic in the measured numbers, so every rank (which has them all) picks the same pairs.
    """
    first = analyse_pairs([PairResult(p.a, p.b, p.host_a, p.host_b, p.busbw_gbps, p.time_us) for p in pairs])
    picked = {(p.a, p.b) for p in first.slow_links}
    picked |= {(p.a, p.b) for p in pairs if {p.host_a, p.host_b} & set(first.slow_hosts)
               or {p.a, p.b} & set(first.slow_ranks)}
    return sorted(picked)


def undecided(pairs: Sequence[PairResult]) -> list[tuple[int, int]]:
    """The suspects (:func:`suspects`) that the run's own noise keeps from being blamed: a first look would
    blame them, but the margin that noise sets (:func:`run_spread`, above 1 / SLOW_FRACTION) does not.

    Worth measuring again: the spread is a best/second-best ratio, and each repeat brings a link's second
    best closer to its best. On two cores shared by four ranks one lucky sample of a healthy link (1.5 GB/s
    beside 0.3) set a 5x margin and hid a rank throttled to a fifth of the CPU, in one run of six."""
    analysis = analyse_pairs(pairs)
    if analysis.margin <= 1 / SLOW_FRACTION:
        return []
    blamed = {(p.a, p.b) for p in analysis.slow_links}
    blamed |= {(p.a, p.b) for p in pairs if {p.host_a, p.host_b} & set(analysis.slow_hosts)
               or {p.a, p.b} & set(analysis.slow_ranks)}
    return [pair for pair in suspects(pairs) if pair not in blamed]
