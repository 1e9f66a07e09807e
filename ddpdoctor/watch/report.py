"""Render a `ddpdoctor watch` outcome (the ``--json`` document) as the text a user reads.

Pure functions of the result dict, so the wording is tested without processes. The divergence line is
the one to read first: "collective #57 on WORLD: ranks 0,2 in all_reduce at train.py:55; rank 1 in
barrier at eval.py:40".
"""

from __future__ import annotations

import re
from typing import Any

from tabulate import tabulate

from ddpdoctor.ranks import rank_phrase
from ddpdoctor.watch.verdict import (
    EARLY_EXIT,
    HOST_LOST,
    LOST_CONTACT,
    NEXT_STEP,
    PARTITION,
    busy_only,
    clock,
    early_exit_text,
)

# The table's "now" column for a rank outside any recorded call, by where it waits (watch.waits).
_NOW = {"gpu": "waiting for the GPU", "dataloader": "waiting for a DataLoader worker", "lock": "waiting on a lock",
        "io": "in I/O", "not_started": "never arrived", "unknown": "unknown (no stack)"}


def call_text(call: dict[str, Any] | None, with_seq: bool = True) -> str:
    """'#57 all_reduce float32[4] at train.py:55'."""
    if not call:
        return "-"
    seq = call.get("seq")
    prefix = f"#{seq} " if with_seq and seq is not None else ""
    group = call.get("group")
    on = f" on {group}" if with_seq and seq is not None and group and group != "WORLD" else ""
    desc = f" {call['desc']}" if call.get("desc") else ""
    return f"{prefix}{call['op']}{desc}{on} at {call.get('site') or '?'}"


def host_map(result: dict[str, Any]) -> dict[int, str]:
    """rank -> host, only when the ranks span more than one host (one host: nothing to tell apart)."""
    hosts = {r["rank"]: r.get("host") or "" for r in result.get("ranks") or []}
    return hosts if len({h for h in hosts.values() if h}) > 1 else {}


def who_text(ranks: list[int], hosts: dict[int, str] | None = None) -> str:
    """'ranks 2-3' or, across hosts, 'ranks 2-3 on nodeB' / 'rank 1 on nodeA, ranks 2-3 on nodeB'."""
    if not hosts:
        return rank_phrase(ranks)
    by_host: dict[str, list[int]] = {}
    for rank in sorted(ranks):
        by_host.setdefault(hosts.get(rank) or "?", []).append(rank)
    return ", ".join(f"{rank_phrase(rs)} on {host}" for host, rs in by_host.items())


def divergence_line(div: dict[str, Any], hosts: dict[int, str] | None = None) -> str:
    """One line: where the ranks parted ways (with ``hosts``, each group of ranks names its host)."""
    parts = []
    for group in div["groups"]:
        who = who_text(group["ranks"], hosts)
        if group["state"] == "silent":
            since = f"since {clock(group['last_report'])}, " if group.get("last_report") else ""
            parts.append(f"{who}: no report {since}{group.get('age_s', 0):.0f} s before the verdict (where they are "
                         "now is not known)")
        elif group["state"] in ("exited", "crashed"):
            parts.append(f"{who} {_short(group['how'])}")
        elif group["op"] is None:
            parts.append(f"{who} not in any collective, running {group['site'] or 'its own code'}")
        elif group["state"] == "issued":
            desc = f" {group['desc']}" if group.get("desc") else ""
            now = group.get("now") or {}
            where = (f"in {now['op']} at {now.get('site') or '?'}" if now.get("op")
                     else f"running {now.get('site') or 'its own code'}")
            parts.append(f"{who} issued {group['op']}{desc} at {group['site'] or '?'} (not completed), now {where}")
        else:
            seq = group.get("seq")
            other = f" #{seq}" if group["state"] == "elsewhere" and seq is not None else ""
            desc = f" {group['desc']}" if group.get("desc") else ""
            parts.append(f"{who} in {group['op']}{other}{desc} at {group['site']}")
    return f"{point_name(div['group'], div['seq'])}: " + "; ".join(parts)


def behind_lines(div: dict[str, Any], hosts: dict[int, str] | None = None) -> list[str]:
    """'rank 1 never issued all_reduce #6 float32[4] (ranks 0,2 issued it at skip.py:20): it issued 5 on WORLD,
    they 6' -- the skipped collective, as it shows on NCCL (every host thread has moved on)."""
    lines = []
    for entry in div.get("behind") or []:
        what = f"{entry['op']} {point_name(div['group'], div['seq']).split(' ', 1)[1]}"
        desc = f" {entry['desc']}" if entry.get("desc") else ""
        head = (f"  {who_text(entry['ranks'], hosts)} never issued {what}{desc} ({who_text(entry['others'], hosts)} "
                f"issued it at {entry.get('site') or '?'}): {entry['issued']} issued on {div['group']} against "
                f"{entry['others_issued']}")
        if entry.get("busy"):
            # In its own code with nothing pending: it has not reached the call, as far as the evidence shows.
            lines.append(f"{head}; {'it has' if len(entry['ranks']) == 1 else 'they have'} not reached it: busy in "
                         f"{'its' if len(entry['ranks']) == 1 else 'their'} own code at {entry['busy']} (not in any "
                         "collective, nothing pending), so nothing shows a skip")
        else:
            lines.append(f"{head}; a collective skipped there (a rank-dependent branch, an early break or continue) "
                         "is the likely cause")
    return lines


def wait_lines(result: dict[str, Any]) -> list[str]:
    """'where each rank waits:' one line per group of ranks at the same place, the DataLoader worker's stack."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rank in result["ranks"]:
        wait = rank.get("wait")
        if wait:
            # Ranks at the same place group together, whatever the age of their pending calls.
            groups.setdefault(re.sub(r", [\d.]+ s ago\)", ")", wait["summary"]), []).append(rank)
    lines = []
    for ranks in groups.values():
        lines.append(f"  {rank_phrase([r['rank'] for r in ranks])}: {ranks[0]['wait']['summary']}")
        worker = ranks[0]["wait"].get("worker")
        if worker and worker.get("stack"):
            lines.append(f"    DataLoader worker {worker.get('id')} (pid {worker.get('pid')}) stack, innermost last:")
            lines += [f"      {line}" for line in worker["stack"][-12:]]
    return lines


def point_name(group: str, seq: int) -> str:
    """'collective #57', 'collective #3 on <group>', or 'message #2 from rank 1 to rank 0'."""
    if ":p2p:" in group:
        base, channel = group.split(":p2p:", 1)
        src, dst = channel.split("->", 1)
        return f"message #{seq} from rank {src} to rank {dst}" + ("" if base == "WORLD" else f" on {base}")
    return f"collective #{seq}" + ("" if group == "WORLD" else f" on {group}")


def claim_text(claim: dict[str, Any]) -> str:
    """'pid 123 at spawn_ddp.py:30: init_process_group(backend=gloo, init_method=env://, rank=0, world_size=2)'."""
    fields = ", ".join(f"{key}={claim.get(key)}" for key in ("backend", "init_method", "rank", "world_size")
                       if claim.get(key) is not None)
    timeout = f", timeout={claim['timeout_s']:g} s" if claim.get("timeout_s") is not None else ""
    return f"pid {claim.get('pid')} at {claim.get('site')}: init_process_group({fields}{timeout})"


def outside_lines(result: dict[str, Any]) -> list[str]:
    """A hang with someone outside every collective: who is stuck where, while whom waits in what."""
    outside = result.get("outside") or []
    if not outside:
        return []
    waiting: dict[str, list[int]] = {}
    for rank in result["ranks"]:
        if rank["state"] == "waiting" and rank["waiting_in"]:
            waiting.setdefault(call_text(rank["waiting_in"], with_seq=False), []).append(rank["rank"])
    waits = "; ".join(f"{rank_phrase(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {call}"
                      for call, ranks in waiting.items()) or "nobody waits"
    lines = []
    for entry in outside:
        if entry["rank"] is not None:
            who = f"rank {entry['rank']}"
        else:
            index = f", process index {entry['index']}" if entry.get("index") is not None else ""
            who = f"a started process (pid {entry['pid']}{index})"
        before = " (it never reached its first one)" if entry.get("before_init") else ""
        lines.append(f"  {who} is stuck outside any collective{before}, at {entry['site'] or 'an unknown line'}; "
                     f"meanwhile {waits}")
    return lines


def failure_headline(result: dict[str, Any]) -> str | None:
    """The headline of a host-level failure (a host lost, a partition, a lost supervisor), else None."""
    failure = result.get("failure") or {}
    kind = failure.get("class")
    if kind == HOST_LOST:
        return f"ddpdoctor watch: HOST LOST: {failure['summary']}; the job was torn down"
    if kind == PARTITION and result["status"] == "crash":  # a rank's collective failed on the silent host's end
        return f"ddpdoctor watch: LINK OR PARTITION: {failure['summary']}; the job was torn down"
    if kind == PARTITION:
        return (f"ddpdoctor watch: LINK OR PARTITION: no progress for {result['hang_timeout_s']:g} s and "
                f"{failure['summary']}; the job was torn down")
    if kind == LOST_CONTACT:
        host = result.get("host") or "this host"
        return f"ddpdoctor watch on {host}: LOST CONTACT: {failure['summary']}; ending this host's ranks"
    return None


def failure_lines(result: dict[str, Any]) -> list[str]:
    """The evidence (who reported what, when), then the conclusion and the next step."""
    failure = result.get("failure") or {}
    lines = []
    if failure.get("evidence"):
        lines += ["", "what was seen (who reported what, when):", *(f"  {line}" for line in failure["evidence"])]
    if failure.get("class") in (HOST_LOST, PARTITION, LOST_CONTACT) or failure.get("same_call"):
        lines += ["", f"conclusion: {failure['summary']}"]
    return lines


def hosts_line(result: dict[str, Any]) -> list[str]:
    """'hosts: nodeA: ranks 0-1; nodeB: ranks 2-3' when the ranks span more than one host."""
    hosts = result.get("hosts") or []
    if len(hosts) < 2:
        return []
    return ["", "hosts: " + "; ".join(f"{h['host']}: {rank_phrase(h['ranks'])}" for h in hosts)]


def headline(result: dict[str, Any]) -> str:
    status, ws = result["status"], result["world_size"]
    special = failure_headline(result)
    if special:
        return special
    if status == "init_conflict":
        return (f"ddpdoctor watch: INIT CONFLICT: {result['init_conflict']['summary']}; the job was stopped "
                "before the rendezvous")
    rendezvous = result.get("rendezvous") if status == "hang" else None
    if rendezvous and rendezvous["never_arrived"]:
        missing, waiting = rendezvous["never_arrived"], rendezvous["waiting"]
        return (f"ddpdoctor watch: HANG in the rendezvous: {rank_phrase(missing)} never arrived; "
                f"{rank_phrase(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for "
                f"{'it' if len(missing) == 1 else 'them'} in init_process_group (no progress for "
                f"{result['hang_timeout_s']:g} s); the job was torn down")
    if status == "hang" and result.get("stall"):
        return (f"ddpdoctor watch: STALL: no rank made progress for {result['hang_timeout_s']:g} s ({_ranks(ws)}), and "
                "none waits for another rank, the GPU or a data worker: each is busy in its own code; the job was "
                "torn down")
    if status == "hang":
        return (f"ddpdoctor watch: HANG: no rank made progress for {result['hang_timeout_s']:g} s ({_ranks(ws)}); "
                "the job was torn down")
    if status == "mismatch":
        return "ddpdoctor watch: MISMATCH: the ranks issued different collectives at the same point; the job was torn down"
    if status == "crash":
        by_rank = {r["rank"]: r for r in result["ranks"]}
        order = [r for r in result.get("crash_order") or [] if r in by_rank]
        if not order:
            # A script that starts its own ranks failed in its own process (no rank did).
            code = result.get("script_exit_code")
            text = f"ddpdoctor watch: CRASH: the script exited with code {code}"
            if not ws:
                text += " before any process it started joined a process group: nothing was watched"
            return text
        if result.get("early_exit"):
            text = f"ddpdoctor watch: CRASH: {early_exit_text(result['early_exit'])}"
            if any(r["state"] in ("waiting", "running", "silent") for r in result["ranks"]):
                text += "; the rest were torn down"
            return text
        first = by_rank[order[0]]
        where = f" on {first['host']}" if host_map(result) and first.get("host") else ""
        text = f"ddpdoctor watch: CRASH: rank {first['rank']}{where} {ended_text(first)}"
        # A later rank that raised the very error of the first one, at the same place (the site is part of
        # the text), hit the same bug itself: "then failed" would read as a consequence of the first crash.
        same = [r for r in order[1:] if by_rank[r]["state"] == "crashed" and by_rank[r]["error"]
                and by_rank[r]["error"] == first["error"] and not by_rank[r]["signal"]]
        # Likewise ranks that each exited with the same code, with no error text, no signal, and no collective
        # issued by either (argparse rejecting an argument on every rank: exit 2): nobody waited for anybody.
        same_exit = [r for r in order[1:] if r not in same and _quiet_exit(by_rank[r])
                     and _quiet_exit(first) and by_rank[r]["exit_code"] == first["exit_code"]]
        rest = [r for r in order[1:] if r not in same and r not in same_exit]
        if same:
            text += (f" first; {rank_phrase(same)} raised the same at the same place (each rank hit it: not a "
                     f"consequence of rank {first['rank']}'s crash)")
        if same_exit:
            text += (f"{'' if same else ' first'}; {rank_phrase(same_exit)} exited with the same code (each rank "
                     f"ended so on its own, before any collective: not a consequence of rank {first['rank']}'s exit)")
        if rest:
            text += f"{'' if same or same_exit else ' first'}; then {rank_phrase(rest)} failed"
        if any(r["state"] in ("waiting", "running", "silent") for r in result["ranks"]):
            text += "; the rest were torn down"
        return text
    if result.get("launch") == "script" and not ws:
        return (f"ddpdoctor watch: the script ended (exit code {result['exit_code']}) before any process it started "
                "joined a process group: nothing was watched")
    return f"ddpdoctor watch: ok: {_ranks(ws)} finished (exit code {result['exit_code']})"


def _quiet_exit(rank: dict[str, Any]) -> bool:
    """It exited with a code of its own, no error text, no signal, and had issued no collective."""
    return (isinstance(rank["exit_code"], int) and rank["exit_code"] > 0 and not rank["error"]
            and not rank["signal"] and not any((rank.get("issued") or {}).values()))


def _ranks(count: int) -> str:
    return f"{count} rank" if count == 1 else f"{count} ranks"


def _short(text: str, limit: int = 100) -> str:
    """Gloo's errors run to 250 characters; the table and headline keep the start."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def ended_text(rank: dict[str, Any]) -> str:
    """How a rank ended, to follow 'rank N': 'exited with code 3', 'was killed by signal 9 (SIGKILL)'."""
    code = rank["exit_code"]
    if rank["signal"]:
        number = f"signal {-code} " if isinstance(code, int) and code < 0 else ""
        return f"was killed by {number}({rank['signal']})" if number else f"was killed by {rank['signal']}"
    if rank["error"] and rank["state"] == "crashed":
        return f"raised {_short(rank['error'])}"
    if code is None:
        return "lost its connection without an exit status"
    said = f": {_short(rank['error'])}" if rank["error"] and code == 1 else ""
    return f"exited with code {code}{said}"


def teardown_lines(teardown: dict[str, Any] | None) -> list[str]:
    """What needed SIGKILL after the grace, and what the script detached and watch left running."""
    if not teardown:
        return []
    lines = []
    grace = f"the {teardown['grace_s']:g} s grace after SIGTERM (--shutdown-timeout)"
    if teardown.get("sigkill_ranks"):
        ranks = teardown["sigkill_ranks"]
        lines += ["", f"{rank_phrase(ranks)} still ran after {grace} and needed SIGKILL"]
    elif teardown.get("sigkill_script"):
        lines += ["", f"the script's process still ran after {grace} and needed SIGKILL"]
    others = teardown.get("sigkill_others") or []
    if others:
        lines += ["", f"{len(others)} other process(es) of the job still ran after {grace} and needed SIGKILL: "
                  + ", ".join(f"pid {p['pid']}" for p in others[:10])]
    left = teardown.get("left_running") or []
    if left:
        lines += ["", "left running (the script started them in a session of their own; the run ended well):"]
        lines += [f"  pid {p['pid']}: {p['cmdline'] or '?'}" for p in left]
    return lines


def rank_table(result: dict[str, Any], hosts: dict[int, str]) -> list[str]:
    """The per-rank table (with a host column across hosts); a silent rank's "now" is its last report's age."""
    silent = {entry["rank"]: entry for entry in (result.get("failure") or {}).get("silent_ranks") or []}
    rows = []
    for rank in result["ranks"]:
        state = rank["state"]
        if rank["rank"] in silent and state not in ("exited", "crashed"):
            entry = silent[rank["rank"]]
            now = f"no report since {entry['last_report']} ({entry['age_s']:.0f} s before the verdict)"
        else:
            now = call_text(rank["waiting_in"]) if state == "waiting" else (
                ended_text(rank) if state in ("exited", "crashed") else
                _NOW.get(str((rank.get("wait") or {}).get("kind")), "its own code (no collective)"))
        host = [rank.get("host") or "?"] if hosts else []
        rows.append([rank["rank"], *host, state, _last_completed(rank), now])
    headers = ["rank", *(["host"] if hosts else []), "state", "last completed", "now"]
    return ["", tabulate(rows, headers=headers, tablefmt="simple")]


def _last_completed(rank: dict[str, Any]) -> str:
    """The last collective the rank's script called that completed; with none, the steps it completed. A DDP
    job whose only collectives are DDP's gradient all_reduces (issued from C++, never counted) read "-" after
    hundreds of steps, as if it had done nothing."""
    if rank["last_completed"] is None and (steps := (rank.get("steps") or {}).get("steps")):
        return f"- ({steps} step{'s' if steps != 1 else ''} done)"
    return call_text(rank["last_completed"])


def render(result: dict[str, Any], bundle: list[str] | None = None) -> str:
    """The report: headline, divergence, per-rank table, stacks, warnings; ``bundle``: the evidence bundle's
    file names (evidence.planned), which the last line names (without it, the kinds a bundle can hold)."""
    lines = [headline(result), *hosts_line(result)]
    failure = result.get("failure") or {}
    kind = failure.get("class")
    hosts = host_map(result)
    # Advice about the user's code only when every rank it involves is alive and reporting.
    user_code = failure.get("user_code", True) if failure else True
    conflict = result.get("init_conflict")
    if kind in (HOST_LOST, PARTITION, LOST_CONTACT):
        lines += failure_lines(result)
        if kind != LOST_CONTACT:
            lines += rank_table(result, hosts)
        lines += ["", f"next step: {failure['next_step']}"]
    elif conflict:
        lines += ["", "init_process_group was called with:"]
        lines += [f"  {claim_text(claim)}" for claim in conflict["claims"]]
        lines += ["", f"fix: {conflict['remedy']}"]
    elif result["status"] != "ok":
        div = result.get("divergence")
        stall = bool(result.get("stall"))
        lines += failure_lines(result) if hosts or failure.get("same_call") else []
        if div:
            lines += ["", "first divergence:", f"  {divergence_line(div, hosts)}",
                      *(behind_lines(div, hosts) if user_code else [])]
        elif result.get("outside") and any(rank["state"] == "waiting" for rank in result["ranks"]):
            lines += ["", "stuck outside the collectives:", *outside_lines(result)]
        rendezvous = result.get("rendezvous")
        if rendezvous and rendezvous.get("store_said"):
            lines += ["", f"rendezvous: {rendezvous['store_said']}"]
        waits = wait_lines(result)
        if waits:
            lines += ["", "where each rank waits:", *waits]
        lines += rank_table(result, hosts)
        for rank in result["ranks"]:
            if rank["stack"]:
                lines += ["", f"rank {rank['rank']} stack (user code, innermost last):"]
                lines += [f"  {entry}" for entry in rank["stack"][-12:]]
        for entry in result.get("outside") or []:
            if entry["rank"] is None and entry["stack"]:
                lines += ["", f"pid {entry['pid']} stack (no rank yet; user code, innermost last):"]
                lines += [f"  {line}" for line in entry["stack"][-12:]]
        kinds = {(rank.get("wait") or {}).get("kind") for rank in result["ranks"]}
        if result["status"] == "mismatch":
            lines += ["", "fix: every rank must issue the same collectives in the same order with the same "
                      "shapes and dtypes; look for a rank-dependent branch around the sites above"]
        elif rendezvous and rendezvous["never_arrived"]:
            lines += ["", "fix: start the missing ranks (a node that never launched, a process that died or is stuck "
                      "before init_process_group: see its state above), or give every process the same world size"]
        elif stall:
            lines += ["", f"fix: if this phase is expected to take longer than {result['hang_timeout_s']:g} s (an "
                      "evaluation, a checkpoint, loading data), raise --hang-timeout above its duration; otherwise "
                      "the lines above are where each rank is stuck"]
        elif result["status"] == "hang" and failure.get("same_call"):
            lines += ["", f"fix: {failure['next_step']}"]
        elif result["status"] == "hang" and not user_code:
            lines += ["", "next step: the ranks that stopped reporting first (above): their host and its link, before "
                      "any code; their last report is older than the verdict"]
        elif result["status"] == "hang" and div and busy_only(div) and failure.get("next_step"):
            lines += ["", f"fix: {failure['next_step']}"]  # the classification's words (verdict.classify)
        elif result["status"] == "hang" and div and div.get("behind"):
            lines += ["", "fix: every rank must issue the same collectives: make the branch that skips one the same "
                      "on every rank (decide it with an all_reduce of a flag), or still call the collective"]
        elif result["status"] == "hang" and "dataloader" in kinds and not div:
            lines += ["", "fix: a DataLoader worker never delivered its batch: its stack above is where it is stuck "
                      "(the dataset's __getitem__, a collate_fn, a lock or a library that is not fork-safe)"]
        elif result["status"] == "hang" and "gpu" in kinds and not div:
            lines += ["", "fix: the GPU never finished what the rank waits for: a kernel that does not end, or a "
                      "collective that another rank never joined (compare the pending collectives above); the Flight "
                      "Recorder dumps in the bundle show what NCCL itself saw"]
        elif result["status"] == "hang" and not div and result.get("outside"):
            lines += ["", "fix: the process named above never reached the collective the others wait in: look at what it "
                      "does at that line (data loading, a lock, input, a file on a slow filesystem); if it is work "
                      "one rank does alone on purpose (an evaluation, a checkpoint), the others wait for it in their "
                      f"next collective: raise --hang-timeout above its duration ({result['hang_timeout_s']:g} s now), "
                      "and init_process_group's timeout, which otherwise ends their wait with a timeout error"]
        elif result["status"] == "hang":
            lines += ["", "fix: a collective inside `if rank == ...` (or skipped by a data-dependent branch) must "
                      "run on every rank; if one rank legitimately works alone for longer, raise --hang-timeout"]
        elif result["status"] == "crash" and result.get("early_exit"):
            lines += ["", f"fix: {NEXT_STEP[EARLY_EXIT]}"]
        elif result["status"] == "crash" and (result.get("known_cause") or {}).get("source") == "output":
            known = result["known_cause"]
            first = (result.get("crash_order") or ["?"])[0]
            lines += ["", f"rank {first}'s last output says: {_short(known['line'], 300)}",
                      f"what that means (ddpdoctor explain: {known['id']}): {known['title']}",
                      f"fix: {known['remedy']}"]
        elif result["status"] == "crash" and result.get("known_cause"):
            known = result["known_cause"]
            lines += ["", f"what that exception means (ddpdoctor explain: {known['id']}): {known['title']}",
                      f"fix: {known['remedy']}"]
        elif result["status"] == "crash" and failure.get("next_step"):
            # No known cause to explain: where to look next, as the JSON's failure.next_step says.
            lines += ["", f"next step: {failure['next_step']}"]
    straggler = result.get("straggler")
    if straggler:
        lines += ["", f"warning: {straggler['summary']}", f"  fix: {straggler['remedy']}"]
    for warning in result.get("warnings", []):
        lines += ["", f"warning: {warning['summary']} (created at {warning['site']}, {rank_phrase(warning['ranks'])})",
                  f"  fix: {warning['remedy']}"]
    fr = result.get("fr")
    if fr:
        lines += ["", f"Flight Recorder (ddpdoctor fr {fr['path']}): {fr['summary']}"]
    ras = result.get("ras")
    if ras:
        dead, silent = ras.get("dead_ranks") or [], ras.get("unresponsive_ranks") or []
        said = [f"{rank_phrase(dead)} dead"] * bool(dead) + [f"{rank_phrase(silent)} not answering"] * bool(silent)
        lines += ["", f"NCCL RAS ({ras.get('addr')}): "
                  + (ras.get("error") or "; ".join(said) or "every rank NCCL knows is alive")]
    lines += teardown_lines(result.get("teardown"))
    if result.get("evidence"):
        held = bundle_phrase(bundle) if bundle is not None else (
            "verdict.json, report.txt, env.json, and per rank stack_rank_N.txt, history_rank_N.json, "
            "flight_recorder/fr_rank_N")
        lines += ["", f"evidence: {result['evidence']} ({held})"]
    return "\n".join(lines)


_PER_RANK_NAME = re.compile(r"^(?P<head>.*_rank_)(?P<rank>\d+)(?P<tail>(?:\.\w+)?)$")


def bundle_phrase(names: list[str]) -> str:
    """The evidence bundle's files as the report names them: the run's files, then each per-rank kind once with
    its ranks ("verdict.json, report.txt, env.json; stack_rank_N.txt for ranks 0-2; output_rank_N.txt for
    ranks 0-2"), so a crash before any collective does not send the reader looking for stacks or dumps."""
    single: list[str] = []
    per_rank: dict[str, list[int]] = {}
    for name in names:
        m = _PER_RANK_NAME.match(name)
        if m is None:
            single.append(name)
        else:
            per_rank.setdefault(f"{m['head']}N{m['tail']}", []).append(int(m["rank"]))
    return "; ".join([", ".join(single), *(f"{kind} for {rank_phrase(ranks)}" for kind, ranks in per_rank.items())])
