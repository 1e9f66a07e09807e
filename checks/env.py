"""`env`: the environment every rank runs in, compared across ranks.

What fails in real life: one node exports ``NCCL_SOCKET_IFNAME=eth0`` while the others have ``ib0``; a
rank runs another torch version from a stale venv; ``NCCL_SOCKET_IFNAME`` names an interface the host does
not have; ``/dev/shm`` is Docker's 64 MB. How it shows up: NCCL hangs at the first collective, or
``NCCL WARN Bootstrap : no socket interface found``, ``ncclSystemError: ... unhandled system error``,
``Error while creating shared memory segment``; old ``NCCL_ASYNC_ERROR_HANDLING`` prints a deprecation
warning and will stop working.
Reproduce by hand: ``NCCL_SOCKET_IFNAME=nosuch0 ddpdoctor check --only env``, or under torchrun give one
rank a different value of any ``NCCL_*`` variable.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddpdoctor import envinfo
from ddpdoctor.check_api import Check, CheckContext, all_findings, collapse, format_rank_list
from ddpdoctor.findings import FAIL, PASS, WARN, Finding, RankInfo

FACTS = "environment collected"

# Variables that legitimately differ per rank (one GPU per rank, thread pools per host): a difference
# is worth a warning, not a failure.
PER_RANK_OK = {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}


def _run(ctx: CheckContext) -> list[Finding]:
    variables = envinfo.watched_env()
    findings = [ctx.finding(PASS, FACTS, vars=variables, versions=envinfo.versions(),
                            world_size=ctx.world_size, local_world_size=ctx.local_world_size, host=ctx.host)]
    names = list(envinfo.interfaces())
    for var, problem_of in (("NCCL_SOCKET_IFNAME", envinfo.nccl_ifname_problem),
                            ("GLOO_SOCKET_IFNAME", envinfo.gloo_ifname_problem)):
        if var in variables:
            problem = problem_of(variables[var], names)
            if problem:
                findings.append(ctx.finding(
                    FAIL, f"{var}={variables[var]} {problem}",
                    f"set {var} to an interface this host has (see `ip -br addr` on {ctx.host}), "
                    "or unset it to let the library choose"))
    for old, new in envinfo.DEPRECATED_VARS.items():
        if old in variables:
            findings.append(ctx.finding(WARN, f"{old} is deprecated", f"use {new}={variables[old]} instead"))
    shm = envinfo.shm_bytes()
    if shm is not None and shm < envinfo.MIN_SHM_BYTES and ctx.backend == "nccl" and ctx.local_world_size > 1:
        findings.append(ctx.finding(
            WARN, f"/dev/shm is only {shm // (1 << 20)} MiB",
            "NCCL needs shared memory between local ranks: run the container with --shm-size=8g "
            "(or --ipc=host), or mount a larger /dev/shm", shm_bytes=shm))
    return findings


def _differences(label: str, values_by_rank: Mapping[int, object]) -> str | None:
    """'X differs: "a" on ranks 0-2; "b" on rank 3' when values differ, else None."""
    holders: dict[str, list[int]] = {}
    for rank, value in values_by_rank.items():
        holders.setdefault(repr(value) if value is not None else "(unset)", []).append(rank)
    if len(holders) <= 1:
        return None
    parts = [f"{value} on rank{'s' if len(r) > 1 else ''} {format_rank_list(r)}"
             for value, r in sorted(holders.items(), key=lambda item: -len(item[1]))]
    return f"{label} differs across ranks: " + "; ".join(parts)


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    facts = {f.ranks[0]: f.details for f in all_findings(findings_by_rank) if f.summary == FACTS}
    others = [f for f in all_findings(findings_by_rank) if f.summary != FACTS]
    result: list[Finding] = []
    if facts:
        all_vars = sorted({name for d in facts.values() for name in d["vars"]})
        for name in all_vars:
            message = _differences(name, {r: d["vars"].get(name) for r, d in facts.items()})
            if message:
                values = {r: d["vars"].get(name) for r, d in facts.items()}
                common = max(set(values.values()), key=list(values.values()).count)
                outliers = sorted(r for r, v in values.items() if v != common)
                status = WARN if name in PER_RANK_OK else FAIL
                result.append(Finding(
                    "env", status, message, outliers,
                    f"export the same {name} on every rank (set it in the launch script, not per node), "
                    "unless the difference is deliberate", {"variable": name, "values": {str(r): v for r, v in values.items()}}))
        for key in ("torch", "python", "cuda", "nccl"):
            message = _differences(f"{key} version", {r: d["versions"].get(key) for r, d in facts.items()})
            if message:
                result.append(Finding("env", FAIL, message, sorted(facts),
                                      f"install the same {key} version on every node (same container image or venv)"))
        sizes = _differences("WORLD_SIZE", {r: d["world_size"] for r, d in facts.items()})
        if sizes:
            result.append(Finding("env", FAIL, sizes, sorted(facts), "launch every node with the same world size"))
        if not result and not [f for f in others if f.status != PASS]:
            versions = next(iter(facts.values()))["versions"]
            result.append(Finding(
                "env", PASS, f"{len(all_vars)} watched variables and versions agree "
                f"(torch {versions.get('torch')}, python {versions.get('python')})", sorted(facts),
                details={"vars": next(iter(facts.values()))["vars"], "versions": versions}))
    return result + collapse(others)


CHECK = Check(id="env", title="Environment and versions consistent across ranks", run=_run, combine=_combine)
