"""Root cause first, by evidence: the order of the diagnoses, which one explains which, and the probable hang.

A crashed job prints its root cause and then the consequences of it, often more loudly: the watchdog's
timeout and then the SIGABRT it caused, a rank's OOM and then its peers' "connection reset". Sorting by list
order (the knowledge base's, or the log's) puts whichever came first in the file first. Instead:

1. **Consequences are folded under their cause** (``Diagnosis.caused_by``), along the causal links the
   knowledge base declares (:class:`.knowledge.Link`): ``causes`` (nccl-timeout -> worker-killed-by-signal
   when the signal is SIGABRT: the watchdog calls abort; host-oom-killed -> the SIGKILL of the same pid) and
   ``explained_by`` (worker-failed, torchrun's exit code, is explained by the exception that ended the same
   rank; a timeout or "remote process exited" on one rank by a failure on another rank: an echo). A link
   holds only when the evidence does not refute it: the ranks relate as declared (unknown ranks never
   refute "same"), the consequence's details fit (every signal is SIGABRT), shared details agree (the pid),
   the cause is an error (not a warning, unless the link says its source warns what it then fails on:
   c10d's failed name lookups), and no time stamp puts the consequence before its cause.
   Links between named ids are applied before links to a role (an echo), and a link that would close a
   cycle is skipped.
2. **What remains is ordered by evidence**, most decisive first: a failure before a note; an error before a
   diagnosis seen only in warnings (a UserWarning printed on the way is not why the run ended); the
   strongest role in the diagnosis's tree (cause, crash, lagging-rank, symptom); the knowledge base's
   ``precedence`` (a GPU's Xid or a signal explains what the ranks print afterwards, and torchrun's summary
   misnames the first failure when a rank was killed: it has no error file); then which ended first: time
   stamps when every diagnosis compared has one, else the one holding the rank torchrun's summary calls the
   first observed failure, else input order (file, then line), the documented tie-break.
3. Each consequence follows its cause, ordered the same way; notes come last.

Each diagnosis also gets the rank that failed first (``first_rank``, and by what evidence).

A **probable hang** (``probable-hang``, derived: no line matches it) is made from the inputs that end inside
a start-up phase or NCCL's init (:mod:`.phases`) with no error after that point in the same input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from ddpdoctor.explain.frames import RANK_RAISED, SPAWN_RAISED, CutTraceback, lightning_init_line
from ddpdoctor.explain.knowledge import ROLE_ORDER, Link, Signature
from ddpdoctor.explain.model import (
    MAX_EVIDENCE,
    MAX_EVIDENCE_CHARS,
    MAX_RANKS,
    Diagnosis,
    Evidence,
    RankEvent,
)
from ddpdoctor.explain.native import VerbsCrash
from ddpdoctor.explain.phases import PhaseEnd

PROBABLE_HANG = "probable-hang"
BY_TIME = "time stamps"
BY_TORCHRUN = "torchrun's first observed failure"
BY_ORDER = "input order"
BY_ONLY = "only rank"


@dataclass
class Facts:
    """What the scanner saw besides the diagnoses, for the ranking."""

    # Ranks torchrun's failure summary lists under "Root Cause (first observed failure)".
    summary_roots: set[int] = field(default_factory=set)
    # input index -> the last line that was an error (a match not printed as a warning).
    last_fatal_line: dict[int, int] = field(default_factory=dict)
    # Inputs that end inside a phase (see phases.where_input_ends).
    phase_ends: list[PhaseEnd] = field(default_factory=list)
    # rank -> (input name, line number, text) of the last line that showed the rank's own progress, read from
    # the end of each input that held a collective timeout (see hints.last_progress_lines).
    last_progress: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    # Inputs that end in a traceback cut before its exception line, whose last frame names a distributed step.
    cut_tracebacks: list[CutTraceback] = field(default_factory=list)
    # Native backtraces in which NCCL called the InfiniBand verbs libraries and they crashed (see native.py).
    verbs_crashes: list[VerbsCrash] = field(default_factory=list)


def order_diagnoses(found: dict[str, Diagnosis], distributed: bool, facts: Facts | None = None,
                    kb: dict[str, Signature] | None = None) -> list[Diagnosis]:
    """The diagnoses, root cause first, each consequence right after its cause (see the module docstring)."""
    facts = facts or Facts()
    diags = [d for d in found.values() if not any(s in found for s in d.signature.suppressed_by)]
    if len(diags) > 1:
        # torchrun's summary head alone (`<NO_OTHER_FAILURES>`, no exit code) says only that a worker failed: with
        # anything else found (the summary's own exit code, the rank's exception) it adds nothing.
        diags = [d for d in diags if not (d.id == WORKER_FAILED and not d.details)]
    if not distributed:
        # No sign of a distributed job: a known message is still named, worded for one process, or shown as a
        # note when it is that process's own failure (a single-GPU OOM). The catch-all (an exception ddpdoctor
        # has no signature for) is a note naming that exception, and only when nothing else was found: a known
        # message says more about the same failure (a wrapped Lightning message whose first piece it read).
        alone = []
        for d in diags:
            sig = d.signature.for_one_process(d.details)
            if sig is not None:
                d.signature = sig
                alone.append(d)
        specific = [d for d in alone if not d.signature.catch_all]
        diags = specific or alone
    hang = _probable_hang(facts, kb or {})
    if hang is not None:
        diags.append(hang)
    diags.extend(_cut_traceback_guesses(facts, kb or {}, {d.id for d in diags}, distributed))
    crash = _verbs_crash(facts, kb or {}, {d.id for d in diags})
    if crash is not None:
        diags.append(crash)
    for d in diags:
        d.caused_by = None
        d.first_rank, d.first_rank_by = _first_rank(d, facts.summary_roots)
    parent = _fold(diags, facts)
    children: dict[str, list[Diagnosis]] = {}
    for d in diags:
        if d.id in parent:
            d.caused_by = parent[d.id]
            children.setdefault(parent[d.id], []).append(d)
    subtree: dict[str, list[Diagnosis]] = {}

    def collect(d: Diagnosis) -> list[Diagnosis]:
        if d.id not in subtree:
            subtree[d.id] = [d] + [x for c in children.get(d.id, ()) for x in collect(c)]
        return subtree[d.id]

    def place(group: list[Diagnosis]) -> list[Diagnosis]:
        out: list[Diagnosis] = []
        for d in _sorted(group, collect, facts.summary_roots):
            out.append(d)
            out.extend(place(children.get(d.id, [])))
        return out

    return place([d for d in diags if d.caused_by is None])


# -- which rank failed first ---------------------------------------------------------------------------

def _first_rank(d: Diagnosis, roots: set[int]) -> tuple[int | None, str | None]:
    """The rank of ``d`` that failed first and the evidence for it (see the module docstring)."""
    events = {r: e for r, e in d.rank_events.items() if r is not None}
    if not events:
        return None, None
    if len(events) == 1:
        return next(iter(events)), BY_ONLY
    if all(e.time is not None for e in events.values()):
        return min(events, key=lambda r: (events[r].time, events[r].seq)), BY_TIME
    named = sorted(roots & set(events))
    if named:
        return named[0], BY_TORCHRUN
    return min(events, key=lambda r: events[r].seq), BY_ORDER


# -- folding consequences under their causes -------------------------------------------------------------

def _fold(diags: list[Diagnosis], facts: Facts) -> dict[str, str]:
    """consequence id -> cause id, along the KB's links that the evidence does not refute."""
    links: dict[str, list[Link]] = {}
    for d in diags:
        for link in d.signature.links:
            links.setdefault(link.consequence, []).append(link)
    by_id = {d.id: d for d in diags}
    failures = [d for d in diags if not d.signature.is_note]
    # The order candidates are tried in: the same evidence order as the report's, without the fold.
    order = {d.id: i for i, d in enumerate(_sorted(failures, lambda d: [d], facts.summary_roots))}
    parent: dict[str, str] = {}

    def ancestors(d_id: str) -> Iterable[str]:
        while d_id in parent:
            d_id = parent[d_id]
            yield d_id

    for named in (True, False):  # id-to-id links first, then links to a role (echoes)
        for d in sorted(failures, key=lambda x: order[x.id]):
            if d.id in parent:
                continue
            candidates = []
            for link in links.get(d.id, ()):
                if (link.cause is not None) != named:
                    continue
                pool = [by_id[link.cause]] if link.cause in by_id else [] if named else failures
                for c in pool:
                    if c is d or c.signature.is_note or d.id in ancestors(c.id):
                        continue
                    if not named and c.signature.role not in link.cause_roles:
                        continue
                    if _holds(link, c, d):
                        candidates.append(c)
            if candidates:
                parent[d.id] = min(candidates, key=lambda c: order[c.id]).id
    return parent


def _holds(link: Link, cause: Diagnosis, consequence: Diagnosis) -> bool:
    """Whether the evidence allows ``cause`` -> ``consequence`` along ``link``."""
    if not cause.fatal and not link.cause_warns:
        return False  # a warning printed on the way ended nothing (unless its source warns what it fails on)
    for name, values in link.when:
        seen = consequence.details.get(name, [])
        if not seen or any(v not in values for v in seen):
            return False  # e.g. one of the signals is not SIGABRT: not all of it is the watchdog's doing
    for name in link.match:
        a, b = cause.details.get(name), consequence.details.get(name)
        if a and b and not set(a) & set(b):
            return False
    if link.rank == "same" and cause.ranks and consequence.ranks and not cause.ranks & consequence.ranks:
        return False
    if link.rank == "other" and not (cause.ranks and consequence.ranks and consequence.ranks - cause.ranks):
        return False
    t_cause, t_cons = cause.first_time, consequence.first_time
    return t_cause is None or t_cons is None or t_cause <= t_cons


# -- ordering --------------------------------------------------------------------------------------------

_ROLE_INDEX = {role: i for i, role in enumerate(ROLE_ORDER)}


def _sorted(group: list[Diagnosis], tree: Callable[[Diagnosis], list[Diagnosis]],
            roots: set[int]) -> list[Diagnosis]:
    """``group`` ordered by strength, then by which ended first (see the module docstring)."""

    def strength(d: Diagnosis) -> tuple[bool, bool, int, int]:
        members = tree(d)
        role = min(_ROLE_INDEX[m.signature.role] for m in members)
        return (d.signature.is_note, not any(m.fatal for m in members), role, -d.signature.precedence)

    def time(d: Diagnosis) -> tuple[int, ...] | None:
        times = [m.first_time for m in tree(d) if m.first_time is not None]
        return min(times) if times else None

    def seq(d: Diagnosis) -> tuple[int, int]:
        return min(m.first_seq for m in tree(d))

    def holds_root(d: Diagnosis) -> bool:
        return any(m.ranks & roots for m in tree(d))

    buckets: dict[tuple[bool, bool, int, int], list[Diagnosis]] = {}
    for d in group:
        buckets.setdefault(strength(d), []).append(d)
    out: list[Diagnosis] = []
    for key in sorted(buckets):
        bucket = buckets[key]
        # Time stamps order lines across files (rank0.log vs rank1.log), but only when every diagnosis
        # compared has one: a line without one cannot be placed between two that have.
        times = [time(d) for d in bucket]
        if all(t is not None for t in times):
            bucket.sort(key=lambda d: (time(d), seq(d)))
        else:
            bucket.sort(key=lambda d: (not holds_root(d), seq(d)))
        out.extend(bucket)
    return out


# -- the probable hang -----------------------------------------------------------------------------------

def _probable_hang(facts: Facts, kb: dict[str, Signature]) -> Diagnosis | None:
    """One ``probable-hang`` diagnosis for the inputs that end inside a phase with no error after it."""
    sig = kb.get(PROBABLE_HANG)
    ends = [e for e in facts.phase_ends if facts.last_fatal_line.get(e.file_index, 0) < e.line]
    if sig is None or not ends:
        return None
    d = Diagnosis(sig, fatal=True)  # a hang is how the run ended, as much as an error is
    d.first_seq = min((e.file_index, e.markers[0].line) for e in ends)
    for end in ends:
        for name, values in end.details().items():
            seen = d.details.setdefault(name, [])
            seen.extend(v for v in values if v not in seen)
        for m in end.markers:
            d.count += 1
            if m.rank is not None and len(d.ranks) < MAX_RANKS:
                d.ranks.add(m.rank)
            if m.time is not None and (d.first_time is None or m.time < d.first_time):
                d.first_time = m.time
            d.rank_events.setdefault(m.rank, RankEvent((end.file_index, m.line), m.time))
        room = MAX_EVIDENCE - len(d.evidence)
        if room > 0:
            d.evidence.extend(Evidence(end.file, m.line, m.text.strip()[:MAX_EVIDENCE_CHARS])
                              for m in end.evidence[-room:])
    return d


# -- a traceback cut before its message ------------------------------------------------------------------

TRACEBACK_CUT = "traceback-cut"
WORKER_FAILED = "worker-failed"
NCCL_NOT_AVAILABLE = "nccl-not-available"
PYTHON_EXCEPTION = "python-exception"


def _cut_traceback_guesses(facts: Facts, kb: dict[str, Signature], present: set[str],
                           distributed: bool) -> list[Diagnosis]:
    """What the cut tracebacks' last frames say (see frames.py), worded as the guesses they are: one
    ``traceback-cut`` for the steps the frames name, or ``worker-failed`` when the frame is torchrun raising
    ChildFailedError (the summary that would name the rank was cut) and no real summary line was found."""
    out: dict[str, Diagnosis] = {}
    for cut in facts.cut_tracebacks:
        if cut.stage == "init" and cut.platform and cut.names_nccl and NCCL_NOT_AVAILABLE in kb:
            if NCCL_NOT_AVAILABLE in present:
                continue
            where = "Windows" if cut.platform == "windows" else "macOS"
            cut_where = ("right after Lightning's 'initializing' line, in its init_process_group"
                         if lightning_init_line(cut.reported) else "in init_process_group")
            sig = replace(kb[NCCL_NOT_AVAILABLE], title=f"Probably no NCCL in this PyTorch: the job asks for the nccl "
                          f"backend on {where} (its paths), and the traceback is cut {cut_where} (a guess "
                          "from the frames, not from an error message)")
        elif cut.stage == SPAWN_RAISED:
            if PYTHON_EXCEPTION in present or PYTHON_EXCEPTION not in kb:
                continue
            sig = replace(kb[PYTHON_EXCEPTION], title=f"Process {cut.rank} of mp.spawn raised a Python exception "
                          "(torch.multiprocessing.spawn says so); the paste stops inside its traceback, before the "
                          "exception line that would say which",
                          remedy=f"Paste or read the rest of process {cut.rank}'s traceback: its last line names the "
                          "exception (often the same on every process); fix that error first, the other processes' "
                          "failures follow from it")
        elif cut.stage == RANK_RAISED:
            # Only in a job the log shows to be distributed, and only when nothing else was found (torchrun's
            # failure summary already says a worker failed, and says more): a single process's cut traceback is its
            # own affair.
            if not distributed or PYTHON_EXCEPTION not in kb or present or len(facts.cut_tracebacks) > 1:
                continue
            who = f"Rank {cut.rank}" if cut.rank is not None else "A rank"
            where = cut.call if cut.call.isidentifier() else "its own code"
            sig = replace(kb[PYTHON_EXCEPTION], title=f"{who} raised an exception in {where} (its traceback is cut "
                          "before the exception line that would say which; a guess from the frames)",
                          remedy="Paste or read the rest of that rank's traceback (its own log or the lines prefixed "
                          "with its rank): the last line names the exception; fix that error first, the other ranks' "
                          "failures and torchrun's summary follow from it")
        elif cut.stage == WORKER_FAILED:
            if WORKER_FAILED in present or WORKER_FAILED not in kb:
                continue
            sig = replace(kb[WORKER_FAILED], title="A worker failed: torchrun raised ChildFailedError, and the "
                          "traceback was cut before its failure summary (which rank, its exit code) (a guess from "
                          "the frame)")
        elif TRACEBACK_CUT in kb and TRACEBACK_CUT not in present:
            call = cut.call if cut.call.isidentifier() else cut.stage
            sig = replace(kb[TRACEBACK_CUT], title=f"A traceback cut before its message; its last frame is in {call} "
                          "(a guess from the frame, not from an error message)")
        else:
            continue
        d = out.get(sig.id)
        if d is None:
            d = out[sig.id] = Diagnosis(sig, fatal=True)
            d.first_seq = (cut.file_index, cut.line)
        d.count += 1
        if cut.rank is not None and len(d.ranks) < MAX_RANKS:
            d.ranks.add(cut.rank)
        d.rank_events.setdefault(cut.rank, RankEvent((cut.file_index, cut.line), None))
        if sig.id == TRACEBACK_CUT:
            stages = d.details.setdefault("stage", [])
            if cut.stage not in stages:
                stages.append(cut.stage)
        _quote(d, cut.file, ((cut.reported, cut.reported_line), (cut.frame, cut.line), (cut.code, cut.code_line)))
    return list(out.values())


def _quote(d: Diagnosis, file: str, lines: Iterable[tuple[str, int]]) -> None:
    """The (text, line number) pairs of a derived diagnosis (a cut traceback, a native crash) as its evidence; an
    empty text is a line the paste did not have."""
    for text, line in lines:
        if text and len(d.evidence) < MAX_EVIDENCE:
            d.evidence.append(Evidence(file, line, text[:MAX_EVIDENCE_CHARS]))


# -- a native crash in the verbs libraries, called by NCCL ---------------------------------------------------

NCCL_IB_ERROR = "nccl-ib-error"


def _verbs_crash(facts: Facts, kb: dict[str, Signature], present: set[str]) -> Diagnosis | None:
    """One ``nccl-ib-error`` for the native backtraces that show NCCL calling the verbs libraries and those
    crashing (see native.py), quoting the signal's line, the verbs frame and NCCL's frame; none when an NCCL IB
    error line was found already (it says more)."""
    if not facts.verbs_crashes or NCCL_IB_ERROR not in kb or NCCL_IB_ERROR in present:
        return None
    first = facts.verbs_crashes[0]
    died = f"crashed ({first.signal_name})" if first.signal_name else "crashed"
    sig = replace(kb[NCCL_IB_ERROR],
                  title=f"A process {died} inside the InfiniBand verbs library ({first.verbs_call}), called by NCCL "
                        f"({first.nccl_lib}): NCCL's IB transport crashed on this machine's RDMA stack",
                  cause="The native backtrace runs from NCCL into the verbs libraries (libibverbs or its provider) "
                        "and ends there: NCCL loads the host's libibverbs and calls it to list and open the "
                        "InfiniBand/RoCE devices when it creates a communicator, and that call crashed. No NCCL error "
                        "is printed for it. It comes from the machine, not the training code: a container's "
                        "rdma-core that does not match the host's driver (MOFED/OFED), two copies of libibverbs on "
                        "the library path (HPC-X's or MPI's beside the system's), a provider library (libmlx5) "
                        "missing, or /dev/infiniband passed into a container without its libraries.",
                  remedy="Run once with NCCL_IB_DISABLE=1: if the job then starts (over TCP sockets), the verbs stack "
                         "is at fault. Check `ibv_devinfo` in the same environment (container) the job runs in, "
                         "`ldd` of libnccl / `ldconfig -p | grep ibverbs` for two libibverbs, and make the "
                         "container's rdma-core match the host's driver (or mount the host's libraries).")
    d = Diagnosis(sig, fatal=True)
    d.first_seq = (first.file_index, first.signal_line or first.verbs_line)
    for crash in facts.verbs_crashes:
        d.count += 1
        if crash.rank is not None and len(d.ranks) < MAX_RANKS:
            d.ranks.add(crash.rank)
        d.rank_events.setdefault(crash.rank, RankEvent((crash.file_index, crash.signal_line or crash.verbs_line),
                                                       None))
        _quote(d, crash.file, ((crash.signal, crash.signal_line), (crash.verbs_frame, crash.verbs_line),
                               (crash.nccl_frame, crash.nccl_line)))
    return d
