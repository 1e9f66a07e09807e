"""The inventory's templates as a matcher: a line that holds a message the sources print gets that message's family.

``tests/data/explain_inventory/`` lists every error and warning text PyTorch (torch.distributed, c10d, torchrun),
NCCL, gloo and the launch frameworks can print, and its mapping says which knowledge-base signature each one
belongs to (``scripts/build_explain_mapping.py``: rules, then ``templates.json`` next to this module). A line is
recognised because its text matches one of those templates; the template's signature gives the diagnosis and the
template's provenance (project, version, file:line) goes into the diagnosis' details.

Finding the template of a line never tries thousands of patterns:

* the prefilter (:mod:`.prefilter`) admits a line only if it holds a template's ``keywords``, in the same single
  pass over each block as the signatures' keywords: for an exception's message or an NCCL WARN line, the marker
  every such line carries (``Error: ``, ``xception: ``, ``NCCL WARN ``: already keywords of the knowledge base);
  for a logged message (glog, logger, TORCH_WARN), a piece of its own text from a rare byte on
  (``prefilter_anchors``); a message with no such piece cannot be found in one pass and is mapped ``generic``;
* an admitted line's words are looked up in a dict from word to templates: every template is filed under its
  rarest word (``token``), so a line meets a handful of candidates;
* a candidate matches when its literal pieces occur in the line in order (``str.find`` from where the previous
  piece ended: linear in the line, no backtracking, whatever the line holds); the one with the most literal text
  wins.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from ddpdoctor.explain.lines import TYPOGRAPHIC
from ddpdoctor.explain.prefilter import (
    ANCHOR_LEAD_BYTES,
    LEAD_BYTE_FREQUENCY,
    MAX_ANCHOR_BYTES,
    prefilter_anchors,
)

# What counts as a word, the same in templates and in log lines: a token is looked up by exact word.
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
# A template is recognisable on its own only with this much literal text on its line, and a word to file it
# under; shorter ones ("Invalid backend", "{}: {}") would match unrelated lines.
MIN_LITERAL_CHARS = 14
MAX_TEMPLATE_CHARS = 100  # a long message is matched on its first 100 characters of literal text
MIN_TOKEN_CHARS = 4
# The bytes a template's own anchor may start at: the rarer lead bytes (at most 25 per 10,000 bytes of a
# healthy log, LEAD_BYTE_FREQUENCY) less "j", on every ProcessGroupNCCL heartbeat line ("joined"), and "=".
# The knowledge base's own keywords may lead with commoner bytes where they must; thousands of templates
# would otherwise put E, M, v, D (NCCL INFO's "CUMEM ... via", glog's "PG ID") into the one pass.
TEMPLATE_LEAD_BYTES = frozenset(b for b in ANCHOR_LEAD_BYTES if LEAD_BYTE_FREQUENCY[b] <= 25.0) - {ord("j"), ord("=")}
# A template's own anchor is at least this long: "work" (from "... work {}") was on every trainer line.
MIN_OWN_ANCHOR_BYTES = 8
# Words every kind of message holds: never a token (a line holding one would meet hundreds of candidates).
COMMON_WORDS = frozenset(("with", "this", "that", "from", "have", "been", "will", "must", "should", "cannot",
                          "does", "found", "into", "only", "when", "than", "then", "using", "used", "your"))


@dataclass(frozen=True)
class Template:
    """One message of the inventory as a line of a log shows it."""

    signature: str
    pieces: tuple[str, ...]  # the literal text between the values formatted in, in order
    token: str  # the rarest word of the pieces: the key it is filed under
    keywords: tuple[str, ...]  # what the prefilter finds on the line (see the module docstring)
    where: str  # provenance: "pytorch 2.13.0+cpu torch/distributed/distributed_c10d.py:1423"

    @property
    def literal_chars(self) -> int:
        return sum(len(p) for p in self.pieces)

    def matches(self, text: str) -> bool:
        """Whether the pieces occur in ``text`` in order, each after the previous one (values in between).

        The leftmost occurrence of each piece leaves the most room for the rest, so one forward pass decides.
        """
        pos = 0
        for piece in self.pieces:
            found = text.find(piece, pos)
            if found < 0:
                return False
            pos = found + len(piece)
        return True


    def cut_match(self, text: str) -> int:
        """How much literal text ``text`` holds of this template when ``text`` stops inside it (a paste cut short:
        the comment box, the excerpt or the user stopped mid-line): its pieces in order up to one that the text's
        end starts; 0 when the text is not such a cut (a piece missing before its end, or the text whole)."""
        return self.cut(text)[0]

    def cut(self, text: str) -> tuple[int, bool]:
        """``cut_match``'s count, and whether the text stops inside a word of the template's text ("... is only
        supp" of "... is only supported with GPUs"): a whole message of another kind ends at a word's end, so such
        a stop is a cut whatever the count (see MIN_MIDWORD_CUT_CHARS)."""
        pos = got = 0
        for piece in self.pieces:
            found = text.find(piece, pos)
            if found >= 0:
                pos, got = found + len(piece), got + len(piece)
                continue
            rest = text[pos:].rstrip()
            for k in range(min(len(piece), len(rest)), MIN_CUT_PIECE - 1, -1):
                if piece.startswith(rest[-k:]):
                    return got + k, rest[-1].isalnum() and piece[k:k + 1].isalnum()
            # Cut inside the value before this piece ("... WorkNCCL(SeqNum=6, OpType=ALLRED"): a short one, with no
            # prose in it and not closed (a whole message ends in a bracket or a full stop); else the text went on
            # with something else (c10d's "... - retrying (try=0, ...)" where the template says "- timed out").
            whole = rest[-1:] in (")", "]", "}", ".", ">", "'", '"')
            return (got if 0 < len(rest) <= MAX_CUT_VALUE and not whole and not _PROSE.search(rest) else 0), False
        return 0, False


MIN_CUT_CHARS = 32  # literal text a cut message must show of its template (a message's first words are common)
# What the text's end must show of the piece it stops in: a text ending in a value, or in one or two letters of the
# next piece, is not told from a message that goes on differently ("... - retrying" against "... - timed out").
MIN_CUT_PIECE = 3
# A text that stops inside a word of the template ("RuntimeError: ProcessGroupNCCL is only supp", an excerpt cut at
# a fixed width) is a cut with less of it shown, when no template of another signature begins the same way: no
# other message could have gone on from there.
MIN_MIDWORD_CUT_CHARS = 20
CUT_HEAD_CHARS = 16  # < MIN_MIDWORD_CUT_CHARS: see TemplateMatcher.match_cut
MAX_CUT_VALUE = 48  # a text that stops in a value: that much of the value at most (c10d's retry goes on for 150)
_PROSE = re.compile(r"\b[a-z]{4,} ")  # a word of a sentence, not of a value (values: numbers, names, reprs, paths)


def split_template(template: str, prefer_first: bool = False) -> tuple[str, tuple[str, ...]] | None:
    """The line of ``template`` with the most literal text and its literal pieces, or None if no line is
    recognisable on its own (see ``MIN_LITERAL_CHARS``). Returns the line as far as it is kept, and the pieces.

    Multi-line messages reach the log one line at a time, so a template is matched on one of its lines. A long
    message is matched on its first ``MAX_TEMPLATE_CHARS`` characters of literal text, cut at a word end: that
    much identifies it, and a terminal that wrapped the line at 80 columns leaves more pieces than the
    scanner rejoins (``Scanner._rejoin``). Runs of whitespace inside a piece are kept: they are printed too.
    ``prefer_first``: the first line if it is recognisable (an exception's first line follows its marker, see
    ``MARKED_KINDS``).
    """
    lines = template.split("\n")
    best = max(lines, key=lambda ln: len(ln.replace("{}", "")))
    if prefer_first and len(lines[0].replace("{}", "").strip()) >= MIN_LITERAL_CHARS:
        best = lines[0]
    kept, used = best, 0
    for m in re.finditer(r"\{\}|[^{}]+|[{}]", best):
        if m.group(0) == "{}":
            continue
        if used + len(m.group(0)) > MAX_TEMPLATE_CHARS:
            room = m.group(0)[:MAX_TEMPLATE_CHARS - used]
            cut = max(room.rfind(" "), 0)
            kept = best[:m.start() + cut]
            break
        used += len(m.group(0))
    pieces = tuple(p for p in kept.split("{}") if p.strip())
    if sum(len(p.strip()) for p in pieces) < MIN_LITERAL_CHARS:
        return None
    return kept, pieces


def whole_words(line: str) -> list[str]:
    """Words of a template line that a log line shows as whole words: not glued to a value formatted in next to
    them ("{}ms" shows as "500ms", "{}Watchdog" as "[Rank 1] Watchdog" or "3Watchdog")."""
    return [m.group(0) for m in WORD.finditer(line)
            if line[max(0, m.start() - 2):m.start()] != "{}" and line[m.end():m.end() + 2] != "{}"]


# Kinds whose first line reaches the log after a marker the knowledge base already finds in the same pass: an
# exception's "SomeError: " / "SomeException: " (Python raises, C++ checks and throws surfacing in Python, gloo's
# enforce), NCCL's "host:pid:tid [dev] file.cc:123 NCCL WARN ".
MARKED_KINDS = {"python-raise": ("Error: ", "xception: "), "cpp-check": ("Error: ", "xception: "),
                "cpp-throw": ("Error: ", "xception: "), "gloo-enforce": ("Error: ",), "gloo-throw": ("Error: ",),
                "nccl-errstr": ("Error: ",), "nccl-warn": ("NCCL WARN ",)}


def choose_keywords(kind: str, template: str, line: str, pieces: Sequence[str]) -> tuple[str, ...] | None:
    """What the prefilter finds on a line of this template, or None if nothing cheap enough exists.

    A message's first line printed after a marker (``MARKED_KINDS``) needs nothing of its own: the marker is a
    keyword already. Any other line needs a piece of its own text starting at a rare byte: the one with the
    rarest lead byte, then the longest (``prefilter_anchors``, cut to ``MAX_ANCHOR_BYTES``).
    """
    if kind in MARKED_KINDS and template.split("\n", 1)[0].startswith(line):  # (line: as far as it is kept)
        return MARKED_KINDS[kind]
    anchors = [a for a in prefilter_anchors(p.strip() for p in pieces).values()
               if a[0] in TEMPLATE_LEAD_BYTES and len(a) >= MIN_OWN_ANCHOR_BYTES]
    if not anchors:
        return None
    best = min(anchors, key=lambda a: (LEAD_BYTE_FREQUENCY.get(a[0], 500.0), -len(a), a))
    return (best[:MAX_ANCHOR_BYTES].decode("utf-8", errors="ignore"),)


def choose_tokens(candidates: Sequence[Sequence[str]]) -> list[str | None]:
    """For each template's whole words, the one fewest templates share (then the longest): its dict key."""
    frequency = Counter(w for words in candidates for w in set(words))
    out: list[str | None] = []
    for words in candidates:
        usable = [w for w in words if len(w) >= MIN_TOKEN_CHARS and w.lower() not in COMMON_WORDS]
        out.append(min(usable, key=lambda w: (frequency[w], -len(w), w)) if usable else None)
    return out


class TemplateMatcher:
    """The templates of the signatures in a knowledge base, filed by token."""

    def __init__(self, templates: Iterable[Template], signature_ids: Iterable[str] | None = None) -> None:
        wanted = None if signature_ids is None else frozenset(signature_ids)
        self.templates = tuple(t for t in templates if wanted is None or t.signature in wanted)
        by_token: dict[str, list[Template]] = {}
        for t in self.templates:
            by_token.setdefault(t.token, []).append(t)
        # Most literal text first: the first template of a token that matches is the most specific of them.
        self._by_token = {k: tuple(sorted(v, key=lambda t: -t.literal_chars)) for k, v in by_token.items()}
        self._heads = tuple((t.pieces[0][:CUT_HEAD_CHARS], t) for t in self.templates if t.pieces)
        # What the prefilter must find for a line to reach ``match``: the markers and the templates' own anchors.
        self.keywords = tuple(sorted({k for t in self.templates for k in t.keywords}))

    def match(self, text: str) -> Template | None:
        """The most specific template whose pieces ``text`` holds in order, or None."""
        best: Template | None = None
        for word in set(WORD.findall(text)):
            for t in self._by_token.get(word, ()):
                if best is not None and t.literal_chars <= best.literal_chars:
                    break  # sorted by literal text: the rest of this token cannot beat the best
                if t.matches(text):
                    best = t
                    break
        return best


    def match_cut(self, text: str) -> Template | None:
        """The template ``text`` shows most of when it stops inside one (``Template.cut_match``), with at least
        ``MIN_CUT_CHARS`` of its literal text (``MIN_MIDWORD_CUT_CHARS`` when it stops inside a word and no template
        of another signature begins the same way), or None. Every template is tried: this is for one line an input."""
        best, most = None, MIN_MIDWORD_CUT_CHARS - 1
        short: set[str] = set()  # the signatures of the mid-word cuts shorter than MIN_CUT_CHARS
        for head, t in self._heads:
            # The first piece's head is in any line that shows MIN_MIDWORD_CUT_CHARS of the template (its first
            # piece whole, or cut after more than CUT_HEAD_CHARS): one `in` rules out nearly every template.
            if head not in text or t.literal_chars <= most:
                continue
            got, midword = t.cut(text)
            if got < MIN_CUT_CHARS and not (midword and got >= MIN_MIDWORD_CUT_CHARS):
                continue
            if got < MIN_CUT_CHARS:
                short.add(t.signature)
            if got > most:
                best, most = t, got
        if best is not None and most < MIN_CUT_CHARS and len(short) > 1:
            return None  # templates of two signatures begin this way: the cut text does not say which
        return best


def parse_table(text: str) -> list[Template]:
    """``templates.json`` (written by scripts/build_explain_mapping.py): rows [signature, where, token, [keywords],
    *pieces].

    The last piece loses its trailing whitespace: a message whose last value is empty ends in a space as printed
    (c10d's "NCCL communicator was aborted on rank 0. " when no reason is known), and editors, terminals and
    issue trackers trim it off the line a user pastes. Curly quotes and odd spaces are read as ASCII
    (``lines.TYPOGRAPHIC``), as they are in the lines matched against them."""
    return [Template(signature=row[0], where=row[1], token=row[2], keywords=tuple(row[3]),
                     pieces=_trimmed(tuple(p.translate(TYPOGRAPHIC) for p in row[4:])))
            for row in json.loads(text)["templates"]]


def _trimmed(pieces: tuple[str, ...]) -> tuple[str, ...]:
    if not pieces or pieces[-1] == pieces[-1].rstrip():
        return pieces
    last = pieces[-1].rstrip()
    return (*pieces[:-1], last) if last else pieces[:-1]


@cache
def load_templates() -> tuple[Template, ...]:
    """The shipped table; read once per process (the scanner of every input shares it)."""
    text = resources.files("ddpdoctor.explain").joinpath("templates.json").read_text(encoding="utf-8")
    return tuple(parse_table(text))


@cache
def matcher_for(signature_ids: frozenset[str]) -> TemplateMatcher:
    """The matcher for a knowledge base's signatures, built once per set of ids."""
    return TemplateMatcher(load_templates(), signature_ids)
