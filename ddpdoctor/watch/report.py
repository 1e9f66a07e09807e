"""Render a `ddpdoctor watch` outcome (the ``--json`` document) as the text a user reads.

Pure functions of the result dict, so the wording is tested without processes. The divergence line is
the one to read first: "collective #57 on WORLD: ranks 0,2 in all_reduce at train.py:55; rank 1 in
barrier at eval.py:40".
"""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from ddpdoctor.ranks import rank_phrase


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


def divergence_line(div: dict[str, Any]) -> str:
    """One line: where the ranks parted ways."""
    parts = []
    for group in div["groups"]:
        who = rank_phrase(group["ranks"])
        if group["state"] in ("exited", "crashed"):
            parts.append(f"{who} {_short(group['how'])}")
        elif group["op"] is None:
            parts.append(f"{who} not in any collective, running {group['site'] or 'its own code'}")
        else:
            seq = group.get("seq")
            other = f" #{seq}" if group["state"] == "elsewhere" and seq is not None else ""
            desc = f" {group['desc']}" if group.get("desc") else ""
            parts.append(f"{who} in {group['op']}{other}{desc} at {group['site']}")
    return f"{point_name(div['group'], div['seq'])}: " + "; ".join(parts)


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


def headline(result: dict[str, Any]) -> str:
    status, ws = result["status"], result["world_size"]
    if status == "init_conflict":
        return (f"ddpdoctor watch: INIT CONFLICT: {result['init_conflict']['summary']}; the job was stopped "
                "before the rendezvous")
    if status == "hang":
        return (f"ddpdoctor watch: HANG: no rank made collective progress for {result['hang_timeout_s']:g} s "
                f"({ws} ranks); the job was torn down")
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
        first = by_rank[order[0]]
        text = f"ddpdoctor watch: CRASH: rank {first['rank']} {ended_text(first)}"
        if len(order) > 1:
            text += f" first; then {rank_phrase(order[1:])} failed"
        if any(r["state"] in ("waiting", "running") for r in result["ranks"]):
            text += "; the rest were torn down"
        return text
    if result.get("launch") == "script" and not ws:
        return (f"ddpdoctor watch: the script ended (exit code {result['exit_code']}) before any process it started "
                "joined a process group: nothing was watched")
    return f"ddpdoctor watch: ok: {ws} ranks finished (exit code {result['exit_code']})"


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


def render(result: dict[str, Any]) -> str:
    """The report: headline, divergence, per-rank table, stacks, warnings."""
    lines = [headline(result)]
    conflict = result.get("init_conflict")
    if conflict:
        lines += ["", "init_process_group was called with:"]
        lines += [f"  {claim_text(claim)}" for claim in conflict["claims"]]
        lines += ["", f"fix: {conflict['remedy']}"]
    elif result["status"] != "ok":
        div = result.get("divergence")
        if div:
            lines += ["", "first divergence:", f"  {divergence_line(div)}"]
        elif result.get("outside"):
            lines += ["", "stuck outside the collectives:", *outside_lines(result)]
        rows = []
        for rank in result["ranks"]:
            state = rank["state"]
            now = call_text(rank["waiting_in"]) if state == "waiting" else (
                ended_text(rank) if state in ("exited", "crashed") else "its own code (no collective)")
            rows.append([rank["rank"], state, call_text(rank["last_completed"]), now])
        lines += ["", tabulate(rows, headers=["rank", "state", "last completed", "now"], tablefmt="simple")]
        for rank in result["ranks"]:
            if rank["stack"]:
                lines += ["", f"rank {rank['rank']} stack (user code, innermost last):"]
                lines += [f"  {entry}" for entry in rank["stack"][-12:]]
        for entry in result.get("outside") or []:
            if entry["rank"] is None and entry["stack"]:
                lines += ["", f"pid {entry['pid']} stack (no rank yet; user code, innermost last):"]
                lines += [f"  {line}" for line in entry["stack"][-12:]]
        if result["status"] == "mismatch":
            lines += ["", "fix: every rank must issue the same collectives in the same order with the same "
                      "shapes and dtypes; look for a rank-dependent branch around the sites above"]
        elif result["status"] == "hang" and not div and result.get("outside"):
            lines += ["", "fix: the process named above never reached the collective the others wait in: look at what it "
                      "does at that line (data loading, a lock, input, a file on a slow filesystem)"]
        elif result["status"] == "hang":
            lines += ["", "fix: a collective inside `if rank == ...` (or skipped by a data-dependent branch) must "
                      "run on every rank; if one rank legitimately works alone for longer, raise --hang-timeout"]
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
        lines += ["", f"evidence: {result['evidence']} (verdict.json, report.txt, env.json, and per rank "
                  "stack_rank_N.txt, history_rank_N.json, flight_recorder/fr_rank_N)"]
    return "\n".join(lines)
