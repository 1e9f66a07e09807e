"""The knowledge base: known messages (signatures) and what to tell the user about each.

The signatures are data (``kb.json`` next to this module, shipped in the wheel); each one names the texts
it matches (regexes, from the sources that print them: see ``tests/data/explain_inventory/``), its role in
a failure, and what the user should do.

Causal links are data too, because whether one event brings about another is knowledge of the sources, not
of a log: ``causes`` on a signature (a watchdog timeout ends in the SIGABRT that kills its rank: the watchdog
calls abort), ``explained_by`` on a consequence (torchrun's "failed (exitcode: 1)" is explained by the
exception that ended the same rank; a peer's "connection reset" by a failure on another rank).
:mod:`.ranking` turns them into a tree: each consequence is shown under its cause, not as a rival.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from importlib import resources

# "note": a hint, not a failure (a performance warning); reported with exit 0. Entries written before notes
# existed say "warning": the same role (see ROLE_ALIASES).
ROLE_ORDER = ("cause", "crash", "lagging-rank", "symptom", "note")
ROLE_ALIASES = {"warning": "note"}
# Which ranks a link relates (see Link): the same rank (a rank's own exception and its exit code), another
# rank (an echo on a survivor), or any.
RANK_RELATIONS = ("same", "other", "any")
# How a needs_distributed signature is reported without a sign of a distributed job (see Signature.alone).
ALONE_AS = ("failure", "note", "none")



def prefilter_keyword(keyword: str) -> str:
    """What the prefilter searches for a keyword: a keyword ending in ``$`` is its text at a line's end (a bare
    exception name, ``Error$``), searched with the line's newline; the scanner tests it on the line plus ``$``."""
    return keyword[:-1] + "\n" if keyword.endswith("$") and len(keyword) > 1 else keyword

@dataclass(frozen=True)
class Link:
    """One causal relation: a diagnosis ``cause`` (or any diagnosis of a role in ``cause_roles``) brings about
    the diagnosis ``consequence``.

    ``rank``: which ranks the two must be on (``RANK_RELATIONS``; unknown ranks never refute "same").
    ``when``: detail values the consequence must show (``{"signal": ["SIGABRT"]}``: only an abort is a
    watchdog's doing). ``match``: details both must share when both have them (``pid``: the process the kernel's
    OOM killer names is the one torchrun reports killed). ``cause_warns``: the source prints the cause at
    warning level although it is what made the consequence fail (c10d's socket.cpp records each failed
    ``getaddrinfo`` with ``C10D_WARNING`` and then raises "failed to connect to any network address" with
    those records), so a cause seen only in warnings still explains it; every other link needs an error.
    """

    consequence: str
    cause: str | None = None
    cause_roles: tuple[str, ...] = ()
    rank: str = "any"
    when: tuple[tuple[str, tuple[str, ...]], ...] = ()
    match: tuple[str, ...] = ()
    cause_warns: bool = False


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
    # Causal links this signature takes part in, as cause or as consequence (see Link).
    links: tuple[Link, ...] = ()
    # Made by the ranking from facts of the whole input (a log that ends inside a start-up phase), never
    # matched on a line: it has no keywords or patterns.
    derived: bool = False
    # How a ``needs_distributed`` diagnosis is reported in a log with no sign of a distributed job (issue 33:
    # the gate may change the wording and the ranking, never hide a known message): ``failure`` (the default;
    # worded for one process by ``alone_title``/``alone_cause`` where given), ``note`` (a failure of that one
    # process that is no DDP problem: a single-GPU script's OOM or device-side assert; exit 0, no false alarm)
    # or ``none`` (not reported at all; no entry uses it: the catch-all is a note naming the exception, kept by
    # ranking.order_diagnoses only when nothing more specific was found).
    alone: str = "failure"
    # A fact, not a finding (issue 33, item 5): never reported on its own; what it says is added as a note to
    # the first of these diagnoses that is present (NCCL chose a docker bridge -> a connect failure).
    hint_for: tuple[str, ...] = ()
    # Looked for with bytes.find on each input's first block only, not through the prefilter: NCCL's start-up
    # INFO lines ("Bootstrap : Using docker0:...") come early, and a keyword holding "Using" put a lead byte on
    # every heartbeat line ("GUID"): 20 % of that family's scan speed.
    first_block: tuple[str, ...] = ()
    alone_title: str = ""
    alone_cause: str = ""
    # Details that make a note-when-alone diagnosis a failure after all: the message is the distributed
    # library's own (shared-memory's NCCL segment, ``segment=/dev/shm/nccl-*``, unlike a DataLoader's bus error).
    alone_failure_if: tuple[str, ...] = ()
    alone_failure_title: str = ""

    @property
    def is_note(self) -> bool:
        """A hint, not a failure: never the reason for exit 1."""
        return self.role == "note"

    def for_one_process(self, details: dict[str, list[str]] | None = None) -> Signature | None:
        """This signature as reported in a log with no sign of a distributed job (see ``alone``), given the
        diagnosis's ``details``, or None when it is not reported there at all."""
        if not self.needs_distributed or self.alone == "none":
            return None if self.needs_distributed else self
        note = self.alone == "note" and not any((details or {}).get(n) for n in self.alone_failure_if)
        if note:
            return replace(self, role="note", title=self.alone_title or self.title, cause=self.alone_cause or self.cause)
        return replace(self, title=self.alone_failure_title or self.alone_title or self.title,
                       cause=self.alone_cause or self.cause)


def _links(raw: dict, own_id: str) -> list[Link]:
    """The ``causes`` and ``explained_by`` entries of one KB entry, as Links (each one validated)."""
    out = []
    for direction in ("causes", "explained_by"):
        for item in raw.get(direction, ()):
            rank = item.get("rank", "any")
            if rank not in RANK_RELATIONS:
                raise ValueError(f"explain KB entry {own_id!r}: {direction} rank must be one of {RANK_RELATIONS}")
            roles = tuple(ROLE_ALIASES.get(r, r) for r in item.get("roles", ()))
            if any(r not in ROLE_ORDER for r in roles):
                raise ValueError(f"explain KB entry {own_id!r}: {direction} roles must be among {ROLE_ORDER}")
            when = tuple((k, tuple(v)) for k, v in item.get("when", {}).items())
            match = tuple(item.get("match", ()))
            warns = bool(item.get("cause_warns", False))
            if direction == "causes":
                out.append(Link(consequence=item["id"], cause=own_id, rank=rank, when=when, match=match,
                                cause_warns=warns))
            elif "id" in item:
                out.append(Link(consequence=own_id, cause=item["id"], rank=rank, when=when, match=match,
                                cause_warns=warns))
            elif roles:
                out.append(Link(consequence=own_id, cause_roles=roles, rank=rank, when=when, match=match,
                                cause_warns=warns))
            else:
                raise ValueError(f"explain KB entry {own_id!r}: explained_by needs an id or roles")
    return out


def load_kb() -> list[Signature]:
    """The knowledge base, in match-priority order; a malformed entry fails loudly (it is a ddpdoctor bug)."""
    return parse_kb(resources.files("ddpdoctor.explain").joinpath("kb.json").read_text(encoding="utf-8"))


def parse_kb(text: str) -> list[Signature]:
    """The signatures of a ``kb.json`` text, validated (see ``load_kb``)."""
    sigs = []
    for raw in json.loads(text)["signatures"]:
        role = ROLE_ALIASES.get(raw["role"], raw["role"])
        if role not in ROLE_ORDER:
            raise ValueError(f"explain KB entry {raw['id']!r}: role must be one of {ROLE_ORDER}")
        derived = bool(raw.get("derived", False))
        alone = raw.get("alone", {})
        if alone.get("as", "failure") not in ALONE_AS:
            raise ValueError(f"explain KB entry {raw['id']!r}: alone.as must be one of {ALONE_AS}")
        if derived and (raw.get("keywords") or raw.get("patterns")):
            raise ValueError(f"explain KB entry {raw['id']!r}: a derived diagnosis matches no line")
        sigs.append(Signature(
            id=raw["id"], role=role, title=raw["title"], keywords=tuple(raw.get("keywords", ())),
            patterns=tuple(re.compile(p) for p in raw.get("patterns", ())),
            extract=tuple(re.compile(p) for p in raw.get("extract", ())),
            cause=raw["cause"], remedy=raw["remedy"], command=raw["command"],
            context=raw.get("context", ""), suppressed_by=tuple(raw.get("suppressed_by", ())),
            followup_lines=int(raw.get("followup", {}).get("lines", 0)),
            followup_ids=tuple(raw.get("followup", {}).get("ids", ())),
            precedence=int(raw.get("precedence", 0)),
            needs_distributed=bool(raw.get("needs_distributed", False)),
            notes={k: dict(v) for k, v in raw.get("notes", {}).items()},
            catch_all=bool(raw.get("catch_all", False)),
            links=tuple(_links(raw, raw["id"])), derived=derived, alone=alone.get("as", "failure"),
            alone_title=alone.get("title", ""), alone_cause=alone.get("cause", ""),
            alone_failure_if=tuple(alone.get("failure_if", ())), alone_failure_title=alone.get("failure_title", ""),
            hint_for=tuple(raw.get("hint_for", ())), first_block=tuple(raw.get("first_block", ()))))
    ids = [s.id for s in sigs]
    if len(set(ids)) != len(ids):
        raise ValueError("explain KB: duplicate signature ids")
    named = {i for s in sigs for i in (*s.followup_ids, *s.suppressed_by, *s.hint_for)}
    named |= {i for s in sigs for link in s.links for i in (link.cause, link.consequence) if i}
    unknown = named - set(ids)
    if unknown:
        raise ValueError(f"explain KB: followup/suppressed_by/causes/explained_by/hint_for name unknown ids "
                         f"{sorted(unknown)}")
    _refuse_causal_cycles(sigs)
    return sigs


def _refuse_causal_cycles(sigs: list[Signature]) -> None:
    """Id-to-id links must form no cycle: A causes B causes A would fold each under the other."""
    edges: dict[str, set[str]] = {}
    for s in sigs:
        for link in s.links:
            if link.cause:
                edges.setdefault(link.cause, set()).add(link.consequence)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                raise ValueError(f"explain KB: causal links form a cycle: {' -> '.join([*path, node, nxt])}")
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
