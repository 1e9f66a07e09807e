"""The message inventory: what the sources can print, how each message maps to the knowledge base, coverage.

``scripts/build_explain_inventory.py`` extracts every error/warning text of PyTorch's torch.distributed,
c10d, torchrun, NCCL, gloo and the launch code of Lightning, accelerate, DeepSpeed and the HF Trainer into
``tests/data/explain_inventory/*.jsonl`` (templates: literal text, ``{}`` where a value is formatted in).
``rules.json`` there says, rule by rule (source, file, kind, level, exception type, words of the template),
what each entry is: a signature id, ``not-a-failure`` (progress, INFO, performance hints, debug) or
``generic`` (only the fallback can name it; the rule gives the reason), with per-entry ``overrides`` where a
rule is wrong. ``build_mapping`` applies them: the mapping (``mapping.jsonl``) and the matcher's table
(``ddpdoctor/explain/templates.json``) are generated from it by ``scripts/build_explain_mapping.py`` and checked
in; a test regenerates both and fails when either is stale or an entry is unmapped.

This module also turns a template into the lines a real log would hold (placeholders filled with plausible
values, the message embedded in the prefixes that source really prints) so a test can check that ``explain``
names what the mapping says, and computes the coverage figures for ``docs/internals/explain-kb.md``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.explain.templates import (
    MARKED_KINDS,
    Template,
    choose_keywords,
    choose_tokens,
    split_template,
    whole_words,
)

NOT_A_FAILURE = "not-a-failure"
GENERIC = "generic"
# The sources the coverage target (>= 90 % of failure templates) is measured on.
TARGET_SOURCES = ("torch-python", "torch-elastic", "torch-cpp", "nccl")


@dataclass(frozen=True)
class Entry:
    """One message a source can print, with where it is printed."""

    source: str
    project: str
    version: str
    commit: str
    file: str
    line: int
    kind: str
    level: str
    exception: str
    template: str
    literal: bool

    @property
    def where(self) -> str:
        return f"{self.project} {self.version} {self.file}:{self.line}"


@dataclass(frozen=True)
class Rule:
    """A mapping rule: the entries it matches (every condition given must hold) -> a target, and why.

    ``file``, ``exception`` and ``template`` are regexes searched in the entry's field, ``kind`` one that must
    match the whole kind (``cpp-(?:log|warn)``); an override matches one entry by its file and its exact template
    (so it survives the line moving when the source changes).
    """

    id: str
    to: str
    reason: str
    source: str = ""
    kind: re.Pattern[str] | None = None
    level: str = ""
    file: re.Pattern[str] | None = None
    exception: re.Pattern[str] | None = None
    template: re.Pattern[str] | None = None
    exact: str | None = None  # overrides: the template, verbatim

    def matches(self, e: Entry) -> bool:
        return ((not self.source or e.source == self.source)
                and (self.kind is None or self.kind.fullmatch(e.kind) is not None)
                and (not self.level or e.level == self.level)
                and (self.file is None or self.file.search(e.file) is not None)
                and (self.exception is None or self.exception.search(e.exception) is not None)
                and (self.exact is None or e.template == self.exact)
                and (self.template is None or self.template.search(e.template) is not None))


def load_entries(folder: Path) -> list[Entry]:
    out: list[Entry] = []
    for path in sorted(folder.glob("*.jsonl")):
        if path.name == MAPPING_FILE:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            raw = json.loads(line)
            out.append(Entry(**{k: raw[k] for k in Entry.__dataclass_fields__}))
    return out


RULES_FILE = "rules.json"
MAPPING_FILE = "mapping.jsonl"


def load_rules(path: Path) -> list[Rule]:
    """The overrides, then the rules, in file order: the first that matches an entry maps it."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    rules = []
    for n, raw in enumerate(doc["overrides"]):
        rules.append(Rule(id=f"override {n + 1}", to=raw["to"], reason=raw["reason"],
                          file=re.compile(re.escape(raw["file"]) + "$"), exact=raw["template"]))
    for raw in doc["rules"]:
        if raw["to"] in (GENERIC, NOT_A_FAILURE) and not raw.get("reason"):
            raise ValueError(f"mapping rule {raw['id']} maps to {raw['to']} without a reason")
        rules.append(Rule(id=raw["id"], to=raw["to"], reason=raw.get("reason", ""), source=raw.get("source", ""),
                          kind=re.compile(raw["kind"]) if "kind" in raw else None, level=raw.get("level", ""),
                          file=re.compile(raw["file"]) if "file" in raw else None,
                          exception=re.compile(raw["exception"]) if "exception" in raw else None,
                          template=re.compile(raw["template"]) if "template" in raw else None))
    ids = [r.id for r in rules]
    if len(set(ids)) != len(ids):
        raise ValueError("mapping rules: duplicate rule ids")
    return rules


def mapping_of(entry: Entry, rules: Iterable[Rule]) -> Rule | None:
    for rule in rules:
        if rule.matches(entry):
            return rule
    return None


@dataclass(frozen=True)
class Mapped:
    """What the mapping says of one entry: its target, the rule that decided, why."""

    entry: Entry
    to: str  # a signature id, NOT_A_FAILURE, GENERIC, or UNMAPPED
    rule: str
    reason: str
    template: Template | None = None  # the matcher's form of the entry, when ``to`` is a signature

    def to_json(self) -> dict[str, Any]:
        e = self.entry
        out = {"source": e.source, "file": e.file, "line": e.line, "to": self.to, "rule": self.rule}
        if self.to in (GENERIC, NOT_A_FAILURE):
            out["reason"] = self.reason
        return out


UNMAPPED = "unmapped"


def build_mapping(entries: Sequence[Entry], rules: Sequence[Rule]) -> list[Mapped]:
    """Every entry's target. An entry a rule gives a signature but whose text cannot be recognised on its own
    (too little literal text, no word to file it under: see :mod:`.templates`) becomes ``generic``, saying so:
    the mapping never claims what the matcher cannot do."""
    decided: list[tuple[Entry, Rule | None, tuple[str, tuple[str, ...]] | None]] = []
    for e in entries:
        rule = mapping_of(e, rules)
        split = split_template(e.template, prefer_first=e.kind in MARKED_KINDS) if rule is not None and e.literal \
            and rule.to not in (GENERIC, NOT_A_FAILURE) else None
        decided.append((e, rule, split))
    tokens = choose_tokens([whole_words(s[0]) if s else [] for _, _, s in decided])
    out: list[Mapped] = []
    for (e, rule, split), token in zip(decided, tokens, strict=True):
        if rule is None:
            out.append(Mapped(e, UNMAPPED, "", ""))
        elif rule.to in (GENERIC, NOT_A_FAILURE) or not e.literal:
            out.append(Mapped(e, rule.to, rule.id, rule.reason or "no literal text of its own"))
        elif split is None or token is None:
            why = "too little literal text" if split is None else "no distinctive word"
            out.append(Mapped(e, GENERIC, rule.id, f"{why} to recognise it on its own (rule: {rule.to})"))
        elif (keywords := choose_keywords(e.kind, e.template, *split)) is None:
            out.append(Mapped(e, GENERIC, rule.id, f"no rare byte in its text to find it by in the prefilter's one "
                                                   f"pass (rule: {rule.to})"))
        else:
            where = f"{e.project} {e.version} {e.file}:{e.line}"
            out.append(Mapped(e, rule.to, rule.id, rule.reason, Template(rule.to, split[1], token, keywords, where)))
    return _without_ambiguous(out)


def _without_ambiguous(mapped: list[Mapped]) -> list[Mapped]:
    """The same text printed in two places that map to different signatures cannot tell which one a log line
    comes from ("input tensor has to be contiguous" in ProcessGroupMPI.cpp and in c10d's Utils): such entries
    become ``generic``, naming the families they were torn between."""
    targets: dict[tuple[str, ...], set[str]] = {}
    for m in mapped:
        if m.template is not None:
            targets.setdefault(m.template.pieces, set()).add(m.to)
    out = []
    for m in mapped:
        if m.template is not None and len(clash := targets[m.template.pieces]) > 1:
            m = Mapped(m.entry, GENERIC, m.rule, "the same text is printed where other rules map it elsewhere "
                       f"({', '.join(sorted(clash))}): the text alone cannot tell which")
        out.append(m)
    return out


def template_table(mapped: Iterable[Mapped]) -> str:
    """``ddpdoctor/explain/templates.json``: the matcher's rows, one per distinct (signature, pieces)."""
    rows: list[list[Any]] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for m in mapped:
        t = m.template
        if t is None or (t.signature, t.pieces) in seen:
            continue
        seen.add((t.signature, t.pieces))
        rows.append([t.signature, t.where, t.token, list(t.keywords), *t.pieces])
    about = ("Generated by scripts/build_explain_mapping.py from tests/data/explain_inventory (the message "
             "inventory and its rules.json): do not edit. Each row: signature id, where the message is printed "
             "(project version file:line), the word it is filed under, what the prefilter finds on its line, then "
             "the literal pieces of its line in order. See ddpdoctor/explain/templates.py.")
    body = ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in rows)
    return f'{{"about": {json.dumps(about)},\n "templates": [\n{body}\n]}}\n'


def mapping_lines(mapped: Iterable[Mapped]) -> str:
    """``mapping.jsonl``: one line per entry, in inventory order."""
    return "".join(json.dumps(m.to_json(), ensure_ascii=False, sort_keys=True) + "\n" for m in mapped)


# -- turning a template into a log ----------------------------------------------------------------------
_NUMBER_BEFORE = re.compile(r"(?:rank|ranks|size|count|seq|SeqNum|port|timeout|seconds|ms|work|[Ii]d|index|"
                            r"version|errno|code|num\w*|world\w*|=|#|\(|:|after|of|than|to|got|expected|and)\s*$",
                            re.IGNORECASE)


def fill_template(template: str, fill: tuple[str, ...] = ()) -> str:
    """The template with each ``{}`` replaced: by ``fill`` in order where given, else a plausible value (a
    number after words that take one, else a short name)."""
    parts = template.split("{}")
    out = [parts[0]]
    for i, part in enumerate(parts[1:]):
        if i < len(fill):
            value = fill[i]
        elif i == 0 and not parts[0] and part[:1].isalpha():
            value = "[Rank 1] "  # c10d's logPrefix() in front of a message: "{}Watchdog caught ..."
        else:
            value = "3" if _NUMBER_BEFORE.search(out[-1][-24:]) or not out[-1].strip() else "data3"
        out.extend((value, part))
    return "".join(out)


def _qualified(exc: str) -> str:
    """How Python prints the exception class of a raise or a C++ error type."""
    return {"DistBackendError": "torch.distributed.DistBackendError", "DistStoreError": "torch.distributed.DistStoreError",
            "DistNetworkError": "torch.distributed.DistNetworkError", "DistError": "torch.distributed.DistError",
            "ChildFailedError": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
            "EnforceNotMet": "RuntimeError", "IoException": "RuntimeError", "InvalidOperationException": "RuntimeError",
            "Exception": "RuntimeError", "": "RuntimeError", "Error": "RuntimeError"}.get(exc, exc)


def log_lines(entry: Entry, fill: tuple[str, ...] = ()) -> str:
    """The lines a real log holds when ``entry`` is printed on rank 1 of a torchrun job."""
    msg = fill_template(entry.template, fill)
    first, *more = msg.split("\n")
    base = entry.file.rsplit("/", 1)[-1]
    site = "/opt/conda/lib/python3.11/site-packages/"
    pyfile = site + (entry.file.split("/src/", 1)[-1] if entry.file.startswith("src/") else entry.file)
    p = "[rank1]:"
    rest = "".join(f"{p} {m}\n" for m in more)
    if entry.kind == "python-raise":
        return (f"{p} Traceback (most recent call last):\n{p}   File \"/workspace/train.py\", line 42, in <module>\n"
                f"{p}     main()\n{p}   File \"{pyfile}\", line {entry.line}, in check\n"
                f"{p}     raise {entry.exception}(msg)\n{p} {_qualified(entry.exception)}: {first}\n{rest}")
    if entry.kind == "python-warn":
        return f"{p}{pyfile}:{entry.line}: {entry.exception or 'UserWarning'}: {first}\n{rest}{p}  warnings.warn(\n"
    if entry.kind == "python-log":
        level = "E" if entry.level == "error" else "W"
        if entry.source.startswith("torch"):
            return f"{p}{level}1126 10:00:00.123000 4565 {entry.file}:{entry.line}] {first}\n{rest}"
        name = "ERROR" if entry.level == "error" else "WARNING"
        return f"{p} 2026-11-26 10:00:00,123 - {entry.file.rsplit('.', 1)[0].replace('/', '.')} - {name} - {first}\n{rest}"
    if entry.kind in ("cpp-check", "cpp-throw"):
        return (f"{p} Traceback (most recent call last):\n"
                f"{p}   File \"{site}torch/distributed/distributed_c10d.py\", line 2501, in all_reduce\n"
                f"{p}     work = group.allreduce([tensor], opts)\n{p} {_qualified(entry.exception)}: {first}\n{rest}"
                f"{p} Exception raised from check at /pytorch/{entry.file}:{entry.line} (most recent call first):\n")
    if entry.kind in ("cpp-log", "cpp-format"):  # cpp-format: built, then logged with LOG(ERROR) (or thrown)
        level = "E" if entry.level == "error" else "W"
        tag = "[c10d] " if entry.exception == "c10d" else ""  # c10d/logging.h's C10D_ERROR / C10D_WARNING
        return f"{p}[{level}1126 10:00:00.123456789 {base}:{entry.line}] {tag}{first}\n{rest}"
    if entry.kind == "cpp-warn":
        return f"{p}[W1126 10:00:00.123456789 {base}:{entry.line}] Warning: {first} (function check)\n{rest}"
    if entry.kind == "nccl-warn":
        where = entry.file.removeprefix("src/")
        return f"node-a:4565:4601 [1] {where}:{entry.line} NCCL WARN {first}\n{rest}"
    if entry.kind == "nccl-errstr":
        return (f"{p} torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                f"NCCLUtils.cpp:77, {first}, NCCL version 2.28.9\n{rest}")
    if entry.kind in ("gloo-enforce", "gloo-throw"):
        tag = "enforce fail at " if entry.kind == "gloo-enforce" else ""
        return f"{p} RuntimeError: [{tag}/pytorch/third_party/gloo/{entry.file}:{entry.line}] {first}\n{rest}"
    if entry.kind == "gloo-log":
        return f"{p} [{entry.file}:{entry.line}] {first}\n{rest}"
    raise ValueError(f"unknown inventory kind {entry.kind!r}")


# -- coverage -----------------------------------------------------------------------------------------------
@dataclass
class Figures:
    """Per source: messages, failure templates, how many map to a specific signature / generically."""

    messages: int = 0
    opaque: int = 0  # no literal text of their own (the message is built elsewhere): nothing to recognise
    not_a_failure: int = 0
    specific: int = 0
    generic: int = 0
    unmapped: int = 0

    @property
    def failures(self) -> int:
        return self.specific + self.generic + self.unmapped

    def share(self, n: int) -> float:
        return 100.0 * n / self.failures if self.failures else 100.0


def coverage(mapped: Iterable[Mapped]) -> dict[str, Figures]:
    """Per source, what the mapping makes of its messages (a failure template is one with literal text that is
    not ``not-a-failure``; ``specific`` ones are named by a signature of their own family)."""
    out: dict[str, Figures] = {}
    for m in mapped:
        f = out.setdefault(m.entry.source, Figures())
        f.messages += 1
        if not m.entry.literal:
            f.opaque += 1
        elif m.to == UNMAPPED:
            f.unmapped += 1
        elif m.to == NOT_A_FAILURE:
            f.not_a_failure += 1
        elif m.to == GENERIC:
            f.generic += 1
        else:
            f.specific += 1
    return out


def figures_table(figs: dict[str, Figures], first: Iterable[str] = TARGET_SOURCES) -> str:
    """The Markdown table of ``docs/internals/explain-kb.md`` (between its inventory markers)."""
    first = tuple(first)
    order = [s for s in first if s in figs] + sorted(s for s in figs if s not in first)
    rows = ["| source | messages | no literal text | not a failure | failure templates | named signature "
            "| generic (fallback) | unmapped |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    total = Figures()
    for s in order:
        f = figs[s]
        rows.append(f"| {s} | {f.messages} | {f.opaque} | {f.not_a_failure} | {f.failures} | {f.specific} "
                    f"({f.share(f.specific):.1f} %) | {f.generic} | {f.unmapped} |")
        if s in first:
            for k in ("messages", "opaque", "not_a_failure", "specific", "generic", "unmapped"):
                setattr(total, k, getattr(total, k) + getattr(f, k))
    rows.append(f"| **torch.distributed + NCCL** ({', '.join(s for s in first if s in figs)}) | {total.messages} | "
                f"{total.opaque} | {total.not_a_failure} | {total.failures} | {total.specific} "
                f"({total.share(total.specific):.1f} %) | {total.generic} | {total.unmapped} |")
    return "\n".join(rows) + "\n"


def as_json(e: Entry) -> dict[str, Any]:
    return dict(e.__dict__)
