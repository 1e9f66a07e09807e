"""`ddpdoctor explain` scored on real users' logs (tests/data/real_logs/, sources in its index.json).

The corpus is what users paste into issue threads: quote marks, app-logger and Ray prefixes, pasted line
numbers, tracebacks of several ranks interleaved, tqdm bars glued to error lines, plus logs with no
distributed problem at all. It has two sets: the older logs (issue 26 and before, found while the knowledge
base was written) and issue 33's set, collected by a rule fixed before any run to measure generalisation
(`"set": "issue-33"` in index.json). Each is scored on its own and both together.

Each set is split in two by a rule fixed before any tuning (issue 26): a log is *held out* when the
SHA-256 of its file name is odd (`held_out`), so a new log falls into a half by itself and nobody picks
which. The knowledge base is tuned on the other half; thresholds are asserted on the held-out halves only
(issue 26's on the older corpus, issue 33's floor and its target, an xfail until met, on issue 33's set), and
the tuning halves' scores are reported next to them. All are printed at the end of the pytest run and in the
assertion messages. Which held-out logs miss is not printed unless DDPDOCTOR_SHOW_HELD_OUT=1 is set: whoever
tunes the knowledge base should see the held-out figures, not the logs behind them
(docs/internals/explain-corpus.md).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from ddpdoctor.explain import ExplainResult, Signature, explain_streams, load_kb, rank_from_path
from tests.support import report_summary

CORPUS = Path(__file__).resolve().parents[1] / "data" / "real_logs"
INDEX = json.loads((CORPUS / "index.json").read_text(encoding="utf-8"))["logs"]
SHOW_HELD_OUT = os.environ.get("DDPDOCTOR_SHOW_HELD_OUT") == "1"
REPORT_PASTED = os.environ.get("DDPDOCTOR_REPORT_PASTED") == "1"


def held_out(file_name: str) -> bool:
    """The split rule: the file name alone (no folder), hashed; odd is held out. It is computed, never
    listed, so adding or renaming a log cannot move another one between the halves."""
    return int(hashlib.sha256(file_name.encode()).hexdigest(), 16) % 2 == 1


@dataclass
class Score:
    name: str
    positives: int = 0
    recognised: int = 0
    right_first: int = 0
    # A miss whose first note names the labelled cause, exit 0: a Python exception (or a single-process CUDA
    # failure) in a log with no sign of a distributed job, named for that one process. Reported, never counted
    # as right: the label says the thread's job was distributed, which the log itself does not show.
    named_as_note: int = 0
    negatives: int = 0
    # repr=False: a failing assert prints its operands' reprs, and a held-out half's names must not show.
    false_alarms: list[str] = field(default_factory=list, repr=False)
    misses: list[str] = field(default_factory=list, repr=False)

    def figures(self) -> list[str]:
        def pct(n: int, of: int) -> str:
            return f"{n}/{of} ({100 * n / of:.1f} %)" if of else f"{n}/0"

        return [f"{self.name}: {self.positives} logs with a known failure, {self.negatives} without",
                f"  right root cause first: {pct(self.right_first, self.positives)}",
                f"  recognised:             {pct(self.recognised, self.positives)}",
                f"  (misses whose first note names the labelled cause, exit 0: {self.named_as_note})",
                f"  false alarms:           {len(self.false_alarms)}/{self.negatives}"]

    def details(self) -> list[str]:
        return [f"  miss: {m}" for m in self.misses] + [f"  false alarm: {f}" for f in self.false_alarms]


# The sets of the corpus: issue 33's logs were collected by a rule fixed before any run (seed repositories new to
# the corpus, fixed queries, results in search order) to measure generalisation; the older logs came from threads
# found while the knowledge base was written. Each set is split by the same rule and scored on its own.
SETS = {"older": "older corpus (issue 26 and before)", "issue-33": "issue 33's set (collected by a rule)",
        "issue-33-b": "issue 33's second set (collected by a rule)",
        "issue-33-c": "issue 33's third set (collected by a rule)",
        "issue-33-d": "issue 33's fourth set (collected by a rule)",
        "issue-33-e": "issue 33's fifth set (collected by a rule)",
        "issue-33-f": "issue 33's sixth set (collected by a rule)",
        "issue-33-g": "issue 33's seventh set (collected by a rule)",
        "issue-33-h": "issue 33's eighth set (collected by a rule)",
        "issue-33-i": "issue 33's ninth set (collected by a rule)",
        "issue-33-j": "issue 33's tenth set (collected by a rule)",
        "issue-33-k": "issue 33's eleventh set (collected by a rule)",
        "issue-33-l": "issue 33's twelfth set (collected by a rule)",
        "issue-33-m": "issue 33's thirteenth set (collected by a rule)",
        "issue-33-n": "issue 33's fourteenth set (collected by a rule)",
        "issue-33-o": "issue 33's fifteenth set (collected by a rule)",
        "issue-33-p": "issue 33's sixteenth set (collected by a rule)",
        "issue-33-q": "issue 33's seventeenth set (collected by a rule)"}
# Sets that are only reported: their score is printed with no threshold, and (with DDPDOCTOR_REPORT_PASTED=1) a
# pasted-differently change on one of their logs is listed in the summary (names masked as for the held-out halves)
# instead of failing the test, since finding where explain fails is what they were collected for
# (docs/internals/explain-corpus.md). Without the variable their logs are not pasted differently at all: nine
# transforms of some 340 logs that assert nothing cost the suite ~15 s of CPU, and it is at its time limit.
REPORTED_ONLY = {"issue-33-b", "issue-33-c", "issue-33-d", "issue-33-e", "issue-33-f", "issue-33-g",
                 "issue-33-h", "issue-33-i", "issue-33-j", "issue-33-k",
                 "issue-33-l", "issue-33-m", "issue-33-n", "issue-33-o", "issue-33-p", "issue-33-q"}


def corpus_set(entry: dict) -> str:
    """The set a log belongs to: its `set` field in index.json, the older corpus when it has none."""
    return str(entry.get("set", "older"))


@dataclass
class CorpusScore:
    parts: dict[tuple[str, bool], Score]  # (set, held out?) -> its score

    def part(self, name: str, held: bool) -> Score:
        return self.parts[(name, held)]

    @property
    def tuning(self) -> Score:
        """Every set's tuning half together."""
        return _merged("tuning half, all sets", [s for (_, h), s in self.parts.items() if not h])

    @property
    def held(self) -> Score:
        """Every set's held-out half together."""
        return _merged("held-out half, all sets", [s for (_, h), s in self.parts.items() if h])

    def summary(self) -> str:
        lines = []
        for name in SETS:
            lines += self.part(name, False).figures() + self.part(name, True).figures()
        lines += self.tuning.figures() + self.held.figures()
        tuning_details = [line for name in SETS for line in self.part(name, False).details()]
        if tuning_details:  # headed: right under the held-out figures they read as held-out names
            lines += ["the tuning halves' misses and false alarms (logs fixes may be made on):", *tuning_details]
        held = [self.part(name, True) for name in SETS]
        if SHOW_HELD_OUT:
            for score in held:
                lines += score.details()
        elif any(s.misses or s.false_alarms for s in held):
            lines.append(f"  ({sum(len(s.misses) for s in held)} held-out misses and "
                         f"{sum(len(s.false_alarms) for s in held)} held-out false alarms not listed: "
                         "DDPDOCTOR_SHOW_HELD_OUT=1 lists them)")
        return "\n".join(lines)


def _merged(name: str, scores: list[Score]) -> Score:
    total = Score(name)
    for s in scores:
        total.positives += s.positives
        total.recognised += s.recognised
        total.right_first += s.right_first
        total.named_as_note += s.named_as_note
        total.negatives += s.negatives
        total.false_alarms += s.false_alarms
        total.misses += s.misses
    return total


@cache
def _kb() -> list[Signature]:
    return load_kb()


def _explain(path: Path) -> ExplainResult:
    with path.open("rb") as stream:
        return explain_streams([(str(path), stream, rank_from_path(str(path)))], _kb())


@dataclass
class Verdict:
    """What a user gets from `ddpdoctor explain --json - LOG`: the exit code and the diagnoses, first first."""

    exit_code: int
    diagnoses: list[dict]


def _run_cli(path: Path) -> Verdict:
    """The command itself, in-process (typer's CliRunner): a false alarm is what the issue counts, exit 1 on a
    log without a distributed failure, whatever the knowledge base does with notes and warnings."""
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    run = CliRunner().invoke(app, ["explain", "--json", "-", str(path)])
    if run.exception is not None and not isinstance(run.exception, SystemExit):
        return Verdict(3, [{"id": f"<crash: {run.exception!r}>"}])  # the CLI would print a bug report, exit 3
    if run.exit_code not in (0, 1):
        return Verdict(run.exit_code, [{"id": f"<exit {run.exit_code}: {run.output.strip()[-200:]}>"}])
    return Verdict(run.exit_code, json.loads(run.stdout)["diagnoses"])


def _said(first: dict) -> str:
    return " ".join([first["title"], first["cause"], first["remedy"], first["command"],
                     *first.get("notes", [])]).lower()


def _score_entry(entry: dict, score: Score) -> None:
    verdict = _run_cli(CORPUS / entry["file"])
    got = [d["id"] for d in verdict.diagnoses]
    if entry["expected"] is None:
        score.negatives += 1
        if verdict.exit_code != 0:
            score.false_alarms.append(f"{entry['file']}: exit {verdict.exit_code} {got}")
        return
    score.positives += 1
    if verdict.exit_code != 1 or not got:
        score.named_as_note += verdict.exit_code == 0 and got[:1] == [entry["expected"]]
        score.misses.append(f"{entry['file']}: exit {verdict.exit_code}, nothing recognised "
                            f"(want {entry['expected']}; notes {got})")
        return
    score.recognised += 1
    problems = []
    first = verdict.diagnoses[0]
    if first["id"] != entry["expected"]:
        problems.append(f"first {first['id']} (all {got})")
    else:
        said = _said(first)
        problems += [f"does not say {w!r}" for w in entry["must_say"] if w.lower() not in said]
        want_ranks = entry.get("ranks")
        if want_ranks is not None and sorted(first["ranks"]) != sorted(want_ranks):
            problems.append(f"ranks {sorted(first['ranks'])} != {want_ranks}")
    if problems:
        score.misses.append(f"{entry['file']} (want {entry['expected']}): " + "; ".join(problems))
    else:
        score.right_first += 1


def score_corpus() -> CorpusScore:
    parts = {(name, held): Score(f"{title}, {'held-out' if held else 'tuning'} half")
             for name, title in SETS.items() for held in (False, True)}
    for entry in INDEX:
        _score_entry(entry, parts[(corpus_set(entry), held_out(entry["file"]))])
    return CorpusScore(parts)


def _thread(url: str) -> str:
    """The thread a source URL points into (a comment anchor or a PR's files tab is the same thread)."""
    return url.split("#", 1)[0].split("?", 1)[0].rstrip("/").removesuffix("/files")


def test_split_rule_is_the_file_name_hash() -> None:
    """The rule as issue 26 fixed it, on names whose digests were taken with sha256sum (a.log ends in 5,
    b.log in a, c.log in 7); index entries are bare file names, so the folder never enters the hash."""
    assert [held_out(n) for n in ("a.log", "b.log", "c.log")] == [True, False, True]
    assert all("/" not in e["file"] for e in INDEX)
    held = sum(held_out(e["file"]) for e in INDEX)
    assert len(INDEX) / 3 <= held <= 2 * len(INDEX) / 3, f"{held}/{len(INDEX)} held out: the halves are lopsided"


def _unlabeled_ids() -> set[str]:
    """Causes no knowledge-base id exists for yet, from UNLABELED.md's table (`id` in its first column)."""
    text = (CORPUS / "UNLABELED.md").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^\| `([a-z0-9-]+)` \|", text, re.MULTILINE)}


def test_corpus_is_big_enough_and_sourced() -> None:
    """Issue 26: >= 150 logs from >= 30 projects, never two from one thread, >= 30 without a distributed
    failure; every entry says where it comes from and what the thread says the cause is."""
    files = {p.name for p in CORPUS.glob("*.log")}
    indexed = [e["file"] for e in INDEX]
    assert sorted(indexed) == sorted(files), "every log has exactly one index entry"
    assert all(e["source"].startswith("https://github.com/") and e["root_cause"] for e in INDEX)
    for e in INDEX:
        owner_repo = "/".join(e["source"].split("/")[3:5])
        assert e["project"] == owner_repo, f"{e['file']}: project {e['project']!r} is not its thread's {owner_repo!r}"
    threads: dict[str, list[str]] = {}
    for e in INDEX:
        threads.setdefault(_thread(e["source"]), []).append(e["file"])
    assert len(threads) >= 150, f"{len(threads)} distinct threads"
    # Never a second log from a thread (issue 26): two logs of one thread would also let the held-out half
    # share a thread with the tuning half. (The two pairs the older corpus had were cut to one log each.)
    shared = {t: fs for t, fs in threads.items() if len(fs) > 1}
    assert not shared, f"a thread gives at most one log: {shared}"
    assert len({e["project"] for e in INDEX}) >= 30
    assert sum(e["expected"] is None for e in INDEX) >= 30
    assert sum(e["expected"] is not None for e in INDEX) >= 100
    assert {corpus_set(e) for e in INDEX} <= set(SETS)


def test_issue33_set_follows_its_rule() -> None:
    """Issue 33's set: every log says which query found it, and every thread is in a repository the older corpus
    never drew on, at most 3 from one repository (the collection rule in docs/internals/explain-corpus.md)."""
    older = {e["project"] for e in INDEX if corpus_set(e) == "older"}
    new = [e for e in INDEX if corpus_set(e) == "issue-33"]
    assert len(new) >= 60
    assert all(e.get("query", "").endswith(("distributed training multi-GPU error log",
                                            "torchrun NCCL DDP RuntimeError traceback")) for e in new)
    assert not {e["project"] for e in new} & older
    per_repo: dict[str, int] = {}
    for e in new:
        per_repo[e["project"]] = per_repo.get(e["project"], 0) + 1
    assert max(per_repo.values()) <= 3, per_repo
    held = [e for e in new if held_out(e["file"])]
    assert any(e["expected"] is None for e in held) and any(e["expected"] is not None for e in held)


def test_every_label_is_a_diagnosis_id_or_listed_as_unlabeled() -> None:
    """A label is the knowledge base's id for the cause, or a cause with no id yet listed in UNLABELED.md
    (with the logs that carry it), so a typo cannot make a log unwinnable unnoticed."""
    known = {s.id for s in _kb()}
    unlabeled = _unlabeled_ids()
    labels = {e["expected"] for e in INDEX if e["expected"] is not None}
    assert labels <= known | unlabeled, sorted(labels - known - unlabeled)
    text = (CORPUS / "UNLABELED.md").read_text(encoding="utf-8")
    for e in INDEX:
        if e["expected"] in unlabeled - known:
            assert e["file"] in text, f"{e['file']} ({e['expected']}) is not listed in UNLABELED.md"


def test_real_logs_score(request: pytest.FixtureRequest) -> None:
    """Issue 26's thresholds on the older corpus' held-out half: right root cause first >= 90 %, no false alarm.
    Counts only, so a failure names no held-out log. The summary printed with it has every set and half."""
    scores = _scores()
    summary = scores.summary()
    request.config.stash[SUMMARY_KEY] = summary
    report_summary(request, SUMMARY_TITLE, summary)
    held = scores.part("older", True)
    assert held.positives > 0 and held.negatives > 0, summary
    false_alarms = len(held.false_alarms)  # a number: a failing assert prints its operands, never the names
    assert false_alarms == 0, summary
    assert held.right_first >= 0.90 * held.positives, summary


# What holds on issue 33's set today, asserted so that it cannot slip back: no false alarm on its held-out half,
# and at least half of that half's failures with the right cause first (12/24 with the knowledge base at 77af24a,
# when the set was committed; figures by date in docs/internals/explain-corpus.md).
ISSUE33_HELD_RIGHT_FIRST_FLOOR = 0.50


def test_issue33_set_score_does_not_slip() -> None:
    """Issue 33's set (collected by a rule, labelled before any run): its held-out half keeps no false alarm and
    at least the share of right first causes it had when it was committed. Counts only."""
    scores = _scores()
    held = scores.part("issue-33", True)
    assert held.positives > 0 and held.negatives > 0, scores.summary()
    false_alarms = len(held.false_alarms)  # a number: a failing assert prints its operands, never the names
    assert false_alarms == 0, scores.summary()
    assert held.right_first >= ISSUE33_HELD_RIGHT_FIRST_FLOOR * held.positives, scores.summary()


# Issue 33's target on the logs nobody tuned to: >= 90 % right cause first on the held-out half of its set, no
# false alarm. Not met yet; the reason has the figures when this mark was last updated (the knowledge-base work of
# issue 33 is meant to raise them). raises=AssertionError: a crash or a broken corpus still fails the test.
ISSUE33_TARGET_XFAIL = pytest.mark.xfail(
    strict=False, raises=AssertionError,
    reason="issue 33's set, held-out half: right cause first 17/24 (70.8 %), recognised 21/24, false alarms 0/3 "
           "with the knowledge base at 0dea8e8 (2026-11-28; 16/24 at 4343cf8, 15/24 at 3caef78, 12/24 at 77af24a); "
           "target >= 90 % and no false alarm")


@ISSUE33_TARGET_XFAIL
def test_issue33_set_target() -> None:
    """Issue 33: at least 90 % of the failures in its set's held-out half with the right cause first, and no false
    alarm there."""
    scores = _scores()
    held = scores.part("issue-33", True)
    false_alarms = len(held.false_alarms)  # a number: a failing assert prints its operands, never the names
    assert false_alarms == 0, scores.summary()
    assert held.right_first >= 0.90 * held.positives, scores.summary()


def test_real_logs_recognised() -> None:
    """The older bar kept from before issue 26: at least 95 % of the older corpus' held-out failures recognised
    (exit 1 with some diagnosis, whichever comes first). An xfail until the knowledge base of ac4af0b met it
    (71/74)."""
    held = _scores().part("older", True)
    assert held.recognised >= 0.95 * held.positives, _scores().summary()


@cache
def _scores() -> CorpusScore:
    """The corpus scored once per session (the tests above read it)."""
    return score_corpus()


SUMMARY_KEY = pytest.StashKey[str]()  # the score, then the known gaps the pasted-differently tests add to it
SUMMARY_TITLE = "ddpdoctor explain on real logs"


# --- the same real logs, pasted differently --------------------------------------------------------------

def _first(result: ExplainResult) -> tuple[str, list[int]] | None:
    return (result.diagnoses[0].id, sorted(result.diagnoses[0].ranks)) if result.diagnoses else None


@cache
def _plain_first(file_name: str) -> tuple[str, list[int]] | None:
    """The first diagnosis of a corpus log as it was pasted, computed once per session for all six transforms
    (the corpus grew by a third with issue 33's set; this halves what the transforms cost)."""
    from ddpdoctor.explain import explain_text

    return _first(explain_text((CORPUS / file_name).read_bytes(), name=file_name))


def _wrapped(data: bytes, width: int) -> bytes:
    """The log as copied from a terminal ``width`` columns wide: every longer line cut into ``width``-character
    pieces with no separator (what xterm, tmux and VS Code's terminal put on the clipboard for a wrapped line
    copied from the screen without a wrap marker)."""
    out = []
    for line in data.decode("utf-8", errors="surrogateescape").splitlines(keepends=True):
        body = line.rstrip("\r\n")
        end = line[len(body):]
        pieces = [body[i:i + width] for i in range(0, len(body), width)] or [""]
        out.append("\n".join(pieces) + end)
    return "".join(out).encode("utf-8", errors="surrogateescape")


@pytest.mark.parametrize("transform", [
    # Issue 15: rejoining (Scanner._rejoin: pieces after and before the keyword's line, keywords cut by the wrap
    # found by the prefilter's _anchor_trie) keeps every first diagnosis and rank set at both widths.
    pytest.param(lambda b: _wrapped(b, 120), id="terminal-wrapped-120"),
    pytest.param(lambda b: _wrapped(b, 80), id="terminal-wrapped-80"),
    pytest.param(lambda b: _wrapped(b, 100), id="terminal-wrapped-100"),
    pytest.param(lambda b: b.replace(b"\n", b"\r\n"), id="crlf"),
    pytest.param(lambda b: b"".join(b"> " + ln for ln in b.splitlines(keepends=True)), id="quoted"),
    pytest.param(lambda b: b"".join(b"[%d] " % (i + 40) + ln for i, ln in enumerate(b.splitlines(keepends=True))),
                 id="pasted-line-numbers"),
    # Copied from a web page: its HTML source (escaped quotes and angle brackets), or the rendered text (no-break
    # spaces, curly quotes); the second changed the first diagnosis of 136 of 265 logs before lines.from_the_web.
    pytest.param(lambda b: html.escape(b.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"),
                 id="html-escaped"),
    pytest.param(lambda b: b.replace(b" ", "\u00a0".encode()).replace(b"'", "\u2019".encode()), id="web-page-copy"),
])
def test_real_logs_survive_how_they_are_pasted(transform: object, request: pytest.FixtureRequest) -> None:
    """Terminal-wrapped lines, CRLF line ends, e-mail/Markdown quote marks and editor line numbers change no
    diagnosis or rank (the older corpus and issue 33's first set; the reported-only sets with
    DDPDOCTOR_REPORT_PASTED=1, listed, not asserted). A gap the scanner is known to have on one log is recorded next to that log in
    index.json (`known_gaps`: transform id -> what is lost and why); it is not asserted, and the end-of-run
    summary says whether it is still open, so it is neither hidden nor forgotten once fixed."""
    from ddpdoctor.explain import explain_text

    how = request.node.callspec.id
    changed, gaps = [], []
    for entry in INDEX:
        if corpus_set(entry) in REPORTED_ONLY and not REPORT_PASTED:
            continue  # nothing asserted on them: see REPORTED_ONLY
        data = (CORPUS / entry["file"]).read_bytes()
        plain = _plain_first(entry["file"])
        pasted = _first(explain_text(transform(data), name=entry["file"]))  # type: ignore[operator]
        name = entry["file"] if SHOW_HELD_OUT or not held_out(entry["file"]) else "a held-out log"
        if how in entry.get("known_gaps", {}):
            state = "still open" if plain != pasted else "CLOSED: remove it from index.json"
            gaps.append(f"  known gap, {how}, {name}: {state} ({entry['known_gaps'][how]})")
        elif plain != pasted and corpus_set(entry) in REPORTED_ONLY:
            gaps.append(f"  changed, {how}, {name} ({corpus_set(entry)}, reported only): {plain} -> {pasted}")
        elif plain != pasted:
            changed.append(f"{name}: {plain} -> {pasted}")
    if gaps:
        summary = request.config.stash.get(SUMMARY_KEY, "real-log corpus, pasted differently:")
        request.config.stash[SUMMARY_KEY] = "\n".join([summary, *gaps])
        report_summary(request, SUMMARY_TITLE, request.config.stash[SUMMARY_KEY])
    assert not changed, "\n".join(changed)


def test_xid_lines_say_what_each_xid_means_for_the_job() -> None:
    result = _explain(CORPUS / "xid_13_quoted_dmesg.log")
    d = result.diagnoses[0]
    assert d.id == "gpu-xid" and d.details["xid"] == ["13", "109"] and d.details["pci"] == ["PCI:0000:cb:00"]
    assert any(n.startswith("Xid 13:") for n in d.notes) and any(n.startswith("Xid 109:") for n in d.notes)
    ecc = _explain(CORPUS / "xid_94_contained_ecc.log").diagnoses[0]
    assert ecc.notes == [ecc.signature.notes["xid"]["94"]] and "must restart" in ecc.notes[0]
    from ddpdoctor.explain import render_text

    assert "   note: Xid 94: contained uncorrectable ECC error" in render_text(_explain(CORPUS / "xid_94_contained_ecc.log"))


def test_srun_label_names_the_rank() -> None:
    """`srun --label` prefixes each line with the task id ("3: "), which is the rank under SLURM."""
    from ddpdoctor.explain import explain_text

    data = (CORPUS / "ready_twice_checkpoint_focalnet.log").read_bytes()
    labelled = b"".join(b"3: " + ln for ln in data.splitlines(keepends=True))
    d = explain_text(labelled).diagnoses[0]
    assert (d.id, d.ranks) == ("mark-ready-twice", {3})


def test_wrapped_keyword_cut_and_rank_on_an_earlier_piece() -> None:
    """What wrapping broke before (issue 15), on real lines (nccl_timeout_pg_guid.log,
    collective_mismatch_app_logger_rank_prefix.log): the keyword `Timeout(ms)=` on the second piece while the
    message and its `[rank1]:` sit on the first; `Exception (either an error or timeout)` cut inside the keyword
    itself; the app logger's `[RANK 1]` two pieces above the collective mismatch."""
    from ddpdoctor.explain import explain_text

    for name, width, want in (("nccl_timeout_pg_guid.log", 120, ("nccl-timeout", [0, 1, 2])),
                              ("nccl_timeout_pg_guid.log", 97, ("nccl-timeout", [0, 1, 2])),
                              ("collective_mismatch_app_logger_rank_prefix.log", 120, ("collective-mismatch", [1])),
                              ("collective_mismatch_app_logger_rank_prefix.log", 80, ("collective-mismatch", [1]))):
        got = _first(explain_text(_wrapped((CORPUS / name).read_bytes(), width)))
        assert got == want, (name, width, got)
    # Wrapped at every width from 60 columns on: the cut falls inside the keyword or the `[PG ... Rank 1]`
    # (each lost the rank or the diagnosis before). A detail cut by the wrap (`work: 80` / `8,`) stays cut.
    line = ("[rank1]:[E626 06:24:44.906457629 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
            "Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811")
    lost = []
    for width in range(60, len(line)):
        d = explain_text(_wrapped(line.encode() + b"\n", width)).diagnoses
        if [(x.id, x.ranks) for x in d] != [("nccl-timeout", {1})]:
            lost.append(width)
    assert lost == [], lost


def test_wrapping_does_not_borrow_a_rank_from_an_unrelated_line_above() -> None:
    """A long `[rank3]:` line above a shorter line that starts a new log record (a glog time stamp) is not
    its first piece: the port-in-use line has no rank, and an srun label stays the line's rank under srun."""
    from ddpdoctor.explain import explain_text

    text = ("[rank3]: " + "x" * 200 + "\n"
            "[W1122 03:40:12.105000000 socket.cpp:462] [c10d] The server socket has failed to bind to "
            "0.0.0.0:29500 (errno: 98 - Address already in use).\n")
    d = explain_text(text).diagnoses[0]
    assert (d.id, d.ranks) == ("port-in-use", set())
    srun = ("10: " + "y" * 120 + "\n"
            "3: RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.\n")
    d = explain_text(srun).diagnoses[0]
    assert (d.id, d.ranks) == ("unused-parameters", {3})
