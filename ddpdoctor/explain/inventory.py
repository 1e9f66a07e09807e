"""The message inventory: what the sources can print, how each message maps to the knowledge base, coverage.

``scripts/build_explain_inventory.py`` extracts every error/warning text of PyTorch's torch.distributed,
c10d, torchrun, NCCL, gloo and the launch code of Lightning, accelerate, DeepSpeed and the HF Trainer into
``tests/data/explain_inventory/*.jsonl`` (templates: literal text, ``{}`` where a value is formatted in).
``mapping.json`` there says, rule by rule, what each entry is: a signature id, ``not-a-failure`` (progress,
INFO, performance hints) or ``generic`` (the fallback names it; the rule gives the reason). This module turns
a template into the lines a real log would hold (placeholders filled with plausible values, the message
embedded in the prefixes that source really prints) so a test can check that ``explain`` names what the
mapping says, and computes the coverage figures for ``docs/internals/explain-kb.md``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """A mapping rule: entries it matches (all given fields must match) -> a target and why."""

    to: str
    reason: str
    source: str = ""
    file: re.Pattern[str] | None = None
    template: re.Pattern[str] | None = None
    kind: str = ""
    level: str = ""
    fill: tuple[str, ...] = ()

    def matches(self, e: Entry) -> bool:
        return ((not self.source or e.source == self.source) and (not self.kind or e.kind == self.kind)
                and (not self.level or e.level == self.level)
                and (self.file is None or self.file.search(e.file) is not None)
                and (self.template is None or self.template.search(e.template) is not None))


def load_entries(folder: Path) -> list[Entry]:
    out: list[Entry] = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            raw = json.loads(line)
            out.append(Entry(**{k: raw[k] for k in Entry.__dataclass_fields__}))
    return out


def load_rules(path: Path) -> list[Rule]:
    rules = []
    for raw in json.loads(path.read_text(encoding="utf-8"))["rules"]:
        if raw["to"] in (GENERIC, NOT_A_FAILURE) and not raw.get("reason"):
            raise ValueError(f"mapping rule {raw} maps to {raw['to']} without a reason")
        rules.append(Rule(to=raw["to"], reason=raw.get("reason", ""), source=raw.get("source", ""),
                          file=re.compile(raw["file"]) if "file" in raw else None,
                          template=re.compile(raw["template"]) if "template" in raw else None,
                          kind=raw.get("kind", ""), level=raw.get("level", ""), fill=tuple(raw.get("fill", ()))))
    return rules


def mapping_of(entry: Entry, rules: Iterable[Rule]) -> Rule | None:
    for rule in rules:
        if rule.matches(entry):
            return rule
    return None


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


def coverage(entries: Iterable[Entry], rules: list[Rule]) -> dict[str, Figures]:
    out: dict[str, Figures] = {}
    for e in entries:
        f = out.setdefault(e.source, Figures())
        f.messages += 1
        if not e.literal:
            f.opaque += 1
            continue
        rule = mapping_of(e, rules)
        if rule is None:
            f.unmapped += 1
        elif rule.to == NOT_A_FAILURE:
            f.not_a_failure += 1
        elif rule.to == GENERIC:
            f.generic += 1
        else:
            f.specific += 1
    return out


def figures_table(figs: dict[str, Figures], first: Iterable[str] = TARGET_SOURCES) -> str:
    """The Markdown table of ``docs/internals/explain-kb.md`` (between its inventory markers)."""
    order = [s for s in first if s in figs] + sorted(s for s in figs if s not in first)
    rows = ["| source | messages | no literal text | not a failure | failure templates | specific signature "
            "| generic (fallback) | covered |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    total = Figures()
    for s in order:
        f = figs[s]
        rows.append(f"| {s} | {f.messages} | {f.opaque} | {f.not_a_failure} | {f.failures} | {f.specific} "
                    f"({f.share(f.specific):.0f} %) | {f.generic} | {f.share(f.specific + f.generic):.1f} % |")
        if s in first:
            for k in ("messages", "opaque", "not_a_failure", "specific", "generic", "unmapped"):
                setattr(total, k, getattr(total, k) + getattr(f, k))
    rows.append(f"| **torch + NCCL** | {total.messages} | {total.opaque} | {total.not_a_failure} | {total.failures} | "
                f"{total.specific} ({total.share(total.specific):.0f} %) | {total.generic} | "
                f"{total.share(total.specific + total.generic):.1f} % |")
    return "\n".join(rows) + "\n"


def as_json(e: Entry) -> dict[str, Any]:
    return dict(e.__dict__)
