"""Where each rank runs, grouped the way people think of a cluster: "nodeA: ranks 0-1; nodeB: ranks 2-3".

One spelling for every report that covers ranks on more than one host (check, stacks, fr); watch's
verdicts use the same words (ddpdoctor.watch.verdict.host_groups_text). No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable

from ddpdoctor.ranks import rank_phrase


def ranks_by_host(pairs: Iterable[tuple[int, str | None]]) -> dict[str, list[int]]:
    """(rank, host) pairs to host -> its ranks (sorted, each once), hosts in the order of their lowest rank;
    a rank without a known host is left out (it is named elsewhere, as not reporting)."""
    found: dict[str, set[int]] = {}
    for rank, host in pairs:
        if host:
            found.setdefault(host, set()).add(rank)
    return {host: sorted(ranks) for host, ranks in sorted(found.items(), key=lambda item: (min(item[1]), item[0]))}


# Past this many hosts (a line of ~200 characters) the text names the first two and the last, which show the
# naming and the rank layout; the JSON documents keep every host.
MAX_HOSTS_LISTED = 8


def hosts_text(hosts: dict[str, list[int]], limit: int | None = MAX_HOSTS_LISTED) -> str:
    """'nodeA: ranks 0-1; nodeB: ranks 2-3' (hosts as :func:`ranks_by_host` orders them); past ``limit``
    hosts: 'gpu00: ranks 0-7; gpu01: ranks 8-15; ... gpu15: ranks 120-127 (16 hosts; the JSON's hosts lists all)'."""
    items = list(hosts.items())
    if limit is not None and len(items) > limit:
        shown = [*items[:2], ("...", []), items[-1]]
        text = "; ".join(f"{h}: {rank_phrase(r)}" if r else h for h, r in shown).replace("...; ", "... ")
        return f"{text} ({len(items)} hosts; the JSON's hosts lists all)"
    return "; ".join(f"{host}: {rank_phrase(ranks)}" for host, ranks in items)
