"""The knowledge base: known messages (signatures) and what to tell the user about each.

The signatures are data (``kb.json`` next to this module, shipped in the wheel); each one names the texts
it matches (regexes, from the sources that print them: see ``tests/data/explain_inventory/``), its role in
a failure, and what the user should do. ``causes`` links say which other diagnosis a signature's event
brings about (a watchdog timeout ends in the SIGABRT that kills its rank): :mod:`.ranking` uses them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources

ROLE_ORDER = ("cause", "crash", "lagging-rank", "symptom", "warning")


@dataclass(frozen=True)
class Signature:
    """One known error message: how to find it and what to tell the user."""

    id: str
    role: str
    title: str
    keywords: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]
    extract: tuple[re.Pattern[str], ...]
    cause: str
    remedy: str
    command: str
    context: str = ""
    suppressed_by: tuple[str, ...] = ()
    followup_lines: int = 0
    followup_ids: tuple[str, ...] = ()
    # Within its role, a higher precedence comes first whatever the order of the lines: a rank killed by a
    # signal explains the peers that then exit with an error, even when torchrun logs those first.
    precedence: int = 0
    # Only a finding in a distributed job: a CUDA OOM or an exception in a plain script is not one.
    needs_distributed: bool = False
    # detail name -> value -> what it means (e.g. which Xid); shown as notes under the diagnosis.
    notes: dict[str, dict[str, str]] = field(default_factory=dict)
    # Matches any line of its kind (python-exception: any "SomeError: message"): a more specific signature
    # found for the same message, e.g. on the rest of a wrapped line, is preferred to it.
    catch_all: bool = False

def load_kb() -> list[Signature]:
    """The knowledge base, in match-priority order; a malformed entry fails loudly (it is a ddpdoctor bug)."""
    text = resources.files("ddpdoctor.explain").joinpath("kb.json").read_text(encoding="utf-8")
    sigs = []
    for raw in json.loads(text)["signatures"]:
        if raw["role"] not in ROLE_ORDER:
            raise ValueError(f"explain KB entry {raw['id']!r}: role must be one of {ROLE_ORDER}")
        sigs.append(Signature(
            id=raw["id"], role=raw["role"], title=raw["title"], keywords=tuple(raw["keywords"]),
            patterns=tuple(re.compile(p) for p in raw["patterns"]),
            extract=tuple(re.compile(p) for p in raw.get("extract", ())),
            cause=raw["cause"], remedy=raw["remedy"], command=raw["command"],
            context=raw.get("context", ""), suppressed_by=tuple(raw.get("suppressed_by", ())),
            followup_lines=int(raw.get("followup", {}).get("lines", 0)),
            followup_ids=tuple(raw.get("followup", {}).get("ids", ())),
            precedence=int(raw.get("precedence", 0)),
            needs_distributed=bool(raw.get("needs_distributed", False)),
            notes={k: dict(v) for k, v in raw.get("notes", {}).items()},
            catch_all=bool(raw.get("catch_all", False))))
    ids = [s.id for s in sigs]
    if len(set(ids)) != len(ids):
        raise ValueError("explain KB: duplicate signature ids")
    unknown = {i for s in sigs for i in (*s.followup_ids, *s.suppressed_by)} - set(ids)
    if unknown:
        raise ValueError(f"explain KB: followup/suppressed_by name unknown ids {sorted(unknown)}")
    return sigs
