"""What ``ddpdoctor explain`` knows about the exception a rank crashed with: its cause and fix, next to the crash.

A crash verdict names the first rank that failed and its exception (``RuntimeError: Distributed package doesn't
have NCCL built in``); the explain knowledge base (``ddpdoctor/explain/kb.json``, every message with its source)
often knows what that message means. The exception line is read as a rank's line of a distributed job (the
verdict comes from one), and only a specific diagnosis is kept: the catch-all for unknown exceptions and the
guesses made from cut tracebacks would only repeat the headline.
"""

from __future__ import annotations

import re
import threading
from typing import Any

# The site watch appends to a rank's error ("... (at train.py:12)"): not part of the message explain knows.
_SITE = re.compile(r" \(at [^()]*:\d+\)$")
# Diagnoses that say no more than "this rank raised": the headline already does.
_SAYS_NOTHING_MORE = frozenset(("python-exception", "traceback-cut", "worker-failed"))


def _specific(text: str, name: str) -> dict[str, Any] | None:
    """The first specific explain diagnosis of ``text`` (``{"id", "title", "remedy", "command", "line"}``), or None.
    Never raises: explain's own bug must not cost the verdict."""
    try:
        from ddpdoctor.explain import explain_text

        result = explain_text(text, name=name)
    except Exception:
        return None
    for diagnosis in result.diagnoses:
        if diagnosis.id not in _SAYS_NOTHING_MORE and not diagnosis.signature.catch_all:
            sig = diagnosis.signature
            line = diagnosis.evidence[0].text.strip() if diagnosis.evidence else ""
            return {"id": sig.id, "title": sig.title, "remedy": sig.remedy, "command": sig.command, "line": line}
    return None


def known_cause(error: str | None, rank: int) -> dict[str, Any] | None:
    """``{"id", "title", "remedy", "command"}`` of the explain diagnosis for rank ``rank``'s ``error`` (``Type:
    message``), or None when explain knows nothing specific about it. Never raises: the verdict must not fail for it."""
    if not error:
        return None
    found = _specific(f"[rank{rank}]: {_SITE.sub('', error)}\n", "rank error")
    if found is not None:
        del found["line"]  # the headline quotes the error already
    return found


def known_cause_in_output(tail: str | None, rank: int) -> dict[str, Any] | None:
    """The explain diagnosis of rank ``rank``'s last output lines, with the line it rests on (``line``), or None
    when they hold nothing specific.

    For a rank killed by a signal there is no exception line to read: gloo aborts a rank whose peer sent a
    buffer of another size (``gloo::EnforceNotMet ... Received data size doesn't match expected size``, then
    SIGABRT) within milliseconds, before its mismatched call reaches the supervisor, and the reason is only in
    what the rank printed. Never raises."""
    if not tail or not tail.strip():
        return None
    found = _specific(tail if tail.endswith("\n") else tail + "\n", f"rank {rank} output")
    return None if found is None else {**found, "source": "output"}


def warm_up() -> None:
    """Build explain's knowledge base and matcher now, in a daemon thread: at a crash under torchrun the launcher
    tears rank 0 down soon after another rank failed, and building them then (a second on a loaded node) came
    before the --json report was written (a CI run found no report). Every piece is cached per process."""
    threading.Thread(target=known_cause, args=("RuntimeError: warm-up", 0), name="ddpdoctor-explain-warm-up",
                     daemon=True).start()
