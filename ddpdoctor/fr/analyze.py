"""The verdict: per process group, the first collective where the ranks stopped doing the same thing.

Every collective on a group carries a sequence number (``collective_seq_id``) that each member counts on
its own, so entry #11 of rank 0 and entry #11 of rank 3 are the same collective if the ranks agree. The
comparison starts at the newest first entry any member still holds: ring buffers overwrite old entries
at different rates on different ranks, and a missing old entry is not a divergence. ``pg_status``'s
``last_enqueued_collective`` says how far a rank got even when its buffer no longer holds the entries.
Point-to-point ops have no shared counter; sends and recvs between each pair are counted instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddpdoctor.errors import DoctorError
from ddpdoctor.fr.model import (
    MAX_RANK,
    NO_CALL,
    Call,
    CallTable,
    Divergence,
    FrReport,
    GroupTrace,
    GroupVerdict,
    RankDump,
    Side,
    StackNow,
    Unreadable,
)
from ddpdoctor.ranks import rank_phrase
from ddpdoctor.runtime.hosts import ranks_by_host

# Ops whose tensors have the same shape on every rank (a different shape is a bug, and hangs or corrupts
# on NCCL). all_to_all, gather and scatter may legitimately differ per rank: only dtypes are compared.
SAME_SHAPE_OPS = frozenset({
    "all_reduce", "allreduce", "allreduce_coalesced", "all_reduce_coalesced", "broadcast", "reduce",
    "all_gather", "allgather", "_allgather_base", "all_gather_into_tensor", "allgather_into_tensor_coalesced",
    "all_gather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
})

GroupKey = tuple[str, tuple[int, ...], str]


def signature(call: Call) -> tuple[object, ...]:
    """What must agree across ranks for one collective: the op, and shapes/dtypes where they must match."""
    if call.op in SAME_SHAPE_OPS:
        return (call.op, call.input_sizes, call.input_dtypes, call.output_sizes, call.output_dtypes)
    return (call.op, call.input_dtypes)


def _key(trace: GroupTrace) -> GroupKey:
    # Groups are matched across ranks by their rank set where the dump gives it (names may differ per
    # rank, e.g. '' in pg_config and '0' in the entries on gloo), else by name.
    if trace.ranks:
        return ("ranks", trace.ranks, trace.desc)
    return ("name", (), trace.name)


def _is_default(trace: GroupTrace) -> bool:
    return trace.desc == "default_pg" or (trace.ranks is None and trace.name == "0")


def _label(trace: GroupTrace, members: Sequence[int], world: int) -> str:
    if _is_default(trace) or (trace.name == "0" and list(members) == list(range(world))):
        return "the default group"
    desc = f" {trace.desc}" if trace.desc and trace.desc not in ("undefined", trace.name) else ""
    return f"group {trace.name}{desc} ({rank_phrase(members)})"


def analyze(dumps: Sequence[RankDump], table: CallTable, world_size: int | None = None,
            stacks: Mapping[int, StackNow] | None = None, stacks_files: Sequence[str] = (),
            unreadable: Sequence[Unreadable] = ()) -> FrReport:
    """The report for these dumps; ranks without a (readable) dump are named and the verdict uses the others."""
    by_rank = {d.rank: d for d in dumps}
    # The ranks the dumps name and the world size given are bounded apart, so that each error blames its
    # own source (a world size from the command line is not "a dump names rank N").
    named = max([max(by_rank) + 1, *(u.rank + 1 for u in unreadable),
                 *(max(t.ranks) + 1 for d in dumps for t in d.groups.values() if t.ranks)])
    if named > MAX_RANK:
        raise DoctorError(f"a dump names rank {named - 1}: more ranks than any job has; the dump or its name is "
                          "damaged (or pass --prefix)")
    if world_size is not None and world_size > MAX_RANK:
        raise DoctorError(f"world size {world_size}: more ranks than any job has (at most {MAX_RANK})")
    world = max(world_size or 0, named)
    keyed: dict[GroupKey, dict[int, GroupTrace]] = {}
    for dump in dumps:
        for trace in dump.groups.values():
            keyed.setdefault(_key(trace), {})[dump.rank] = trace
    verdicts = [_group_verdict(traces, by_rank, world, table, stacks or {}) for traces in keyed.values()]
    _link_causes(verdicts, list(keyed.values()), by_rank)
    verdicts.sort(key=lambda v: (v.status != "fail", v.caused_by is not None, v.label != "the default group", v.name))
    missing = sorted(set(range(world)) - set(by_rank))
    return FrReport(dumps=sorted(dumps, key=lambda d: d.rank), missing=missing, world_size=world,
                    groups=verdicts, stacks_files=list(stacks_files),
                    unreadable=sorted(unreadable, key=lambda u: u.rank),
                    hosts=ranks_by_host((rank, now.host) for rank, now in (stacks or {}).items() if now.host != "?"))


def _link_causes(verdicts: Sequence[GroupVerdict], traces: Sequence[dict[int, GroupTrace]],
                 dumps: Mapping[int, RankDump]) -> None:
    """A rank behind on one group because it waits in another group's diverged collective: say so.

    Its newest entry (the collective it is blocked in) names that other group; that group's divergence is
    the cause, and is listed first. Two groups each waiting on the other are a deadlock between ranks that
    issue collectives on the groups in different orders: said as such, neither listed as the cause.
    """
    owner: dict[tuple[int, str], GroupVerdict] = {}
    for verdict, members in zip(verdicts, traces, strict=True):
        for rank, trace in members.items():
            owner[(rank, trace.name)] = verdict
    links: dict[int, tuple[Divergence, GroupVerdict, GroupVerdict, int, int]] = {}
    for verdict in verdicts:
        for divergence in verdict.divergences:
            if divergence.kind != "not_issued":
                continue
            behind = [r for side in divergence.sides if side.diverged for r in side.ranks]
            for rank in behind:
                newest = dumps[rank].newest if rank in dumps else None
                other = owner.get((rank, newest[0])) if newest else None
                if newest is not None and other is not None and other is not verdict and other.divergences:
                    links[id(verdict)] = (divergence, verdict, other, rank, newest[1])
                    break
    for divergence, verdict, other, rank, seq in links.values():
        back = links.get(id(other))
        if back is not None and back[2] is verdict:
            divergence.summary += (f"; rank {rank} is waiting in collective #{seq} on {other.label}, which rank "
                                   f"{back[3]} never issued because it is waiting here: a deadlock (the ranks "
                                   "issue collectives on these groups in different orders)")
        else:
            verdict.caused_by = other.label
            divergence.summary += (f"; rank {rank} is waiting in collective #{seq} on {other.label}, which "
                                   "diverged (see there)")


def _group_verdict(traces: dict[int, GroupTrace], dumps: Mapping[int, RankDump], world: int, table: CallTable,
                   stacks: Mapping[int, StackNow]) -> GroupVerdict:
    sample = next(iter(traces.values()))
    if sample.ranks:
        members, known = list(sample.ranks), True
    elif _is_default(sample):
        members, known = list(range(world)), False
    else:  # gloo in torch 2.13 writes no ranks: the members are the ranks whose dumps know the group
        members, known = sorted(traces), False
    present = [r for r in members if r in dumps]
    missing = [r for r in members if r not in dumps]
    label = _label(sample, members, world)
    # A member whose dump does not mention the group never issued anything on it.
    full = {r: traces.get(r) or GroupTrace(sample.name, sample.desc, sample.ranks) for r in present}
    verdict = GroupVerdict(label=label, name=sample.name, desc=sample.desc, ranks=members, ranks_known=known,
                           missing=missing, window=None, divergences=[])
    if not present:
        verdict.note = "no dump from any member"
        return verdict
    held = [t.first_seq for t in full.values() if t.calls]
    lasts = {r: t.last_seq for r, t in full.items()}
    low = max(held) if held else None
    high = max(lasts.values())
    if high > 0:
        verdict.window = (low if low is not None else high, high)
    divergence = _first_divergence(full, lasts, low, label, table)
    if divergence is not None:
        verdict.divergences.append(divergence)
    verdict.divergences.extend(_p2p_unmatched(full, members, dumps, label, table))
    for found in verdict.divergences:
        found.stacks = {r: stacks[r] for r in found.diverged_ranks if r in stacks}
    if not verdict.divergences:
        verdict.note = _agreement_note(full, low, high, table)
    return verdict


def _first_mismatch(traces: Mapping[int, GroupTrace], low: int, upto: int, table: CallTable) -> int | None:
    """The first sequence number in [low, upto] whose calls disagree, comparing call-id runs in C first."""
    if upto < low:
        return None
    sigs: dict[int, tuple[object, ...]] = {}

    def sig(call_id: int) -> tuple[object, ...] | None:
        if call_id == NO_CALL:
            return None
        if call_id not in sigs:
            sigs[call_id] = signature(table[call_id])
        return sigs[call_id]

    runs = {r: t.calls[low - t.first_seq: upto - t.first_seq + 1] for r, t in traces.items() if t.calls}
    if len({bytes(run) for run in runs.values()}) <= 1:
        return None
    reference_rank = min(runs)
    reference = runs[reference_rank]
    first: int | None = None
    for rank, run in runs.items():
        if rank == reference_rank or run == reference:
            continue
        for index, (mine, theirs) in enumerate(zip(run, reference, strict=False)):
            if first is not None and index >= first - low:
                break
            if mine != theirs:
                a, b = sig(mine), sig(theirs)
                if a is not None and b is not None and a != b:
                    first = low + index
                    break
    return first


def _first_divergence(traces: Mapping[int, GroupTrace], lasts: Mapping[int, int], low: int | None, label: str,
                      table: CallTable) -> Divergence | None:
    least, most = min(lasts.values()), max(lasts.values())
    not_issued = least + 1 if least < most else None
    mismatch = _first_mismatch(traces, low, least, table) if low is not None else None
    if mismatch is not None and (not_issued is None or mismatch < not_issued):
        return _mismatch(traces, mismatch, label, table)
    if not_issued is not None:
        return _not_issued(traces, lasts, not_issued, label, table)
    return None


def _call(trace: GroupTrace, seq: int, table: CallTable) -> Call | None:
    call_id = trace.call_at(seq)
    return None if call_id == NO_CALL else table[call_id]


def _mismatch(traces: Mapping[int, GroupTrace], seq: int, label: str, table: CallTable) -> Divergence:
    by_sig: dict[tuple[object, ...], list[int]] = {}
    calls: dict[tuple[object, ...], Call] = {}
    for rank in sorted(traces):
        call = _call(traces[rank], seq, table)
        if call is None:
            continue
        by_sig.setdefault(signature(call), []).append(rank)
        calls.setdefault(signature(call), call)
    ordered = sorted(by_sig.items(), key=lambda item: (-len(item[1]), item[1][0]))
    sides = [Side(ranks, calls[sig], seq, diverged=i > 0) for i, (sig, ranks) in enumerate(ordered)]
    same_op = len({side.call.op for side in sides if side.call}) == 1
    if same_op:
        op = sides[0].call.op if sides[0].call else "?"
        parts = [f"{rank_phrase(s.ranks)} with {_shapes(s.call)}{_at(s.call)}" for s in sides if s.call]
        summary = f"collective #{seq} ({op}) on {label} has different tensors: " + "; ".join(parts)
        kind = "size_mismatch"
    else:
        parts = [f"{rank_phrase(s.ranks)} in {s.call.describe()}" for s in sides if s.call]
        summary = f"collective #{seq} on {label}: " + "; ".join(parts)
        kind = "mismatch"
    return Divergence(kind, seq, summary, sides)


def _shapes(call: Call | None) -> str:
    if call is None:
        return "?"
    sizes = [list(s) if isinstance(s, tuple) else s for s in call.input_sizes]
    text = f"input {sizes} {'/'.join(call.input_dtypes) or ''}".rstrip()
    if call.output_sizes != call.input_sizes:
        text += f", output {[list(s) if isinstance(s, tuple) else s for s in call.output_sizes]}"
    return text


def _at(call: Call | None) -> str:
    where = call.where() if call else None
    return f" at {where}" if where else ""


def _not_issued(traces: Mapping[int, GroupTrace], lasts: Mapping[int, int], seq: int, label: str,
                table: CallTable) -> Divergence:
    issued = sorted(r for r, last in lasts.items() if last >= seq)
    behind = sorted(r for r, last in lasts.items() if last < seq)
    behind_diverged = len(behind) <= len(issued)
    sides: list[Side] = []
    by_call: dict[Call | None, list[int]] = {}
    for rank in issued:
        by_call.setdefault(_call(traces[rank], seq, table), []).append(rank)
    for call, ranks in by_call.items():
        sides.append(Side(ranks, call, seq, diverged=not behind_diverged))
    by_last: dict[tuple[int, Call | None], list[int]] = {}
    for rank in behind:
        by_last.setdefault((lasts[rank], _call(traces[rank], lasts[rank], table)), []).append(rank)
    behind_sides = [Side(ranks, call, last or None, diverged=behind_diverged)
                    for (last, call), ranks in sorted(by_last.items(), key=lambda item: -item[0][0])]
    expected = next((s.call for s in sides if s.call), None)  # what the ranks that went on issued at #seq
    sides.extend(behind_sides)
    what = f" ({expected.describe()})" if expected else ""
    lasts_text = "; ".join(_last_text(s, len(behind) > 1) for s in behind_sides)
    if behind_diverged:
        summary = f"{rank_phrase(behind)} never issued collective #{seq}{what} on {label}; {lasts_text}"
    else:
        summary = (f"{rank_phrase(issued)} issued collective #{seq}{what} on {label}, which "
                   f"{rank_phrase(behind)} never issued; {lasts_text}")
    return Divergence("not_issued", seq, summary, sides)


def _last_text(side: Side, several: bool) -> str:
    who = f"{rank_phrase(side.ranks)}: " if several else ""
    pronoun = "their" if len(side.ranks) > 1 else "its"
    if not side.seq:
        return f"{who}{pronoun} first collective on it never came"
    if side.call is None:
        return f"{who}{pronoun} last was #{side.seq} (no longer in the dump's buffer)"
    return f"{who}{pronoun} last was #{side.seq} ({side.call.describe()})"


def _p2p_unmatched(traces: Mapping[int, GroupTrace], members: Sequence[int], dumps: Mapping[int, RankDump],
                   label: str, table: CallTable) -> list[Divergence]:
    """Pairs whose sends and recvs do not add up, counted from when both ranks' buffers begin."""
    order = sorted(members)
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    last_send: dict[tuple[int, int], int] = {}
    last_recv: dict[tuple[int, int], int] = {}
    for rank, trace in traces.items():
        for op in trace.p2p:
            if op.peer is None or op.peer >= len(order):
                continue
            peer = order[op.peer]  # 'send 1->2' names ranks within the group
            pair = (rank, peer) if op.send else (peer, rank)
            (sends if op.send else recvs).setdefault(pair, []).append(op.time_created_ns)
            (last_send if op.send else last_recv)[pair] = op.call_id
    found: list[Divergence] = []
    for pair in sorted(set(sends) | set(recvs)):
        src, dst = pair
        if src not in dumps or dst not in dumps:
            continue
        since = max(dumps[src].oldest_ns or 0, dumps[dst].oldest_ns or 0)
        n_send = sum(1 for t in sends.get(pair, []) if t >= since)
        n_recv = sum(1 for t in recvs.get(pair, []) if t >= since)
        if n_send == n_recv:
            continue
        if n_send > n_recv:
            call = table[last_send[pair]]
            summary = (f"p2p on {label}: rank {src} sent {n_send} time(s) to rank {dst} but rank {dst} posted "
                       f"{n_recv} recv(s) from rank {src}: the last send ({call.describe()}) has no matching recv")
            sides = [Side([src], call, None, diverged=False), Side([dst], None, None, diverged=True)]
        else:
            call = table[last_recv[pair]]
            summary = (f"p2p on {label}: rank {dst} posted {n_recv} recv(s) from rank {src} but rank {src} sent "
                       f"{n_send}: the last recv ({call.describe()}) has no matching send")
            sides = [Side([dst], call, None, diverged=False), Side([src], None, None, diverged=True)]
        found.append(Divergence("p2p_unmatched", None, summary, sides))
    return found


def _agreement_note(traces: Mapping[int, GroupTrace], low: int | None, high: int, table: CallTable) -> str:
    if high <= 0:
        return "no collective recorded"
    n = len(traces)
    last = next((c for c in (_call(t, high, table) for t in traces.values()) if c is not None), None)
    what = f" (last: #{high} {last.describe()})" if last else f" (last: #{high})"
    several = low is not None and low < high
    span = f"collectives #{low}-#{high}" if several else f"collective #{high}"
    note = f"all {n} ranks agree on {span}{what}"
    pending = sorted(r for r, t in traces.items() if t.last_completed is not None and t.last_completed < high)
    if pending:
        note += f"; not yet completed on {rank_phrase(pending)} when dumped"
    if low is not None and low > 1:
        note += f"; older entries overwritten on some rank (buffer holds from #{low})"
    return note
