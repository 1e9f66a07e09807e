"""The link-test plan at scale and the noise-aware judgement of slow links, ranks and hosts (pure)."""

from __future__ import annotations

import math

from ddpdoctor.bench.pairs import (
    PairResult,
    analyse_pairs,
    pair_schedule,
    plan_round_count,
    stride_rounds,
    suspects,
    undecided,
)


def test_stride_plan_is_log_rounds_of_disjoint_pairs_touching_every_rank() -> None:
    for n in (2, 3, 5, 8, 13, 16, 100, 1024, 4096):
        rounds = stride_rounds(list(range(n)))
        assert len(rounds) == math.ceil(math.log2(n))
        for r in rounds:
            flat = [x for p in r for x in p]
            assert len(flat) == len(set(flat))
        assert {x for r in rounds for p in r for x in p} == set(range(n))


def test_plan_round_counts_at_scale() -> None:
    # 512 hosts x 8 ranks (4,096 ranks): 9 rounds between hosts + 3 within, not 511 + 7.
    hosts = {r: f"node{r // 8:03d}" for r in range(4096)}
    plan = pair_schedule(hosts)
    assert len(plan) == plan_round_count(512, 8) == 12
    assert max(len(r) for r in plan) <= 2048
    # Up to 16 hosts every pair of hosts is still tested.
    small = {r: f"n{r // 2}" for r in range(32)}
    between = {p for r in pair_schedule(small) for p in r if small[p[0]] != small[p[1]]}
    assert len(between) == 16 * 15 // 2 and len(pair_schedule(small)) == plan_round_count(16, 2) == 16


def _pair(a: int, b: int, *samples: float) -> PairResult:
    return PairResult(a, b, "vm", "vm", max(samples), 1.0, list(samples))


def test_a_rank_slow_in_every_repeat_is_named_and_noise_is_not() -> None:
    # Four ranks on one host, stride plan (0,1) (2,3) (0,2) (1,3): rank 3 throttled, measured three times.
    throttled = [_pair(0, 1, 1.0, 0.9, 1.1), _pair(2, 3, 0.2, 0.15, 0.18), _pair(0, 2, 1.0, 1.05, 0.95),
                 _pair(1, 3, 0.19, 0.2, 0.17)]
    result = analyse_pairs(throttled)
    assert result.slow_ranks == [3] and result.slow_links == []
    # Crowded ranks: the best figures reproduce only within 2.5x, and the first look's "slow" link is not
    # slower than that: nothing is blamed.
    noisy = [_pair(0, 1, 0.3, 1.2, 0.5), _pair(2, 3, 0.25, 0.6, 0.9), _pair(0, 2, 1.0, 0.4, 0.3),
             _pair(1, 3, 0.35, 0.7, 0.5)]
    result = analyse_pairs(noisy)
    assert result.spread >= 2.4 and result.slow_ranks == [] and result.slow_links == []


def test_suspects_are_what_a_single_look_would_blame() -> None:
    first = [_pair(0, 1, 1.0), _pair(2, 3, 0.2), _pair(0, 2, 1.0), _pair(1, 3, 0.2)]
    assert suspects(first) == [(1, 3), (2, 3)]
    assert suspects([_pair(0, 1, 1.0), _pair(2, 3, 0.9), _pair(0, 2, 1.0), _pair(1, 3, 0.95)]) == []


def test_a_suspect_hidden_by_one_lucky_sample_of_a_healthy_link_is_undecided_until_measured_again() -> None:
    """Four ranks on two cores, rank 3 throttled to a fifth of the CPU (a real failing run's shape): one
    healthy link's lucky 1.5 GB/s beside 0.3 sets a 5x margin, and rank 3 (0.33 at best) is not named.
    Those pairs are undecided; two more samples of that link settle the margin, and rank 3 is named."""
    lucky = [_pair(0, 1, 1.5, 0.3, 0.28), _pair(0, 2, 1.4, 1.1, 0.9),
             _pair(1, 3, 0.30, 0.29, 0.31), _pair(2, 3, 0.33, 0.16, 0.15)]
    assert analyse_pairs(lucky).slow_ranks == []
    assert undecided(lucky) == [(1, 3), (2, 3)]
    settled = [_pair(0, 1, 1.5, 0.3, 0.28, 1.3, 0.9), *lucky[1:]]
    assert analyse_pairs(settled).slow_ranks == [3] and undecided(settled) == []
    # A quiet run (margin 2) is never undecided: its verdict stands as the first look gave it.
    quiet = [_pair(0, 1, 1.0, 0.98), _pair(0, 2, 1.0, 0.99), _pair(1, 3, 0.2, 0.19),
             _pair(2, 3, 0.2, 0.2)]
    assert analyse_pairs(quiet).slow_ranks == [3] and undecided(quiet) == []
