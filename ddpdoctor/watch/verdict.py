"""Which kind of failure a watched job had, told apart by evidence: a host lost, a link cut, a crash, a desync.

A pure function of the supervisor's picture (:class:`~ddpdoctor.watch.aggregate.Aggregator`): no sockets, no
clock of its own (the verdict's time is passed in), so every class is unit-tested without processes. The rules that assign blame within a class live here too
(:func:`early_exit`, :func:`busy_at`): they are classification, not bookkeeping.

The classes (``failure.class`` in the JSON), in the order they are tried:

- ``host_lost``: every rank of one host (not the supervisor's) vanished within :data:`HOST_WINDOW_S` of each
  other without an exit status: their watch connections closed, and no exit message came. That is what a
  kernel panic that resets the NIC, the OOM killer taking a node's processes, a preemption or a power cut
  look like from the other side. Next step: that host's kernel log and the scheduler's node events.
- ``partition``: every rank of one host stopped reporting (no message for :data:`SILENT_AFTER_S` or more)
  while their connections stay open and no process is known dead: the link to that host, or the host as a
  whole, stopped answering (from the far side the two look alike until TCP gives up, minutes later). Next
  step: the NIC and the link (``ip -s link``, the switch port), then the host.
- ``crash``: a rank ended with an exit status, a signal or an exception (peers that failed only because it
  went away are listed after it, see ``Aggregator.failure_order``). Next step: its stderr and exit status.
  When the first failure is only such an echo and a rank had ended well (exit code 0) before it, that early
  exit is the cause (:func:`early_exit`): next step, the same number of steps on every rank.
- ``desync``: the ranks are alive and reporting, and they are in different collectives (or issued different
  ones: a mismatch). Only here does the advice point at the user's code (a skipped collective, a
  rank-dependent branch). Next step: the code line named.
- ``hang`` / ``stall``: nobody progresses and no class above fits (a GPU that never finishes, a DataLoader
  worker, a rank stuck outside the collectives, every rank busy in its own code; a rank behind that is busy in
  its own code before the call the others wait in: it has not reached it, see :func:`busy_only`).
- ``init_conflict``: contradictory ``init_process_group`` calls (see ``aggregate.claim_conflict``).
- ``lost_contact``: the verdict of a host that lost the supervisor (rank 0's host and the job's store):
  written by that host itself (:func:`lost_contact`), since the supervisor cannot reach it.

How others tell these apart, and what was taken from them (sources):

- NCCL's RAS (``src/ras/ras_internal.h``, NVIDIA/nccl at 5067397c, June 2026): every process keeps its peers
  alive with a keep-alive each second (``RAS_KEEPALIVE_INTERVAL``); a peer silent for 5 s is *unresponsive*
  (``RAS_KEEPALIVE_TIMEOUT_WARN``), one unreachable for 60 s is *dead* (``RAS_PEER_DEAD_TIMEOUT``), and a
  socket closed by the peer is a different fact from silence. Here: a closed connection without an exit
  status is a vanished process; silence while the connection stays open is unresponsive, never "dead";
  :data:`SILENT_AFTER_S` is RAS's 5 s.
- PyTorch's elastic agent (``torch/distributed/elastic/agent/server/api.py``, ``WorkerState``: HEALTHY,
  UNHEALTHY, FAILED, ...; ``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``): a worker's failure
  is its exit status seen by its own node's agent; a *node* is dead when its keep-alive heartbeat in the
  rendezvous store stops (``keep_alive_interval`` 5 s times ``keep_alive_max_attempt`` 3). Here: the exit
  status (or signal) is the crash evidence, and a whole host's silence is a host-level fact.
- The Flight Recorder analyzer (``torch/distributed/flight_recorder/components/utils.py``,
  ``match_coalesced_groups``/``error_analysis``): "Not all ranks joining collective" is reported only when
  the missing ranks' dumps are present (``missing ranks <= dumps_ranks``); ranks without a dump are "missing
  dump files" (``check_no_missing_dump_files``), a different finding. Here: a desync (user-code advice) only
  when every rank it involves is alive and reporting.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, Protocol

from ddpdoctor.ranks import rank_phrase
from ddpdoctor.watch.state import ECHO, ECHO_WINDOW_S, RankState
from ddpdoctor.watch.waits import STALL_KINDS, innermost
from ddpdoctor.watch.waits import classify as classify_wait


class Aggregator(Protocol):
    """What this module reads of the supervisor's picture (``aggregate.Aggregator``)."""

    @property
    def ranks(self) -> dict[int, Any]: ...

    wall_offset: float
    conflict: dict[str, Any] | None
    hang_timeout_s: float

    def failure_order(self) -> list[int]: ...



# The statuses of aggregate (the same strings; kept here so that this module does not import it).
_CRASH, _HANG, _MISMATCH, _INIT_CONFLICT = "crash", "hang", "mismatch", "init_conflict"

HOST_LOST, PARTITION, CRASH_CLASS, DESYNC = "host_lost", "partition", "crash", "desync"
HANG_CLASS, STALL, INIT_CONFLICT_CLASS, LOST_CONTACT = "hang", "stall", "init_conflict", "lost_contact"
# Not a class of its own (a crash): the key of the next step when a rank's clean early exit caused it.
EARLY_EXIT = "early_exit"
# Not a class of its own (a hang): the key of the next step when every rank waits in one and the same collective.
SAME_CALL = "same_call"
# ... and when the Flight Recorder, which counts DDP's own collectives too, says the ranks' collectives differ.
SAME_CALL_FR = "same_call_fr"
# Ranks of a lost host that closed this far apart or more may be one rank's death and its launcher's teardown of
# the others (torchrun's --monitor-interval, 0.1 s by default in torch/distributed/run.py, then SIGTERM): said so.
LAUNCHER_FOLLOW_S = 0.01
# A host's ranks that vanish within this many seconds of each other vanished together (a host-level event);
# also how long the supervisor waits, after the first one, for the rest of that host before it decides.
HOST_WINDOW_S = 2.0
# No message for this long while the connection is open: unresponsive (NCCL RAS's RAS_KEEPALIVE_TIMEOUT_WARN).
# A watchdog beats once a second (watchdog.BEAT_S), so this is five missed beats.
SILENT_AFTER_S = 5.0

NEXT_STEP = {
    HOST_LOST: "look at {host} itself: its kernel log (`journalctl -k -b -1` or `dmesg -T` on {host}: an OOM kill, a "
               "panic, a hardware error) and the scheduler's events for the node (`scontrol show node {host}`, "
               "`sacct -j <job>`, `kubectl describe node {host}`): the processes there ended without a word",
    PARTITION: "look at the link between {here} and {host}: `ip -s link` on both (errors, drops, a link that is "
               "down), `ping` {host} from {here}, the switch port; if {host} does not answer at all, its console "
               "and kernel log (a host that froze looks the same from here)",
    CRASH_CLASS: "read the failed rank's own output and exit status (its [rankN]: lines, or output_rank_N.txt in "
                 "the evidence folder when -q kept them off the terminal; its host's kernel log for a signal such as "
                 "SIGKILL: the OOM killer)",
    EARLY_EXIT: "give every rank the same number of steps: a DistributedSampler with drop_last=True (or the same "
                "number of batches on every rank), no rank-dependent `return`, `break`, `continue` or `sys.exit` "
                "around the collectives; for uneven inputs, wrap the loop in "
                "`torch.distributed.algorithms.Join([model])`",
    DESYNC: "the code line named above: every rank must issue the same collectives in the same order",
    # Every rank in the same collective that does not finish: the code issued it alike everywhere.
    SAME_CALL: "the collective itself does not finish, not the order of your code's collectives: across hosts the "
               "link between them (`ddpdoctor bench --pairs` names a slow or shaped link; `ip -s link`, `tc qdisc "
               "show` on each host), the interface NCCL/gloo chose (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME); on GPUs "
               "a kernel or an NVLink/PCIe fault (the Flight Recorder dumps in the bundle); if a call this large "
               "legitimately takes longer than {timeout:g} s on this network, raise --hang-timeout (watch counts the "
               "collectives your script calls; DDP's own gradient all_reduces are compared by the Flight Recorder "
               "line below, when there is one)",
    SAME_CALL_FR: "`ddpdoctor fr {path}` names the first collective the ranks issued differently: a collective "
                  "issued on some ranks only (a backward, or a call inside a rank-dependent branch) shifted the "
                  "sequence under the call every rank now waits in; make it run on every rank",
}


def hosts_of(ranks: Mapping[int, RankState]) -> dict[str, list[int]]:
    """host -> its ranks (sorted), in the order the hosts' lowest ranks come; ranks without a host are left out."""
    found: dict[str, list[int]] = {}
    for rank in sorted(ranks):
        host = ranks[rank].host
        if host:
            found.setdefault(host, []).append(rank)
    return found


def host_groups_text(hosts: dict[str, list[int]]) -> str:
    """'nodeA: ranks 0-1; nodeB: ranks 2-3'."""
    return "; ".join(f"{host}: {rank_phrase(ranks)}" for host, ranks in hosts.items())


def clock(wall: float) -> str:
    """HH:MM:SS of a wall-clock time, in the local time zone (as the ranks' own logs print it)."""
    return time.strftime("%H:%M:%S", time.localtime(wall))


def vanished(state: RankState) -> bool:
    """Its connection closed with no exit message and no exit status from the OS: it ended without a word."""
    return state.lost and not state.said_exit and state.returncode is None


def silent_for(state: RankState, now: float) -> float | None:
    """Seconds since its last message when it is alive by every fact we have but silent for
    :data:`SILENT_AFTER_S` or more (its connection open, no exit); None otherwise."""
    if not state.connected or state.finished or state.heard_at is None:
        return None
    age = now - state.heard_at
    return age if age >= SILENT_AFTER_S else None


def _other_hosts(agg: Aggregator, here: str) -> list[tuple[str, list[int]]]:
    """(host, its ranks) for every host but ``here`` (the supervisor's); none when the job is on one host."""
    hosts = hosts_of(agg.ranks)
    return [(host, ranks) for host, ranks in hosts.items() if host != here] if len(hosts) > 1 else []


def lost_hosts(agg: Aggregator, here: str) -> list[dict[str, Any]]:
    """Hosts (not ``here``, the supervisor's) whose every rank vanished within :data:`HOST_WINDOW_S`."""
    found = []
    for host, ranks in _other_hosts(agg, here):
        states = [agg.ranks[r] for r in ranks]
        if not all(vanished(s) for s in states):
            continue
        times = [s.ended_at for s in states if s.ended_at is not None]
        if len(times) == len(states) and max(times) - min(times) <= HOST_WINDOW_S:
            found.append({"host": host, "ranks": ranks, "at": min(times), "spread_s": round(max(times) - min(times), 3)})
    return found


def silent_hosts(agg: Aggregator, here: str, now: float) -> list[dict[str, Any]]:
    """Hosts (not ``here``) whose every rank is silent (see :func:`silent_for`) while connected."""
    found = []
    for host, ranks in _other_hosts(agg, here):
        ages = [silent_for(agg.ranks[r], now) for r in ranks]
        if all(age is not None for age in ages):
            heard = [agg.ranks[r].heard_at for r in ranks]
            found.append({"host": host, "ranks": ranks, "since": max(h for h in heard if h is not None),
                          "age_s": round(min(a for a in ages if a is not None), 1)})
    return found


def silent_ranks(agg: Aggregator, now: float) -> dict[int, float]:
    """rank -> seconds without a report, for every live rank silent for :data:`SILENT_AFTER_S` or more."""
    return {r: age for r, s in agg.ranks.items() if (age := silent_for(s, now)) is not None}


def _wall(agg: Aggregator, monotonic: float) -> float:
    return monotonic + agg.wall_offset


def classify(agg: Aggregator, status: str, now: float, here: str | None = None,
             divergence: dict[str, Any] | None = None, stall: bool = False) -> dict[str, Any] | None:
    """The ``failure`` object of a failed run: class, summary, evidence lines (who reported what, when),
    next step, and whether advice about the user's code is warranted. None for a run that ended well.

    ``here`` is the supervisor's host (rank 0's under a launcher); ``now`` the verdict's monotonic time."""
    if status not in (_CRASH, _HANG, _INIT_CONFLICT, _MISMATCH):
        return None
    hosts = hosts_of(agg.ranks)
    if here is None:
        here = agg.ranks[0].host if 0 in agg.ranks else ""
    verdict_at = _wall(agg, now)
    multi = len(hosts) > 1

    def on(ranks: list[int]) -> str:
        where = {agg.ranks[r].host for r in ranks if agg.ranks[r].host}
        return f"{rank_phrase(ranks)} on {', '.join(sorted(where))}" if multi and where else rank_phrase(ranks)

    base: dict[str, Any] = {"hosts": [{"host": h, "ranks": r} for h, r in hosts.items()], "evidence": [],
                            "lost_hosts": [], "silent_hosts": [], "silent_ranks": [], "user_code": False,
                            "same_call": None}
    if status == _INIT_CONFLICT:
        return {**base, "class": INIT_CONFLICT_CLASS, "summary": (agg.conflict or {}).get("summary", ""),
                "next_step": (agg.conflict or {}).get("remedy", "")}
    # On one host a silent rank is a frozen process (its main thread holds the GIL: its stack is then read
    # with py-spy); across hosts silence is first a question about the host and the link.
    silent = silent_ranks(agg, now) if multi else {}
    base["silent_ranks"] = [{"rank": r, "host": agg.ranks[r].host, "age_s": round(a, 1),
                             "last_report": clock(verdict_at - a)} for r, a in sorted(silent.items())]
    evidence: list[str] = base["evidence"]
    others = sorted(agg.ranks)

    gone = lost_hosts(agg, here)
    if gone and status == _CRASH:
        lost = gone[0]
        lost_at = lost["at"]
        # Failures elsewhere that came before the host vanished are a crash of their own, not its echo.
        earlier = [r for r, s in agg.ranks.items() if s.failed and r not in lost["ranks"] and not s.echo
                   and s.ended_at is not None and s.ended_at < lost_at - HOST_WINDOW_S]
        if not earlier:
            base["lost_hosts"] = [{**g, "at": clock(_wall(agg, g["at"]))} for g in gone]
            for g in gone:
                evidence.append(f"the watch connections of {rank_phrase(g['ranks'])} on {g['host']} closed at "
                                f"{clock(_wall(agg, g['at']))}, within {g['spread_s']:g} s of each other, and none "
                                "of them sent an exit status (no exception, no exit code: the processes ended "
                                "without running any more Python)")
                if len(g["ranks"]) > 1 and g["spread_s"] >= LAUNCHER_FOLLOW_S:
                    order = sorted(g["ranks"], key=lambda r: (agg.ranks[r].ended_at or 0.0, r))
                    evidence.append(f"rank {order[0]}'s closed first: a launcher ends a host's other ranks once one "
                                    "of them dies (torchrun's agent checks every 0.1 s), so one rank killed on "
                                    f"{g['host']} (the OOM killer) looks the same from here; {g['host']}'s kernel log "
                                    "tells the two apart")
            echoes = [r for r in agg.failure_order() if r not in {x for g in gone for x in g["ranks"]}]
            if echoes:
                evidence.append(f"{rank_phrase(echoes)} then failed: "
                                + "; ".join(f"rank {r} {agg.ranks[r].how_ended()}" for r in echoes[:4]))
            names = ", ".join(g["host"] for g in gone)
            lost_ranks = sorted(x for g in gone for x in g["ranks"])
            return {**base, "class": HOST_LOST,
                    "summary": f"host {names} lost: every one of its ranks ({rank_phrase(lost_ranks)}) vanished at "
                               f"once without an exit status",
                    "next_step": NEXT_STEP[HOST_LOST].format(host=names, here=here or "this host")}

    # A crash whose first failure is only a peer-gone echo, while a whole other host had already gone silent: the
    # link or that host went first, and the echo is its consequence (a blocked port, a cut link: the silent
    # host then ends its own ranks on its lost-contact verdict, and the connections it closed fail ours).
    order = agg.failure_order() if status == _CRASH else []
    echo_first = bool(order) and agg.ranks[order[0]].echo
    quiet = silent_hosts(agg, here, now) if status == _HANG or echo_first else []
    if quiet:
        base["silent_hosts"] = [{"host": q["host"], "ranks": q["ranks"], "last_report": clock(_wall(agg, q["since"])),
                                 "age_s": q["age_s"]} for q in quiet]
        reporting = [r for r in others if r not in {x for q in quiet for x in q["ranks"]}
                     and not agg.ranks[r].finished and r not in silent]
        for q in quiet:
            evidence.append(f"no report from {rank_phrase(q['ranks'])} on {q['host']} since "
                            f"{clock(_wall(agg, q['since']))}, {q['age_s']:.0f} s before the verdict; their watch "
                            "connections are still open (no close, no exit status): the processes are not known "
                            "to be dead")
        if reporting:
            evidence.append(f"{on(reporting)} kept reporting until the verdict")
        if echo_first:
            evidence.append(f"{rank_phrase(order)} then failed, a peer gone: "
                            + "; ".join(f"rank {r} {agg.ranks[r].how_ended()}" for r in order[:4]))
        names = ", ".join(q["host"] for q in quiet)
        return {**base, "class": PARTITION,
                "summary": f"{names} stopped answering: a cut link or a partition between {here or 'this host'} and "
                           f"{names} (or {names} froze as a whole); not a fault in the training code",
                "next_step": NEXT_STEP[PARTITION].format(host=names, here=here or "this host")}

    early = early_exit(agg) if status == _CRASH else None
    if early is not None:
        summary = early_exit_text(early)
        evidence.append(f"{on([early['rank']])} exited with code 0 first")
        evidence.append(f"then {rank_phrase(early['then'])} failed: {early['echo']} (a peer went away)")
        return {**base, "class": CRASH_CLASS, "user_code": True, "summary": summary,
                "next_step": NEXT_STEP[EARLY_EXIT]}
    if status == _CRASH:
        order = agg.failure_order()
        first = order[0] if order else None
        if first is not None:
            state = agg.ranks[first]
            evidence.append(f"{on([first])} {state.how_ended()}")
            if len(order) > 1:
                evidence.append(f"then {rank_phrase(order[1:])} failed")
        return {**base, "class": CRASH_CLASS, "user_code": True,
                "summary": f"{on([first])} {agg.ranks[first].how_ended()}" if first is not None else "the script failed",
                "next_step": NEXT_STEP[CRASH_CLASS]}

    involved = _involved(divergence)
    alive = not any(r in silent or agg.ranks[r].finished for r in involved)
    if divergence and status == _HANG and alive and busy_only(divergence):
        busy = sorted({entry["busy"] for entry in divergence["behind"]})
        late = sorted({r for entry in divergence["behind"] for r in entry["ranks"]})
        return {**base, "class": HANG_CLASS, "user_code": True,
                "summary": f"{rank_phrase(late)} has not reached the collective the others wait in: busy in its own "
                           f"code at {', '.join(busy)}",
                "next_step": f"if the phase at {', '.join(busy)} (an evaluation, a checkpoint, loading data) is "
                             f"expected to take longer than {agg.hang_timeout_s:g} s, raise --hang-timeout above its "
                             "duration; otherwise that line is the hang (what keeps it from reaching the call the "
                             "others wait in)"}
    if status == _MISMATCH or (divergence and alive and not stall):
        if silent:
            evidence.append("no report from " + "; ".join(
                f"{on([r])} since {clock(verdict_at - a)}" for r, a in sorted(silent.items())))
        return {**base, "class": DESYNC, "user_code": alive,
                "summary": "the ranks are alive and reporting, in different collectives" if alive else
                           "the ranks are in different collectives, and not all of them are reporting",
                "next_step": NEXT_STEP[DESYNC]}
    same = same_call(agg) if status == _HANG and not silent and not stall else None
    if same is not None:
        evidence.append(f"{on(same['ranks'])} all wait in {same['op']} #{same['seq']}"
                        + (f" {same['desc']}" if same.get("desc") else "")
                        + (f" on {same['group']}" if same["group"] != "WORLD" else "")
                        + f" at {same['site']}: the same call, issued alike, and it has not completed")
        return {**base, "class": HANG_CLASS, "user_code": False, "same_call": same,
                "summary": f"every rank is in the same {same['op']} #{same['seq']} and it does not complete",
                "next_step": NEXT_STEP[SAME_CALL].format(timeout=agg.hang_timeout_s)}
    if silent:
        evidence.append("no report from " + "; ".join(
            f"{on([r])} since {clock(verdict_at - a)}, {a:.0f} s before the verdict" for r, a in sorted(silent.items())))
    return {**base, "class": STALL if stall else HANG_CLASS, "user_code": not silent,
            "summary": "no rank made progress" if not stall else "every rank is busy in its own code",
            "next_step": "where each rank waits, below"}


def same_call(agg: Aggregator) -> dict[str, Any] | None:
    """Every rank alive and inside one and the same collective (group, number, op, shapes): the code issued it
    alike everywhere, so a hang there is the collective not finishing (a slow or shaped link, a transport on the
    wrong interface, a GPU fault), not a skipped or reordered call of the script's: by watch's count, which does
    not see DDP's own gradient all_reduces (the Flight Recorder does: :func:`weigh_flight_recorder`). None
    otherwise."""
    states = list(agg.ranks.values())
    if len(states) < 2 or any(s.finished or not s.connected or s.cur is None for s in states):
        return None
    calls = {(s.cur.get("group"), s.cur.get("seq"), s.cur.get("op"), s.cur.get("sig")) for s in states}
    if len(calls) != 1 or next(iter(calls))[1] is None:
        return None
    first = states[0].cur
    return {"op": first["op"], "seq": first["seq"], "group": first.get("group") or "WORLD",
            "desc": first.get("desc", ""), "site": first.get("site"), "ranks": sorted(agg.ranks)}


def weigh_flight_recorder(failure: dict[str, Any] | None, fr: dict[str, Any] | None) -> None:
    """A same-call hang (:func:`same_call`) rests on watch's own count of the collectives the script calls; the
    Flight Recorder also counts those watch never sees (DDP's gradient all_reduces, issued from C++). When its
    dumps, from every rank, say the ranks' collectives differ (a backward skipped on one rank shifts NCCL's
    sequence under an all_reduce every rank then calls alike), the code is in question after all: the failure
    says so, in place (``failure`` is the ``failure`` object of the result; ``fr`` its ``fr`` entry)."""
    if not failure or not failure.get("same_call") or not fr:
        return
    if fr.get("status") != "fail" or fr.get("missing_ranks"):
        return
    same = failure["same_call"]
    failure["user_code"] = True
    failure["evidence"].append(f"the Flight Recorder, which also counts the collectives watch does not see (DDP's "
                               f"gradient all_reduces), found the ranks' collectives differ: {fr.get('summary', '')}")
    failure["summary"] = (f"every rank is in the same {same['op']} #{same['seq']} by watch's count, but the Flight "
                          "Recorder found the ranks' collectives differ")
    failure["next_step"] = NEXT_STEP[SAME_CALL_FR].format(path=fr.get("path") or "FOLDER")


def early_exit_text(early: dict[str, Any]) -> str:
    """'rank 1 exited with code 0 while rank 0 was still in all_reduce #3 at faulty.py:46; rank 0 then failed
    (Connection closed by peer): a rank that ends early ... leaves the others in a collective'."""
    call = early.get("in")
    if call and call.get("op"):
        seq = f" #{call['seq']}" if call.get("seq") is not None else ""
        where = f"in {call['op']}{seq} at {call.get('site') or '?'}"
    else:
        where = f"at {early['site']}" if early.get("site") else "running"
    victim = early["echo_rank"]
    return (f"rank {early['rank']} exited with code 0 while rank {victim} was still {where}; "
            f"{rank_phrase(early['then'])} then failed ({early['echo']}): a rank that ends early (fewer batches, an "
            "early return or sys.exit) leaves the others in a collective")


def busy_only(divergence: dict[str, Any]) -> bool:
    """Every rank behind at the divergence is busy in its own code before the call (``behind[].busy``) and no
    rank is inside another collective: a rank that has not reached a call yet, not a desync (a skip shows as a
    rank in another collective, or waiting for the GPU on work it issued past the call)."""
    behind = divergence.get("behind") or []
    return bool(behind) and all(entry.get("busy") for entry in behind) and not any(
        group.get("state") == "elsewhere" for group in divergence.get("groups") or [])


def _involved(divergence: dict[str, Any] | None) -> list[int]:
    if not divergence:
        return []
    ranks = [r for group in divergence.get("groups") or [] for r in group.get("ranks", [])]
    ranks += [r for entry in divergence.get("behind") or [] for r in entry.get("ranks", [])]
    return sorted(set(ranks))


def lost_contact(host: str, ranks: list[int], supervisor: str, hosts: dict[str, list[int]], since_wall: float,
                 waited_s: float) -> dict[str, Any]:
    """The ``failure`` object a host writes for itself when the supervisor (rank 0's host, the job's store)
    went silent: ``supervisor`` is its address, ``hosts`` the rank map it last sent."""
    theirs = next((h for h, r in hosts.items() if 0 in r), "")
    their_ranks = hosts.get(theirs, [0]) if theirs else [0]
    name = theirs or supervisor
    who = f"{name} (the store and the watch supervisor at {supervisor}, {rank_phrase(their_ranks)})"
    return {"class": LOST_CONTACT, "hosts": [{"host": h, "ranks": r} for h, r in hosts.items()],
            "lost_hosts": [], "silent_hosts": [{"host": name, "ranks": their_ranks, "last_report": clock(since_wall),
                                                "age_s": round(waited_s, 1)}],
            "silent_ranks": [], "user_code": False,
            "summary": f"lost contact with {who} at {clock(since_wall)}",
            # "N s before this verdict", not "--hang-timeout": a closed connection decides at once (1 s after the
            # last word), silence only after the timeout.
            "evidence": [f"no word from {name}'s watch supervisor since {clock(since_wall)} ({waited_s:.0f} s before "
                         f"this verdict); {rank_phrase(ranks)} on {host or 'this host'} "
                         f"{'was' if len(ranks) == 1 else 'were'} still running"],
            "next_step": NEXT_STEP[PARTITION].format(host=name, here=host or "this host")}


# -- blame within a crash or a divergence: who caused it, who only followed --------------------------

# The site watch appends to a rank's error: "... (at train.py:12)".
_ERROR_SITE = re.compile(r" \(at ([^()]*:\d+)\)$")


def _was_in(state: RankState, call: dict[str, Any] | None, site: str | None) -> bool:
    """``call`` (its last beat's call, or the last it issued) is the one it failed in: at the failure's line,
    and not one it completed (a beat's ``cur`` can be a second old)."""
    if not call or call.get("seq") is None or site is None or call.get("site") != site:
        return False
    last = state.last or {}
    return not (last.get("group") == call.get("group") and int(last.get("seq") or 0) >= int(call["seq"]))


def early_exit(agg: Aggregator) -> dict[str, Any] | None:
    """A rank that ended well (exit code 0) while another still needed it: the cause of a crash whose first
    failure is only the echo of a peer going away (gloo's "Connection closed by peer").

    A rank that runs fewer steps (an uneven last batch, a ``continue``, an early ``return`` or ``sys.exit(0)``)
    ends cleanly and closes its connections; the rank still in a collective then fails on the closed socket.
    The failed rank is only the echo: without this the report named it, and explain's advice for the echo
    ("look at the other ranks' logs") sent the reader to a log with nothing in it. Only when the first failure
    is such an echo and the clean exit came before it (within :data:`ECHO_WINDOW_S`: the echo can be timed a
    little before the exit is seen), so a real crash that came first keeps its place."""
    order = agg.failure_order()
    if not order:
        return None
    victim = agg.ranks[order[0]]
    if not victim.echo or victim.ended_at is None:
        return None
    early = [s for s in agg.ranks.values() if s.finished and not s.failed and s.exit_code == 0
             and s.ended_at is not None and s.ended_at <= victim.ended_at + ECHO_WINDOW_S]
    if not early:
        return None
    first = min(early, key=lambda s: (s.ended_at or 0.0, s.rank))
    found = ECHO.search(victim.error)
    site = _ERROR_SITE.search(victim.error)
    were_in = next((call for call in (victim.ended_in, victim.history[-1] if victim.history else None)
                    if _was_in(victim, call, site[1] if site else None)), None)
    return {"rank": first.rank, "code": 0, "then": order,
            "echo_rank": victim.rank, "echo": found[0] if found else victim.error,
            "site": site[1] if site else None,
            "in": {k: were_in.get(k) for k in ("op", "seq", "group", "site", "desc")} if were_in else None}


def busy_at(state: RankState, missed: str | None) -> str | None:
    """The line of its own code a rank that is behind is busy at, when nothing shows it went past the call
    the others wait in (``missed``, its site): its stack is in its own code or I/O (a sleep, an evaluation, a
    checkpoint), nothing it issued is pending, and it is not at a later line of the call's own file. Such a
    rank has not reached the call yet (a long phase before ``barrier()``), which the issue counts alone cannot
    tell from a skip. A rank waiting for the GPU or on pending work moved on (NCCL's shape of a skip:
    ``.item()`` after the collective it never issued), and one a few lines below the call in its file, one
    collective short, went past it. None when it may have moved on."""
    wait = classify_wait(None, state.frames or [], state.inflight, state.loader)
    if wait["kind"] not in STALL_KINDS or wait["pending"] or state.inflight_n:
        return None
    site = wait["site"] or innermost(state.stack)
    if site and missed and _past(site, missed):
        return None
    return site


def _past(site: str, call: str) -> bool:
    """``site`` is a later line of ``call``'s file ('t.py:40' against 't.py:37'): a rank there, one collective
    short, went past the call's line without issuing it (a ``continue``, a branch)."""
    file, _, line = site.rpartition(":")
    call_file, _, call_line = call.rpartition(":")
    return file == call_file and line.isdigit() and call_line.isdigit() and int(line) > int(call_line)
