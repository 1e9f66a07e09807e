"""`unused_params`: parameters that get no gradient (on every rank, some steps, or some ranks) and a model
that differs across ranks.

What fails in real life: a layer left in ``__init__`` but never called, a head only some batches use, a
branch on ``dist.get_rank()``, a second model output left out of the loss (``logits, _ = model(x)``), or
``torch.manual_seed(rank)`` before building the model. How it shows up (torch 2.13, the second iteration):

    RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.
    This error indicates that your module has parameters that were not used in producing loss. You can
    enable unused parameter detection by passing the keyword argument `find_unused_parameters=True` ...

on the rank with the unused parameter, while the other ranks see gloo's ``Connection closed by peer`` or
hang in NCCL; with ``static_graph=True`` and a data-dependent branch: "Your training graph has changed in
this iteration"; with reentrant checkpointing: "Expected to mark a variable ready only once"; with a model
built differently per rank: "DDP expects same model across all ranks, but Rank 1 has 6 params, while rank
0 has inconsistent 8 params" or "params[0] in this process with sizes [40, 16] appears not to match sizes
of the same param in process 0".

Each rank builds the model from ``--model MODULE:FACTORY`` (called with no arguments, after the process
group exists, so the factory may read the rank) and runs ``ddpdoctor.find_unused_parameters`` for
``STEPS`` steps on batches from ``--batch MODULE:FN`` (called per step with those of the keyword arguments
``step``, ``rank``, ``world_size`` it declares) or random normal batches of ``--input-shape`` (a different
one per rank and step, like a DistributedSampler shard). Rank 0 compares the ranks: a parameter used on
some ranks and never on others is named with its ranks, and so is every parameter or buffer whose name,
shape, dtype or value checksum differs from rank 0's.

Reproduce by hand: ``ddpdoctor check --only unused_params --model examples/models_unused.py:rank_dependent
--input-shape 4,16 --nproc 2``, or wrap ``examples/models_unused.py:dead_branch`` in DDP under torchrun and
take two optimizer steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpdoctor.check import Check, CheckContext, all_findings, collapse
from ddpdoctor.errors import DoctorError
from ddpdoctor.findings import ERROR, FAIL, PASS, SKIP, WARN, Finding, RankInfo
from ddpdoctor.ranks import rank_phrase

CHECK_ID = "unused_params"
STEPS = 4
ANALYSED = "model analysed"
MAX_NAMES = 6
PROBE_SEEDS = (12345, 54321)


def _run(ctx: CheckContext) -> list[Finding]:
    if not ctx.options.model:
        return [ctx.finding(SKIP, "no --model given", "pass --model MODULE:FACTORY (and --batch MODULE:FN "
                            "or --input-shape) to check parameter usage and model consistency")]
    if not (ctx.options.batch or ctx.options.input_shape):
        # --model came for the state_dict check (--checkpoint); the command refuses a bare --model.
        return [ctx.finding(SKIP, "no --batch or --input-shape given: parameter usage not checked",
                            "add --batch MODULE:FN or --input-shape 4,16 to run the model here")]
    import torch

    from ddpdoctor.modelspec import build_model
    from ddpdoctor.unused import batch_source, compare_fingerprints, find_unused_parameters, fingerprint

    try:
        # Torch seeds each fresh process differently, so an unseeded factory gives different weights on
        # every rank (harmless: DDP broadcasts rank 0's at construction). Building twice under two global
        # seeds tells whether the factory fixes its weights itself (a seed, a checkpoint): only then is a
        # cross-rank difference a real one (`torch.manual_seed(rank)`, different checkpoints).
        torch.manual_seed(PROBE_SEEDS[0])
        prints = fingerprint(build_model(ctx.options.model))
        torch.manual_seed(PROBE_SEEDS[1])
        model = build_model(ctx.options.model)
        second = fingerprint(model)
        seeded = not compare_fingerprints({0: prints, 1: second})
        batches = batch_source(model, ctx.options.batch, ctx.options.input_shape, ctx.rank, ctx.world_size)
        report = find_unused_parameters(model, batches, steps=STEPS, copy_model=False)
    except DoctorError as exc:
        return [ctx.finding(ERROR, f"cannot analyse the model: {exc}",
                            "fix the factory or the batch so that one forward/backward runs in a plain script")]
    never, sometimes, twice = report.never_used, report.sometimes_used, report.accumulated_twice
    status = FAIL if never or report.harmful_dead_outputs else WARN if sometimes or twice else PASS
    return [ctx.finding(
        status, ANALYSED, "",
        steps=report.steps, used_steps={p.name: p.used_steps for p in report.params},
        owners={p.name: p.module for p in report.params},
        accumulated_twice=twice, dead_outputs=[d.path for d in report.harmful_dead_outputs],
        dead_output_params=sorted({n for d in report.harmful_dead_outputs for n in d.params}),
        fingerprint=[vars(p) for p in second], seeded=seeded)]


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")


def _usage_findings(facts: Mapping[int, dict[str, Any]]) -> list[Finding]:
    ranks = sorted(facts)
    names = list(dict.fromkeys(n for r in ranks for n in facts[r]["used_steps"]))
    dead_params = {n for r in ranks for n in facts[r]["dead_output_params"]}
    never: list[str] = []
    sometimes: list[str] = []
    by_split: dict[tuple[int, ...], list[str]] = {}
    for name in names:
        used = {r: facts[r]["used_steps"].get(name, 0) for r in ranks}
        used_on = [r for r in ranks if used[r] > 0]
        if not used_on:
            never.append(name)
        elif len(used_on) < len(ranks):
            by_split.setdefault(tuple(used_on), []).append(name)
        elif any(used[r] < facts[r]["steps"] for r in ranks):
            sometimes.append(name)
    result: list[Finding] = []
    for split, group in by_split.items():
        used_on, unused_on = list(split), [r for r in ranks if r not in split]
        result.append(Finding(
            CHECK_ID, FAIL, f"{len(group)} parameter(s) used on {rank_phrase(used_on)} but never on "
            f"{rank_phrase(unused_on)}: {_names(group)}", unused_on,
            "rank-dependent control flow: DDP fails with 'Expected to have finished reduction in the prior "
            "iteration' (or hangs); make forward the same on every rank, or pass "
            "find_unused_parameters=True to DistributedDataParallel",
            {"params": group, "used_on_ranks": used_on, "unused_on_ranks": unused_on}))
    if never:
        via_dead = [n for n in never if n in dead_params]
        dead = sorted({p for r in ranks for p in facts[r]["dead_outputs"]})
        remedy = ("remove them or set requires_grad=False; until then DistributedDataParallel(..., "
                  "static_graph=True) or find_unused_parameters=True avoids 'Expected to have finished "
                  "reduction in the prior iteration'")
        if via_dead:
            remedy = (f"they only feed {', '.join(dead)}, which the loss does not use: put it in the loss or "
                      "stop returning it; until then find_unused_parameters=True is needed "
                      "(static_graph=True fails on outputs left out of the loss)")
        result.append(Finding(CHECK_ID, FAIL, f"{len(never)} parameter(s) never used on any rank: {_names(never)}",
                              ranks, remedy, {"params": never, "dead_outputs": dead}))
    if sometimes:
        result.append(Finding(
            CHECK_ID, WARN, f"{len(sometimes)} parameter(s) used on some steps only (input-dependent): "
            f"{_names(sometimes)}", ranks,
            "DistributedDataParallel(..., find_unused_parameters=True) is required (static_graph=True fails: "
            "'Your training graph has changed in this iteration'); fine if you already set it",
            {"params": sometimes}))
    twice = sorted({n for r in ranks for n in facts[r]["accumulated_twice"]})
    if twice:
        result.append(Finding(
            CHECK_ID, WARN, f"{len(twice)} parameter(s) get their gradient accumulated twice per backward: "
            f"{_names(twice)}", ranks,
            "reentrant activation checkpointing reuses them ('Expected to mark a variable ready only once'): "
            "use torch.utils.checkpoint.checkpoint(..., use_reentrant=False), or static_graph=True",
            {"params": twice}))
    if not result:
        result.append(Finding(CHECK_ID, PASS, f"all {len(names)} trainable parameters get a gradient on every "
                              f"step on {rank_phrase(ranks)}", ranks,
                              "keep find_unused_parameters=False (the default): True would only cost time",
                              {"params": len(names), "steps": facts[ranks[0]]["steps"]}))
    return result


def _consistency_findings(facts: Mapping[int, dict[str, Any]]) -> list[Finding]:
    from ddpdoctor.unused import compare_fingerprints

    ranks = sorted(facts)
    diffs = compare_fingerprints({r: facts[r]["fingerprint"] for r in ranks})
    reference = ranks[0]
    structural = [d for d in diffs if d.field != "values"]
    values = [d for d in diffs if d.field == "values"]
    result: list[Finding] = []

    def outliers(group: list[Any]) -> list[int]:
        return sorted({r for d in group for members in d.values.values() for r in members
                       if reference not in members})

    if structural:
        result.append(Finding(
            CHECK_ID, FAIL, f"the model differs across ranks in {len(structural)} place(s): "
            + "; ".join(d.describe() for d in structural[:3]), outliers(structural),
            "build the same model on every rank (no rank-dependent config): DDP refuses it with 'DDP expects "
            "same model across all ranks' or 'appears not to match sizes of the same param in process 0'",
            {"differences": [vars(d) for d in structural]}))
    unseeded = [r for r in ranks if not facts[r].get("seeded", True)]
    if values and unseeded:
        values = []  # drawn from each process's own random seed: DDP's broadcast makes them equal
    if values:
        result.append(Finding(
            CHECK_ID, WARN, f"weights differ across ranks in {len(values)} tensor(s) (same shapes): "
            + _names([d.name for d in values]), outliers(values),
            "seed every rank the same before building the model (not seed + rank) and load the same checkpoint "
            "everywhere; DDP broadcasts rank 0's parameters and buffers when it wraps the model, so anything "
            "done before wrapping (or without DDP) sees different weights per rank",
            {"differences": [vars(d) for d in values]}))
    if not result:
        tensors = facts[reference]["fingerprint"]
        n_params = sum(1 for t in tensors if t["kind"] == "param")
        if unseeded:
            summary = (f"same model structure on {rank_phrase(ranks)}: {n_params} parameters, {len(tensors) - n_params} "
                       "buffers (names, shapes, dtypes; the factory does not seed, so weights differ per process "
                       "until DDP broadcasts rank 0's)")
        else:
            summary = (f"model identical on {rank_phrase(ranks)}: {n_params} parameters, {len(tensors) - n_params} "
                       "buffers (names, shapes, dtypes, value checksums)")
        result.append(Finding(CHECK_ID, PASS, summary, ranks))
    return result


def _combine(findings_by_rank: Mapping[int, list[Finding]], peers: Mapping[int, RankInfo]) -> list[Finding]:
    everything = all_findings(findings_by_rank)
    facts = {f.ranks[0]: f.details for f in everything if f.summary == ANALYSED and f.details}
    others = [f for f in everything if not (f.summary == ANALYSED and f.details)]
    if not facts:
        return collapse(others)
    return _usage_findings(facts) + _consistency_findings(facts) + collapse(others)


CHECK = Check(id=CHECK_ID, title="Unused parameters and model consistency across ranks", run=_run,
              combine=_combine)
